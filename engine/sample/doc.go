// Package sample picks the next token from logits: greedy, temperature,
// top-k, top-p, min-p, and repetition/presence/frequency penalties, seeded
// and reproducible.
//
// The filters run in the order of llama.cpp's common sampler chain:
//
//	penalties → top-k → top-p → min-p → temperature → softmax → draw
//
// Penalties are applied to a private copy of the logits; the caller's slice
// is never modified. Top-p and min-p look at probabilities at temperature 1
// (as in llama.cpp, temperature is applied after them). The draw uses a
// PCG generator from math/rand/v2 seeded by Params.Seed, so the same Params,
// seed and inputs always produce the same tokens.
//
// A Sampler reuses its buffers: after the first call, Sample does not
// allocate. A Sampler is not safe for concurrent use.
package sample
