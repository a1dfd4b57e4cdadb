// Package serve owns the per-model scheduler: continuous (iteration-level)
// batching of many sequences over one model Engine: a local runner and its
// paged KV cache, or a session of a model distributed over several nodes.
// New sequences join the running batch at the next step; long prompts are
// prefilled in chunks so decoding never stalls behind them; when KV blocks
// run out the newest sequence is preempted and recomputed later; a bounded
// queue refuses work it cannot hold. The HTTP layer (api) turns requests into
// token sequences and streams the events this package emits.
package serve
