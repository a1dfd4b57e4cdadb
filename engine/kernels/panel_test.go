package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// panelTypes are the weight types with panel kernels on some level.
var panelTypes = []quant.Type{quant.Q4_0, quant.Q8_0, quant.F16, quant.BF16, quant.F32}

// The panel path against row products: several 64-row groups, a last
// partial group, rows past the last whole panel (decode kernels), more
// activations than one slab, and every count of activations left over after
// the full tiles.
func TestMatMulPanels(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	ran := false
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(43, 44))
		for _, typ := range panelTypes {
			ks := kernelsFor(typ)
			if ks == nil || ks.panel == nil {
				continue
			}
			ran = true
			shapes := []struct{ rows, cols int }{{5, 64}, {77, 96}, {136, 2048}, {8, 32}}
			if ks.panel.R == 16 { // float: 16-row panels, 16-column blocks and a tail
				shapes = []struct{ rows, cols int }{{15, 48}, {53, 200}, {32, 2048}, {16, 16}, {17, 2056}}
			}
			for _, sh := range shapes {
				m := randMatrix(r, typ, sh.rows, sh.cols)
				for _, n := range []int{4, 5, 6, 7, 13, 101} {
					if sh.cols == 2048 && n < 101 && n != 7 {
						continue
					}
					_, xq := randActs(r, typ, n, sh.cols)
					ldo := sh.rows + 3
					want := matmulWant(m, xq, n, ldo)
					out := make([]float32, len(want))
					MatMul(p, m, xq, n, out, ldo)
					checkMatMul(t, fmt.Sprintf("%s %v %dx%d n=%d", level, typ, sh.rows, sh.cols, n), m, xq, n, ldo, out, want)
				}
			}
		}
	})
	if Levels()[0] == "avx2" && !ran {
		t.Fatal("the avx2 level has no panel kernels")
	}
}

// The slab loop needs more activation bytes than a slab holds: 2048 columns
// of Q8_0 prepared as int16 take 4352 bytes per activation, so 101
// activations are four slabs.
func TestPanelSlabs(t *testing.T) {
	for _, typ := range panelTypes {
		ks := kernelsFor(typ)
		if ks == nil || ks.panel == nil {
			t.Skipf("%s: no panel kernels on level %s", typ, Path())
		}
		as := 2048 * 4 // float32 activations
		if ks.panel.prep != nil {
			as = 2048 / quant.QK * ks.panel.actBytes
		}
		if slab := (128 << 10) / as; slab >= 101 {
			t.Fatalf("%s: a slab holds %d activations; TestMatMulPanels does not cross slabs", typ, slab)
		}
	}
}

// BenchmarkPanelKernel times the full-tile panel kernels on a panel of 1024
// columns and its activations (no packing): the kernels' compute rate.
// benchCols is the columns of the benchmark panel.
const benchCols = 1024

func BenchmarkPanelKernel(b *testing.B) {
	for _, typ := range panelTypes {
		ks := kernelsFor(typ)
		if ks == nil || ks.panel == nil {
			continue
		}
		ps := ks.panel
		nb := benchCols / ps.blockLen
		as := 4 * (benchCols + 16) // as widen pads them
		if ps.prep != nil {
			as = nb * ps.actBytes
		}
		w := make([]byte, nb*ps.blockBytes)
		a := make([]byte, ps.C*as)
		out := make([]float32, ps.R*ps.C)
		b.Run(typ.String(), func(b *testing.B) {
			for b.Loop() {
				ps.tiles[ps.C](&w[0], 0, &a[0], as, nb, &out[0], ps.R)
			}
			b.ReportMetric(float64(2*ps.R*ps.C*benchCols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
