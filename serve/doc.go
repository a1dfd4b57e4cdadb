// Package serve owns the per-model scheduler: continuous (iteration-level)
// batching of many sequences over one model runner and its paged KV cache.
// New sequences join the running batch at the next step; long prompts are
// prefilled in chunks so decoding never stalls behind them; when KV blocks
// run out the newest sequence is preempted and recomputed later; a bounded
// queue refuses work it cannot hold. The HTTP layer (api) turns requests into
// token sequences and streams the events this package emits.
package serve
