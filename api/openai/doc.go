// Package openai serves shoal's OpenAI-compatible HTTP endpoint:
// /v1/chat/completions, /v1/completions (both with SSE streaming) and
// /v1/models. It turns chat messages into a prompt through the model's own
// Jinja chat template (gonja), maps request parameters to the sampler,
// applies stop strings to the detokenized stream, and answers errors in the
// OpenAI shape. Generation runs on a Submitter (the local
// serve.Scheduler, or one the node provides for a model served elsewhere);
// the node supplies models through the Backend interface and API-key
// checks, metrics and logging through Options.
package openai
