package model_test

import (
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/synth"
)

// Small models of the shapes the no-allocation and decode checks need: a
// K-quant dense model (rows of 256), a MoE, an F16 qwen2 (biases, NeoX
// rope).
var (
	denseQ4K = synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 2, NHead: 8, NHeadKV: 4, NFF: 512, Type: "q4_k_m", Seed: 41, Std: 0.08}
	moeQ40   = synth.Spec{Arch: "moe", NEmbd: 128, NLayer: 2, NHead: 8, NHeadKV: 4, NFF: 128, NExpert: 4, NExpertUsed: 2, Type: "q4_0", Seed: 43, Std: 0.08}
	qwenF16  = synth.Spec{Arch: "qwen2", NEmbd: 128, NLayer: 2, NHead: 4, NHeadKV: 2, NFF: 256, Type: "f16", Seed: 47, Std: 0.08}
)

// TestDecodeNoAlloc checks that a decode step allocates nothing once the
// runner's buffers have grown (dense and MoE models).
func TestDecodeNoAlloc(t *testing.T) {
	if model.RaceEnabled {
		t.Skip("the race detector makes sync.Pool drop items, which allocates")
	}
	for name, spec := range map[string]synth.Spec{"dense-q4_k_m": denseQ4K, "moe-q4_0": moeQ40} {
		t.Run(name, func(t *testing.T) {
			m := enginetest.Open(t, spec)
			r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 256})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if _, err := r.Prompt(1, []int32{1, 2, 3, 4}, nil); err != nil {
				t.Fatal(err)
			}
			tok := int32(5)
			if _, err := r.Decode(1, tok); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(50, func() {
				tok++
				if _, err := r.Decode(1, tok); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("decode step allocates %v times", allocs)
			}
		})
	}
}

// TestDecodeMatchesPrompt checks that prefill then token-by-token decode
// gives the logits of evaluating the whole sequence as one prompt. Batched
// and single-row matrix kernels may sum in a different order, and on this F16
// model an upstream difference in the last float bit can flip the F16
// rounding of an activation (one F16 ulp is ~5e-4 relative), so the bound is
// 1e-2, still far below any real difference (a wrong position or cache slot
// moves logits by ~1).
func TestDecodeMatchesPrompt(t *testing.T) {
	m := enginetest.Open(t, qwenF16)
	toks := enginetest.Tokens(8, m.NVocab, 1)
	r, _ := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 64})
	defer r.Close()
	whole, err := r.Prompt(1, toks, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Prompt(2, toks[:3], nil); err != nil {
		t.Fatal(err)
	}
	V := m.NVocab
	for i := 3; i < len(toks); i++ {
		l, err := r.Decode(2, toks[i])
		if err != nil {
			t.Fatal(err)
		}
		for j := range l {
			if d := l[j] - whole[i*V+j]; d > 1e-2 || d < -1e-2 {
				t.Fatalf("position %d logit %d: decode %v, prompt %v", i, j, l[j], whole[i*V+j])
			}
		}
	}
}
