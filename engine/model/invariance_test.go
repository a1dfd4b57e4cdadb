package model_test

import (
	"fmt"
	"math"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/kernels"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/synth"
)

// The batch invariance of the logits: a sequence's logits at a position are
// bitwise the same whether the position is computed alone (a decode step of
// one token), in one prefill of the whole prefix, in a chunk of a chunked
// prefill, or in a batch with other sequences' decode tokens and prefill
// chunks, and when the sequence is replayed on a fresh runner (a migrated
// generation: prompt plus the tokens so far as one prefill, then decode).

const invLen = 24 // positions of the sequence under test

// invPath computes the logits of positions [0,invLen) of tokens on a fresh
// runner, one NVocab row per position.
type invPath struct {
	name string
	run  func(t *testing.T, r *model.Runner, toks []int32) [][]float32
}

// stepRows runs one batch and copies the logits of rows.
func stepRows(t *testing.T, r *model.Runner, b *model.Batch, rows []int) [][]float32 {
	t.Helper()
	l, err := r.Step(b, rows)
	if err != nil {
		t.Fatal(err)
	}
	V := r.Model().NVocab
	out := make([][]float32, len(rows))
	for i := range rows {
		out[i] = append([]float32(nil), l[i*V:(i+1)*V]...)
	}
	return out
}

// chunked prefills toks in chunks of the given sizes (cycled), alone.
func chunked(sizes ...int) func(t *testing.T, r *model.Runner, toks []int32) [][]float32 {
	return func(t *testing.T, r *model.Runner, toks []int32) [][]float32 {
		var out [][]float32
		for p, k := 0, 0; p < len(toks); k++ {
			n := min(sizes[k%len(sizes)], len(toks)-p)
			rows := make([]int, n)
			for i := range rows {
				rows[i] = i
			}
			b := &model.Batch{Tokens: toks[p : p+n], Chunks: []model.Chunk{{Seq: 1, N: n}}}
			out = append(out, stepRows(t, r, b, rows)...)
			p += n
		}
		return out
	}
}

// batched runs the sequence with `others` other sequences sharing every
// batch: the sequence prefills its first `prompt` tokens and decodes the
// rest one token a step; the other sequences alternate between prefill
// chunks of 2-5 tokens and single decode tokens, and the sequence's rows
// sit at position `at` among them (clamped to the batch).
func batched(prompt, others, at int) func(t *testing.T, r *model.Runner, toks []int32) [][]float32 {
	return func(t *testing.T, r *model.Runner, toks []int32) [][]float32 {
		V := r.Model().NVocab
		other := enginetest.Tokens(4096, V, uint64(100+others))
		oi := 0
		var out [][]float32
		for p, step := 0, 0; p < len(toks); step++ {
			n := 1
			if p == 0 {
				n = prompt
			}
			var b model.Batch
			var rows []int
			add := func(seq kv.SeqID, tk []int32) {
				b.Chunks = append(b.Chunks, model.Chunk{Seq: seq, N: len(tk)})
				b.Tokens = append(b.Tokens, tk...)
			}
			mine := func() {
				for i := 0; i < n; i++ {
					rows = append(rows, len(b.Tokens)+i)
				}
				add(1, toks[p:p+n])
			}
			for o := 0; o < others; o++ {
				if o == at {
					mine()
				}
				k := 1
				if (o+step)%3 == 0 {
					k = 2 + (o+step)%4
				}
				add(kv.SeqID(10+o), other[oi:oi+k])
				oi += k
			}
			if at >= others {
				mine()
			}
			out = append(out, stepRows(t, r, &b, rows)...)
			p += n
		}
		return out
	}
}

func invPaths() []invPath {
	ps := []invPath{
		{"prefill-whole", chunked(invLen)},
		{"prefill5-decode", chunked(5, 1)},
		{"chunked-2", chunked(2)},
		{"chunked-3-7", chunked(3, 7)},
		{"chunked-16", chunked(16)},
		{"chunked-9-1-4", chunked(9, 1, 4)},
	}
	// batches of 2 to 16 sequences, the sequence first, among or last
	for _, o := range []int{1, 3, 7, 11, 15} {
		for _, at := range uniq(0, o/2, o) {
			ps = append(ps, invPath{fmt.Sprintf("batch%d-at%d", o+1, at), batched(1, o, at)})
		}
	}
	ps = append(ps, invPath{"batch8-prompt6", batched(6, 7, 3)})
	// a migrated generation: the prefix replayed as one prefill on a fresh
	// runner, then decode (the fresh runner is every path's)
	ps = append(ps, invPath{"replay-12-decode", chunked(12, 1)})
	// replayed on the same runner: decoded, dropped, then prefilled again
	ps = append(ps, invPath{"decode-free-replay-17", func(t *testing.T, r *model.Runner, toks []int32) [][]float32 {
		chunked(1)(t, r, toks[:20])
		r.Cache().Free(1)
		return chunked(17, 1)(t, r, toks)
	}})
	return ps
}

// invTypes are the weight types of the test.
var invTypes = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_k", "q6_k"}

// TestBatchInvariance computes a sequence's logits by each path of
// invPaths and compares them bitwise with those of decode steps of one
// token. With batch-invariant products (kernels.SetBatchInvariant) every
// path must match; without, the differences are logged (the prefill tiles
// and panels sum a row in another order than the decode kernels).
func TestBatchInvariance(t *testing.T) {
	defer kernels.SetBatchInvariant(kernels.BatchInvariant())
	types, threadsList := invTypes, []int{1, 2}
	switch {
	case model.RaceEnabled || kernels.Path() == "generic":
		// The race run is there for the threads' sharing of a step, and
		// the generic kernels run many times slower than a machine's:
		// one type on two threads (all of them take over ten minutes).
		types, threadsList = []string{"q4_0"}, []int{2}
	case testing.Short():
		types, threadsList = []string{"f16", "q8_0", "q4_0", "q4_k"}, []int{2}
	}
	for _, typ := range types {
		spec := synth.Spec{Arch: "llama", NEmbd: 512, NLayer: 2, NHead: 8, NHeadKV: 4, NFF: 1024,
			Type: typ, OutputType: typ, Seed: 77, Std: 0.08}
		m := enginetest.Open(t, spec)
		toks := enginetest.Tokens(invLen, m.NVocab, 9)
		for _, threads := range threadsList {
			for _, inv := range []bool{false, true} {
				if !inv && !testing.Verbose() {
					continue // the measurement of the default products: with -v
				}
				t.Run(fmt.Sprintf("%s/threads=%d/invariant=%v", typ, threads, inv), func(t *testing.T) {
					kernels.SetBatchInvariant(inv)
					run := func(f func(*testing.T, *model.Runner, []int32) [][]float32) [][]float32 {
						r, err := model.NewRunner(m, model.Options{Threads: threads, CacheTokens: 2048})
						if err != nil {
							t.Fatal(err)
						}
						defer r.Close()
						return f(t, r, toks)
					}
					// the reference: every position alone, a decode step of one
					want := run(chunked(1))
					worst, differ := 0.0, 0
					for _, p := range invPaths() {
						got := run(p.run)
						d, at := maxDiff(want, got)
						if at < 0 {
							continue
						}
						differ++
						worst = max(worst, d)
						msg := fmt.Sprintf("%s: max |diff| %.3g (first at position %d)", p.name, d, at)
						if inv {
							t.Error(msg)
						} else {
							t.Log(msg)
						}
					}
					t.Logf("%d of %d paths differ, max |diff| %.3g", differ, len(invPaths()), worst)
				})
			}
		}
	}
}

// maxDiff is the largest |a-b| over the logits and the first position whose
// logits are not bitwise equal (-1 if none).
func maxDiff(a, b [][]float32) (float64, int) {
	d, first := 0.0, -1
	for p := range a {
		for i := range a[p] {
			if math.Float32bits(a[p][i]) != math.Float32bits(b[p][i]) {
				if first < 0 {
					first = p
				}
				d = max(d, math.Abs(float64(a[p][i])-float64(b[p][i])))
			}
		}
	}
	return d, first
}

func uniq(xs ...int) []int {
	var out []int
	for _, x := range xs {
		if len(out) == 0 || out[len(out)-1] != x {
			out = append(out, x)
		}
	}
	return out
}
