package model

import (
	"path/filepath"
	"testing"
)

// TestDecodeNoAlloc checks that a decode step allocates nothing once the
// runner's buffers have grown (dense and MoE models).
func TestDecodeNoAlloc(t *testing.T) {
	if RaceEnabled {
		t.Skip("the race detector makes sync.Pool drop items, which allocates")
	}
	for _, name := range []string{"llama-q4_k_m", "moe-q4_0"} {
		t.Run(name, func(t *testing.T) {
			m, err := Open(filepath.Join(oracleDir, name, "model.gguf"))
			if err != nil {
				t.Skipf("oracle model absent: %v", err)
			}
			defer m.Close()
			r, err := NewRunner(m, Options{Threads: 2, CacheTokens: 256})
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
	m, err := Open(filepath.Join(oracleDir, "qwen2-f16", "model.gguf"))
	if err != nil {
		t.Skipf("oracle model absent: %v", err)
	}
	defer m.Close()
	toks := []int32{15496, 995, 0, 825, 12900, 7, 77, 2599}
	r, _ := NewRunner(m, Options{Threads: 2, CacheTokens: 64})
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
