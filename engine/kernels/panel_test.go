package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// panelTypes are the weight types with panel kernels on some level.
var panelTypes = []quant.Type{quant.Q4_0, quant.Q8_0, quant.F16, quant.BF16, quant.F32}

// packQ4_0Panel lays out 8 Q4_0 rows as a panel: per block, quant dword d
// (bytes 4d..4d+3: elements 4d..4d+3 in the low nibbles, 16+4d.. in the
// high) of rows 0..7 in bytes 32d..32d+31, then the 8 f16 scales; 144 bytes,
// as much as the rows' blocks.
func packQ4_0Panel(rows []byte, rs, nb int, dst []byte) {
	const bs = 18
	for r := 0; r < 8; r++ {
		row := rows[r*rs : r*rs+nb*bs]
		for b := 0; b < nb; b++ {
			blk, p := row[b*bs:b*bs+bs], dst[b*8*bs:b*8*bs+8*bs]
			p[128+2*r], p[129+2*r] = blk[0], blk[1]
			for d := 0; d < 4; d++ {
				binary.LittleEndian.PutUint32(p[32*d+4*r:], binary.LittleEndian.Uint32(blk[2+4*d:]))
			}
		}
	}
}

// packQ8_0Panel lays out 8 Q8_0 rows as a panel: per block, the quants
// widened to int16, elements 2j and 2j+1 of rows 0..7 in bytes 32j..32j+31,
// then the 8 f16 scales; 528 bytes.
func packQ8_0Panel(rows []byte, rs, nb int, dst []byte) {
	const bs = 34
	for r := 0; r < 8; r++ {
		row := rows[r*rs : r*rs+nb*bs]
		for b := 0; b < nb; b++ {
			blk, p := row[b*bs:b*bs+bs], dst[b*528:b*528+528]
			p[512+2*r], p[513+2*r] = blk[0], blk[1]
			for j := 0; j < 16; j++ {
				lo, hi := uint32(uint16(int16(int8(blk[2+2*j])))), uint32(uint16(int16(int8(blk[3+2*j]))))
				binary.LittleEndian.PutUint32(p[32*j+4*r:], lo|hi<<16)
			}
		}
	}
}

// The pack kernels against the layouts above.
func TestPanelPack(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	for _, typ := range []quant.Type{quant.Q4_0, quant.Q8_0} {
		ks := kernelsFor(typ)
		if ks == nil || ks.panel == nil {
			t.Skipf("%s: no panel kernels on level %s", typ, Path())
		}
		ref := map[quant.Type]func([]byte, int, int, []byte){quant.Q4_0: packQ4_0Panel, quant.Q8_0: packQ8_0Panel}[typ]
		for _, nb := range []int{1, 3, 64} {
			m := randMatrix(r, typ, 9, nb*quant.QK)
			want := make([]byte, nb*ks.panel.blockBytes)
			got := make([]byte, len(want))
			ref(m.Data[m.RowSize:], m.RowSize, nb, want)
			ks.panel.pack(m.Data[m.RowSize:], m.RowSize, nb, got)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s nb=%d: the pack kernel's panel differs from the layout", typ, nb)
			}
		}
	}
}

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
				for _, n := range []int{4, 5, 6, 7, 12, 13, 14, 15, 16, 101} {
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
