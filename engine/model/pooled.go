package model

import (
	"fmt"

	"shoal/engine/device/cpu"
	"shoal/engine/gguf"
	"shoal/engine/kv"
)

// DecoderPooling reads the pooling a decoder model's GGUF asks for when it
// is an embedding model (%s.pooling_type, e.g. "last" for Qwen3-Embedding);
// ok is false when the key is absent or says none (a generative model).
func DecoderPooling(f *gguf.File) (p Pooling, ok bool) {
	name, _ := f.String("general.architecture")
	v, found := f.Int(name + ".pooling_type")
	if !found || v == int64(PoolNone) {
		return PoolNone, false
	}
	return Pooling(v), true
}

// EmbedPooled runs tokens as sequence seq, which must be empty, through the
// whole model and returns the hidden states after the output norm (what
// llama.cpp pools, its t_embd) pooled as p says (mean, cls = first token,
// last) and L2-normalized. The sequence is freed afterwards. The runner
// must hold the whole model and must not be used concurrently (a runner
// driven by a scheduler is not available for this).
func (r *Runner) EmbedPooled(seq kv.SeqID, tokens []int32, p Pooling) ([]float32, error) {
	switch p {
	case PoolMean, PoolCLS, PoolLast:
	default:
		return nil, fmt.Errorf("pooling %s is not supported (mean, cls and last are)", p)
	}
	if r.lo != 0 || r.hi != r.m.NLayer {
		return nil, fmt.Errorf("runner holds layers [%d,%d), embedding needs the whole model", r.lo, r.hi)
	}
	if r.m.W.TokEmbd == nil || r.m.W.OutputNorm == nil {
		return nil, fmt.Errorf("embedding needs the token embedding and the output norm, the weights lack some")
	}
	n := len(tokens)
	if n == 0 {
		return nil, fmt.Errorf("no tokens to embed")
	}
	if l := r.cache.Len(seq); l != 0 {
		return nil, fmt.Errorf("sequence %d is not empty (%d tokens)", seq, l)
	}
	r.dev.Hold()
	defer r.dev.Release()
	E := r.m.NEmbd
	x := make([]float32, n*E)
	if err := r.Embed(tokens, x); err != nil {
		return nil, err
	}
	b := Batch{Tokens: tokens, Chunks: []Chunk{{Seq: seq, N: n}}}
	if err := r.Reserve(&b); err != nil {
		return nil, err
	}
	defer r.cache.Free(seq)
	if err := r.Forward(&b, 0, r.m.NLayer, x); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		cpu.RMSNorm(x[i*E:(i+1)*E], x[i*E:(i+1)*E], r.m.W.OutputNorm, r.m.RMSEps)
	}
	out := make([]float32, E)
	poolNormalize(x, n, p, out)
	return out, nil
}
