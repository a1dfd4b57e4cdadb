package kernels

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"shoal/engine/quant"
)

var packTypes = []quant.Type{quant.Q4_0, quant.Q8_0}

func TestPackRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, typ := range packTypes {
		for _, cols := range []int{32, 96, 2048} {
			m := randMatrix(r, typ, 12, cols)
			p := PackMatrix(m)
			if !p.Packed || len(p.Data) != len(m.Data) {
				t.Fatalf("%v %d: packed %v, %d bytes for %d", typ, cols, p.Packed, len(p.Data), len(m.Data))
			}
			if uintptrOf(p.Data)%64 != 0 {
				t.Errorf("%v %d: packed data not 64-byte aligned", typ, cols)
			}
			if bytes.Equal(p.Data, m.Data) {
				t.Errorf("%v %d: packing left the bytes as they were", typ, cols)
			}
			u := make([]byte, len(m.Data))
			unpackMatrixRows(p, 0, p.Rows, u)
			if !bytes.Equal(u, m.Data) {
				t.Errorf("%v %d: unpacking PackMatrix(m) does not give m", typ, cols)
			}
			for _, rr := range [][2]int{{0, 12}, {4, 8}, {1, 11}, {5, 6}} {
				got := make([]byte, (rr[1]-rr[0])*m.RowSize)
				p.CopyRows(rr[0], rr[1], got)
				if !bytes.Equal(got, m.Data[rr[0]*m.RowSize:rr[1]*m.RowSize]) {
					t.Errorf("%v %d: CopyRows(%d, %d) of the packed matrix differs from its rows", typ, cols, rr[0], rr[1])
				}
			}
			// the layout itself: row 2's block 1, vector 0 and its scale
			nb, qb := cols/quant.QK, packQuant(typ)
			if nb > 1 {
				blk := m.Row(2)[typ.BlockSize() : 2*typ.BlockSize()]
				if got := p.Data[PackRows*qb+32 : PackRows*qb+48]; !bytes.Equal(got, blk[2:18]) {
					t.Errorf("%v %d: quants of row 2 block 1 at %x, want %x", typ, cols, got, blk[2:18])
				}
				if got := p.Data[nb*PackRows*qb+8+4 : nb*PackRows*qb+8+6]; !bytes.Equal(got, blk[:2]) {
					t.Errorf("%v %d: scale of row 2 block 1 is %x, want %x", typ, cols, got, blk[:2])
				}
			}
		}
	}
}

// A packed matrix gives the products of its rows at every level: through
// the packed kernels where the level has them (asserted), by unpacking rows
// elsewhere.
func TestMatMulPacked(t *testing.T) {
	pools := []*Pool{NewPool(1), NewPool(3)}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(43, 44))
		for _, typ := range packTypes {
			ks := kernelsFor(typ)
			hasPacked := ks != nil && ks.packed != nil
			if want := level == "avx512"; hasPacked != want {
				t.Errorf("%s %v: packed kernels %v, want %v", level, typ, hasPacked, want)
			}
			colsList, rowsList, nList := []int{32, 96, 224, 256, 2048}, []int{4, 8, 36, 132}, []int{1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 70}
			if sweepShort() {
				colsList, rowsList, nList = []int{32, 256}, []int{4, 132}, []int{1, 5, 17}
			}
			for _, cols := range colsList {
				for _, rowsN := range rowsList {
					m := randMatrix(r, typ, rowsN, cols)
					if pm := Pack(m); pm.Packed != hasPacked {
						t.Fatalf("%s %v: Pack gave packed=%v", level, typ, pm.Packed)
					}
					pm := PackMatrix(m)
					for _, n := range nList {
						_, xq := randActs(r, typ, n, cols)
						ldo := rowsN + 3
						for pi, p := range pools {
							want := make([]float32, (n-1)*ldo+rowsN)
							got := make([]float32, len(want))
							MatMul(p, m, xq, n, want, ldo)
							MatMul(p, pm, xq, n, got, ldo)
							checkMatMul(t, fmt.Sprintf("%s %v %dx%d n=%d pool %d: packed", level, typ, rowsN, cols, n, pi), m, xq, n, ldo, got, want)
						}
					}
				}
			}
		}
	})
}

func TestMatMulPackedNoAlloc(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	r := rand.New(rand.NewPCG(45, 46))
	eachLevel(t, func(level string) {
		for _, typ := range packTypes {
			m := PackMatrix(randMatrix(r, typ, 64, 512))
			for _, n := range []int{1, 8} {
				_, xq := randActs(r, typ, n, 512)
				out := make([]float32, n*64)
				MatMul(p, m, xq, n, out, 64) // warm the job pool and scratch
				if a := testing.AllocsPerRun(20, func() { MatMul(p, m, xq, n, out, 64) }); a != 0 && !raceEnabled {
					t.Errorf("%s %v n=%d: %v allocations per MatMul of a packed matrix", level, typ, n, a)
				}
			}
		}
	})
}

func TestPackedSliceAndRow(t *testing.T) {
	m := PackMatrix(randMatrix(rand.New(rand.NewPCG(47, 48)), quant.Q4_0, 8, 64))
	if s := m.Slice(4, 8); !s.Packed || s.Rows != 4 || len(s.Data) != 4*m.RowSize {
		t.Errorf("Slice(4,8) = %d rows, packed %v", s.Rows, s.Packed)
	}
	mustPanic(t, "Slice(2,6)", func() { m.Slice(2, 6) })
	mustPanic(t, "Row(1)", func() { m.Row(1) })
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
