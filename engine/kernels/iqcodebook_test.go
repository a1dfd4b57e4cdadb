package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"shoal/engine/quant"
)

// IQ2 and IQ3 weight rows of random bytes (every codebook index, sign
// index or sign byte and scale, either sign of d) against quantized activations (or
// activation quants of random bytes, -128 included): every kernel set
// agrees with the generic dot, and the generic dot with the float64 dot of
// the dequantized rows.
func TestIQCodebookRandomBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, typ := range []quant.Type{quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S} {
		bs := typ.BlockSize()
		for _, nb := range []int{1, 2, 3, 5, 8, 9} {
			n := nb * quant.QKK
			for trial := 0; trial < 20; trial++ {
				w := make([]byte, typ.RowSize(n))
				for i := range w {
					w[i] = byte(r.Uint32())
				}
				for b := 0; b < nb; b++ {
					if trial%5 == 1 {
						for i := 2; i < bs; i++ {
							w[b*bs+i] = 0xff // the last points, every multiplier 31
						}
					}
					// d in ±[2^-10, 2^-3)
					h := uint16(0x1400 + r.IntN(0x1c00))
					if r.IntN(2) == 0 {
						h |= 0x8000
					}
					w[b*bs], w[b*bs+1] = byte(h), byte(h>>8)
				}
				_, a, _, _ := rows(r, typ, n)
				if trial%4 == 0 {
					// activation quants of any int8 value, -128 included
					for b := 0; b < nb; b++ {
						q := a[b*quant.BlockQ8_K+4 : b*quant.BlockQ8_K+4+quant.QKK]
						for j := range q {
							q[j] = byte(r.Uint32())
						}
						q[0], q[17], q[255] = 0x80, 0x80, 0x80
					}
				}
				checkIQDot(t, typ, n, w, a)
			}
		}
	}
}

// A hand-worked dot: one block, d = 1, every multiplier 1 (s = 0: 1/8 of
// the magnitude), every group point 0 (all 8s) without signs, so every
// weight is 1; but group 0 is point 1 (43, then seven 8s) with sign index
// 1 (weights 0 and 7 negative), and sub-block 1's scale (weights 16..31) is
// s = 1 (3/8: weights 3). Activations: Q8_K with d = 0.5, quants 2
// everywhere but quant 0 = -128. Dot: weights 0..15 are -43/8, 1 x 6,
// -1 and 1 x 8, then 16 of 3 and 224 of 1; so 0.5·(-43/8·-128 + 2·(6 - 1 +
// 8)) + 0.5·16·3·2 + 0.5·224·2.
func TestIQ2Hand(t *testing.T) {
	w := make([]byte, quant.BlockIQ2_XS)
	w[0], w[1] = 0x00, 0x3c
	w[2], w[3] = 0x01, 0x02 // 1 | 1<<9: index 1, sign index 1
	w[66] = 0x10
	a := make([]byte, quant.BlockQ8_K)
	a[0], a[1], a[2], a[3] = 0x00, 0x00, 0x00, 0x3f // 0.5
	for j := 0; j < quant.QKK; j++ {
		a[4+j] = 2
	}
	a[4] = 0x80
	want := 0.5*(43.0/8*128+2*(6-1+8)) + 0.5*16*3*2 + 0.5*224*2
	eachLevel(t, func(level string) {
		if got := VecDot(quant.IQ2_XS, quant.QKK, w, a); math.Abs(float64(got)-want) > 1e-3 {
			t.Errorf("%s: %g, want %g", level, got, want)
		}
	})
}

// On amd64 every level but generic has IQ2, IQ3 and IQ1 kernels.
func TestIQCodebookWired(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("IQ2, IQ3 and IQ1 kernels are amd64 only")
	}
	eachLevel(t, func(level string) {
		for _, typ := range []quant.Type{quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S, quant.IQ1_S, quant.IQ1_M} {
			if got := kernelsFor(typ) != nil; got != (level != "generic") {
				t.Errorf("%s: %v has platform kernels: %v", level, typ, got)
			}
		}
	})
}

// IQ1 weight rows of random bytes (every codebook index, delta and scale,
// either sign of d) against quantized activations (or activation quants
// of random bytes, -128 included, with their bsums): every kernel set
// agrees with the generic dot, and the generic dot with the float64 dot of
// the dequantized rows.
func TestIQ1RandomBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	for _, typ := range []quant.Type{quant.IQ1_S, quant.IQ1_M} {
		bs := typ.BlockSize()
		for _, nb := range []int{1, 2, 3, 5, 8, 9} {
			n := nb * quant.QKK
			for trial := 0; trial < 40; trial++ {
				w := make([]byte, typ.RowSize(n))
				for i := range w {
					w[i] = byte(r.Uint32())
					if trial%5 == 1 {
						w[i] = 0xff // the last points, every multiplier 15, negative deltas
					}
				}
				for b := 0; b < nb; b++ {
					// d in ±[2^-10, 2^-3)
					h := uint16(0x1400 + r.IntN(0x1c00))
					if r.IntN(2) == 0 {
						h |= 0x8000
					}
					blk := w[b*bs : (b+1)*bs]
					if typ == quant.IQ1_S {
						blk[0], blk[1] = byte(h), byte(h>>8)
					} else {
						for k := 0; k < 4; k++ {
							blk[49+2*k] = blk[49+2*k]&0x0f | byte(h>>(4*k))<<4
						}
					}
				}
				_, a, _, _ := rows(r, typ, n)
				if trial%4 == 0 {
					// activation quants of any int8 value, -128 included
					for b := 0; b < nb; b++ {
						blk := a[b*quant.BlockQ8_K : (b+1)*quant.BlockQ8_K]
						q := blk[4 : 4+quant.QKK]
						for j := range q {
							q[j] = byte(r.Uint32())
						}
						q[0], q[17], q[255] = 0x80, 0x80, 0x80
						for j := 0; j < 16; j++ {
							var s int16
							for _, v := range q[16*j : 16*j+16] {
								s += int16(int8(v))
							}
							binary.LittleEndian.PutUint16(blk[260+2*j:], uint16(s))
						}
					}
				}
				checkIQDot(t, typ, n, w, a)
			}
		}
	}
}

// A hand-worked IQ1_S dot: one block, d = 1, every group point 0 (all
// -1), s = 0 and delta +1/8, so every weight is -0.875; but sub-block 1
// (weights 32..63) has s = 1 (multiplier 3) and delta -1/8: weights
// -3.375, and its group 0 (weights 32..39) is point 2047 (all +1): 2.625.
// Activations: Q8_K with d = 0.5, quants 2 everywhere but quant 0 = -128.
// Dot: 0.5·(-0.875·(-128 + 2·31) + 2·(8·2.625 + 24·-3.375) - 0.875·2·192).
func TestIQ1Hand(t *testing.T) {
	w := make([]byte, quant.BlockIQ1_S)
	w[0], w[1] = 0x00, 0x3c
	w[2+4] = 0xff
	binary.LittleEndian.PutUint16(w[34+2:], 7|1<<12|0x8000)
	a := make([]byte, quant.BlockQ8_K)
	a[0], a[1], a[2], a[3] = 0x00, 0x00, 0x00, 0x3f // 0.5
	for j := 0; j < quant.QKK; j++ {
		a[4+j] = 2
	}
	a[4] = 0x80
	for j := 0; j < 16; j++ {
		binary.LittleEndian.PutUint16(a[260+2*j:], 32)
	}
	binary.LittleEndian.PutUint16(a[260:], uint16(0xffff-128+30+1)) // -128 + 15·2 = -98
	want := 0.5 * (-0.875*(-128+2*31) + 2*(8*2.625+24*-3.375) - 0.875*2*192)
	eachLevel(t, func(level string) {
		if got := VecDot(quant.IQ1_S, quant.QKK, w, a); math.Abs(float64(got)-want) > 1e-3 {
			t.Errorf("%s: %g, want %g", level, got, want)
		}
	})
}

// checkIQDot fails t unless the generic dot of the weight row w and the
// activation row a (of typ's vec-dot type) agrees with the float64 dot of the dequantized rows, and
// every kernel set with the generic dot.
func checkIQDot(t *testing.T, typ quant.Type, n int, w, a []byte) {
	t.Helper()
	want := vecDotGeneric(typ, n, w, a)
	var ref float64
	wf, af := make([]float32, n), make([]float32, n)
	quant.DequantizeRow(typ, w, wf)
	quant.DequantizeRow(quant.VecDotType(typ), a, af)
	for i := range wf {
		ref += float64(wf[i]) * float64(af[i])
	}
	mag := magnitude(typ, n, w, a)
	if d := math.Abs(float64(want) - ref); d > 1e-5*mag+1e-30 {
		t.Fatalf("%v n=%d: generic %g, dequantized dot %g", typ, n, want, ref)
	}
	eachLevel(t, func(level string) {
		got := VecDot(typ, n, w, a)
		if d := math.Abs(float64(got) - float64(want)); d > 1e-5*mag+1e-30 || math.IsNaN(float64(got)) {
			t.Errorf("%s %v n=%d: %g, generic %g", level, typ, n, got, want)
		}
	})
}
