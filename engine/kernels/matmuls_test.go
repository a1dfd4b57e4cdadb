package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// fusedSets are weight types that share an activation format, as a layer's
// q, k, v (or gate, up) matrices of one file do.
var fusedSets = [][]quant.Type{
	{quant.Q4_0, quant.Q8_0, quant.Q5_0},
	{quant.Q4_K, quant.Q4_K, quant.Q6_K},
	{quant.Q5_K, quant.Q4_K},
	{quant.F16, quant.F16, quant.F16},
	{quant.BF16, quant.BF16},
	{quant.F32, quant.F32},
}

// MatMuls gives each matrix the product MatMul gives, under every kernel
// set, for decode and batch sizes, with a nil matrix among them; in decode
// the products take one pool job.
func TestMatMulsLevels(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(41, 42))
		for _, set := range fusedSets {
			cols := 2 * max(set[0].BlockLen(), 256)
			rowsList := []int{64, 13, 70, 8}
			for _, n := range []int{1, 2, 3, 8, 17} {
				ms := make([]*Matrix, len(set)+1)
				outs := make([][]float32, len(ms))
				for i, typ := range set {
					ms[i+1] = randMatrix(r, typ, rowsList[i%len(rowsList)], cols)
					outs[i+1] = make([]float32, n*ms[i+1].Rows)
				}
				_, xq := randActs(r, set[0], n, cols)
				gen := p.gen.Load()
				MatMuls(p, xq, n, ms, outs)
				// (none when the rows are few enough to run on the caller)
				if jobs := p.gen.Load() - gen; n == 1 && jobs > 1 {
					t.Errorf("%s %v n=1: %d pool jobs, want at most 1", level, set, jobs)
				}
				for i, m := range ms[1:] {
					want := matmulWant(m, xq, n, m.Rows)
					checkMatMul(t, fmt.Sprintf("%s %v n=%d matrix %d", level, set, n, i), m, xq, n, m.Rows, outs[i+1], want)
				}
			}
		}
	})
}

// Two products of a few hundred rows take one pool job and no allocation;
// misuse panics.
func TestMatMulsNoAllocAndMisuse(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	r := rand.New(rand.NewPCG(43, 44))
	a, b := randMatrix(r, quant.Q8_0, 256, 512), randMatrix(r, quant.Q4_0, 128, 512)
	_, xq := randActs(r, quant.Q8_0, 1, 512)
	oa, ob := make([]float32, 256), make([]float32, 128)
	gen := p.gen.Load()
	MatMuls(p, xq, 1, []*Matrix{a, b}, [][]float32{oa, ob})
	if jobs := p.gen.Load() - gen; jobs != 1 {
		t.Errorf("%d pool jobs for two products in decode, want 1", jobs)
	}
	if n := testing.AllocsPerRun(20, func() { MatMuls(p, xq, 1, []*Matrix{a, b}, [][]float32{oa, ob}) }); n != 0 && !raceEnabled {
		t.Errorf("%v allocations per MatMuls", n)
	}
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", what)
			}
		}()
		f()
	}
	k := randMatrix(r, quant.Q4_K, 32, 512)
	mustPanic("mixed activation formats", func() { MatMuls(p, xq, 1, []*Matrix{a, k}, [][]float32{oa, ob}) })
	mustPanic("five matrices", func() { MatMuls(p, xq, 1, []*Matrix{a, a, a, a, a}, make([][]float32, 5)) })
	mustPanic("missing output", func() { MatMuls(p, xq, 1, []*Matrix{a, b}, [][]float32{oa}) })
}
