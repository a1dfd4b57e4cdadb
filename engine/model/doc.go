// Package model owns the transformer architectures shoal runs (the llama
// family, qwen2, qwen2moe, qwen3, qwen3moe) and their execution by layer
// range: embed tokens, run layers [lo,hi) on a batch of sequence chunks with
// hidden states in and out, and produce logits after the last layer.
// Whole-model generation is the case [0,n). Tensor-parallel all-reduce
// reaches the model as an injected interface, a no-op on one node. It also
// runs BERT-style embedding encoders (bert) whole on one node: Encoder
// embeds a token sequence into one pooled, L2-normalized vector.
package model
