// Package loadgen measures an OpenAI-compatible endpoint under load: for
// each concurrency level it keeps that many streaming requests (chat or
// completions, Server-Sent Events) in flight with a fixed prompt and
// max_tokens, bounded by a request count and/or a duration, and reports the
// aggregate generated tokens per second, time to first token and
// inter-token latency percentiles, and errors. It works against shoal's
// agents and any other server that speaks the same API (vLLM, llama.cpp).
package loadgen
