package model_test

import (
	"math"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/synth"
)

// TestEmbedPooledLast checks a decoder embedding (Qwen3-Embedding style:
// the last token's hidden state after the output norm, L2-normalized)
// against the float64 reference: output·embedding must point where the
// reference's logits of the last token point.
func TestEmbedPooledLast(t *testing.T) {
	spec := synth.Spec{Arch: "qwen3", NLayer: 2, NEmbd: 64, NHead: 8, NHeadKV: 2, HeadDim: 16, NFF: 128, Type: "f32", Std: 0.08, Seed: 31,
		Tokenizer: enginetest.Vocab(t)}
	raw := refGGUF(t, spec, map[string]any{"qwen3.pooling_type": uint32(3)}, nil)
	f, err := gguf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, ok := model.DecoderPooling(f)
	if !ok || p != model.PoolLast {
		t.Fatalf("DecoderPooling = %v, %v", p, ok)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ref := refLoad(t, f)
	for i, n := range []int{1, 5, 17} {
		toks := refTokens(n, m.NVocab, uint64(40+i))
		e, err := r.EmbedPooled(3, toks, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Cache().Len(3) != 0 {
			t.Fatal("sequence not freed")
		}
		logits := ref.forward(toks, refVariant{f16: true})
		ev := make([]float64, len(e))
		for j, v := range e {
			ev[j] = float64(v)
		}
		proj := refMatVec(ref.output, ev)
		var a, b, ab float64
		for j, v := range logits[n-1] {
			a += v * v
			b += proj[j] * proj[j]
			ab += v * proj[j]
		}
		cs := ab / math.Sqrt(a*b)
		t.Logf("%d tokens: cosine similarity of output·embedding with the reference logits %.9f", n, cs)
		if cs < 0.9999 {
			t.Errorf("%d tokens: cosine %.6f < 0.9999", n, cs)
		}
	}
	if _, err := r.EmbedPooled(3, nil, p); err == nil {
		t.Error("no tokens: no error")
	}
	if _, err := r.EmbedPooled(3, []int32{1}, model.PoolRank); err == nil {
		t.Error("rank pooling: no error")
	}
	// A generative model has no pooling.
	plain, _ := gguf.Parse(refGGUF(t, spec, nil, nil))
	defer plain.Close()
	if _, ok := model.DecoderPooling(plain); ok {
		t.Error("DecoderPooling of a model without pooling_type: ok")
	}
}
