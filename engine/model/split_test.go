package model_test

import (
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/model"
)

// TestLayerSplit runs layers [0,k) then [k,n) — on one runner and on two
// runners that each hold only their range, as pipeline stages do — and
// checks the logits equal those of [0,n) exactly, for prefill and for decode
// steps after it.
func TestLayerSplit(t *testing.T) {
	spec := denseQ4K
	spec.NLayer = 4
	m := enginetest.Open(t, spec)
	toks := enginetest.Tokens(10, m.NVocab, 2)
	prompt, decode := toks[:7], toks[7:]

	whole, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	want := runSteps(t, m, prompt, decode, func(b *model.Batch, x []float32) {
		if err := whole.Reserve(b); err != nil {
			t.Fatal(err)
		}
		if err := whole.Forward(b, 0, m.NLayer, x); err != nil {
			t.Fatal(err)
		}
	}, whole)

	for k := 1; k < m.NLayer; k++ {
		one, _ := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 64})
		got := runSteps(t, m, prompt, decode, func(b *model.Batch, x []float32) {
			if err := one.Reserve(b); err != nil {
				t.Fatal(err)
			}
			if err := one.Forward(b, 0, k, x); err != nil {
				t.Fatal(err)
			}
			if err := one.Forward(b, k, m.NLayer, x); err != nil {
				t.Fatal(err)
			}
		}, one)
		one.Close()
		assertEqual(t, "same runner", k, want, got)

		a, _ := model.NewRunner(m, model.Options{Threads: 1, Lo: 0, Hi: k, CacheTokens: 64})
		b, _ := model.NewRunner(m, model.Options{Threads: 2, Lo: k, Hi: m.NLayer, CacheTokens: 64})
		if err := a.Forward(&model.Batch{}, k, m.NLayer, nil); err == nil {
			t.Fatal("runner for [0,k) accepted layers past k")
		}
		got = runSteps(t, m, prompt, decode, func(bt *model.Batch, x []float32) {
			bb := *bt
			bb.Chunks = append([]model.Chunk(nil), bt.Chunks...)
			if err := a.Reserve(bt); err != nil {
				t.Fatal(err)
			}
			if err := b.Reserve(&bb); err != nil {
				t.Fatal(err)
			}
			if err := a.Forward(bt, 0, k, x); err != nil {
				t.Fatal(err)
			}
			if err := b.Forward(&bb, k, m.NLayer, x); err != nil {
				t.Fatal(err)
			}
		}, b)
		a.Close()
		b.Close()
		assertEqual(t, "two stages", k, want, got)
	}
}

// runSteps prefills prompt then decodes the tokens one by one through fwd,
// returning the last-row logits of every step.
func runSteps(t *testing.T, m *model.Model, prompt, decode []int32, fwd func(*model.Batch, []float32), head *model.Runner) [][]float32 {
	var out [][]float32
	step := func(toks []int32) {
		b := &model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: 3, N: len(toks)}}}
		x := make([]float32, len(toks)*m.NEmbd)
		if err := head.Embed(toks, x); err != nil {
			t.Fatal(err)
		}
		fwd(b, x)
		l := make([]float32, m.NVocab)
		if err := head.Logits(x, []int{len(toks) - 1}, l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	step(prompt)
	for _, tok := range decode {
		step([]int32{tok})
	}
	return out
}

func assertEqual(t *testing.T, what string, k int, want, got [][]float32) {
	t.Helper()
	for s := range want {
		for i := range want[s] {
			if want[s][i] != got[s][i] {
				t.Fatalf("%s, split at %d: step %d logit %d = %v, want %v", what, k, s, i, got[s][i], want[s][i])
			}
		}
	}
}
