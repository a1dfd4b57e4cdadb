package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// invariantTypes are the weight types TestBatchInvariant covers.
var invariantTypes = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q5_0,
	quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_XS}

// batchDiffs runs m against activations xq in batches of 1..maxN on each
// pool and lists, per batch size, how many products are not bitwise those
// of a decode step of the one activation (and the largest relative
// difference).
func batchDiffs(m *Matrix, xq []byte, maxN int, pools []*Pool) []string {
	rows, ars := m.Rows, m.ActRowSize()
	want := make([]float32, maxN*rows)
	for c := 0; c < maxN; c++ {
		MatMul(pools[0], m, xq[c*ars:(c+1)*ars], 1, want[c*rows:(c+1)*rows], rows)
	}
	var bad []string
	for _, p := range pools {
		for n := 1; n <= maxN; n++ {
			out := make([]float32, n*rows)
			MatMul(p, m, xq, n, out, rows)
			diff, cnt := 0.0, 0
			for k := range out {
				if math.Float32bits(out[k]) != math.Float32bits(want[k]) {
					cnt++
					diff = max(diff, math.Abs(float64(out[k]-want[k]))/math.Abs(float64(want[k])))
				}
			}
			if cnt > 0 {
				bad = append(bad, fmt.Sprintf("threads=%d n=%d: %d of %d (rel %.1g)", p.Threads(), n, cnt, len(out), diff))
			}
		}
	}
	return bad
}

// Batch-invariant products (SetBatchInvariant): under every kernel set, for
// plain and packed matrices, every batch of 1 to 20 activations on 1, 2 and
// 3 threads gives each product bitwise its value in a decode step of the
// one activation. Without the mode the differences are logged (the tiles
// and panels sum a row's blocks in another order than the decode kernels).
func TestBatchInvariant(t *testing.T) {
	pools := []*Pool{NewPool(1), NewPool(2), NewPool(3)}
	defer func(was bool) {
		for _, p := range pools {
			p.Close()
		}
		SetBatchInvariant(was)
	}(BatchInvariant())
	rowCounts := []int{100, 64, 13}
	if raceEnabled || testing.Short() {
		rowCounts = []int{100} // the race run is for the pools' sharing; -short runs under qemu
	}
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, typ := range invariantTypes {
			for _, rows := range rowCounts {
				m := randMatrix(r, typ, rows, 1024)
				_, xq := randActs(r, typ, 20, 1024)
				for i, mm := range []*Matrix{m, Pack(m)} {
					if i == 1 && !mm.Packed {
						continue // the level does not pack the type
					}
					what := fmt.Sprintf("%s %v %d rows packed=%v", level, typ, rows, mm.Packed)
					SetBatchInvariant(false)
					if bad := batchDiffs(mm, xq, 20, pools[:2]); bad != nil && rows == 100 {
						t.Logf("%s, default: %d batch sizes differ: %v ...", what, len(bad), bad[:min(len(bad), 3)])
					}
					SetBatchInvariant(true)
					if bad := batchDiffs(mm, xq, 20, pools); bad != nil {
						t.Errorf("%s, batch-invariant: %v", what, bad)
					}
				}
			}
		}
	})
}
