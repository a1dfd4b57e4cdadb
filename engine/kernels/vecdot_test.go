package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

var weightTypes = []quant.Type{
	quant.F32, quant.F16, quant.BF16,
	quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0, quant.Q8_1,
	quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.Q8_K,
	quant.IQ4_NL, quant.IQ4_XS, quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S,
	quant.IQ3_XXS, quant.IQ3_S, quant.IQ1_S, quant.IQ1_M, quant.MXFP4,
}

func randRow(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// rows quantizes random weights as t and random activations as VecDotType(t),
// and returns the raw rows and their dequantized values.
func rows(r *rand.Rand, t quant.Type, n int) (w, a []byte, wf, af []float32) {
	at := quant.VecDotType(t)
	w = make([]byte, t.RowSize(n))
	a = make([]byte, at.RowSize(n))
	quant.QuantizeRow(t, randRow(r, n, 0.05), w)
	x := randRow(r, n, 1)
	x[r.IntN(n)] = 6 // an outlier, as real activations have
	quant.QuantizeRow(at, x, a)
	wf, af = make([]float32, n), make([]float32, n)
	quant.DequantizeRow(t, w, wf)
	quant.DequantizeRow(at, a, af)
	return w, a, wf, af
}

// VecDot must agree with the float64 dot of the dequantized rows to within
// rounding: 1e-5 of sum |w||a|.
func TestVecDotMatchesDequantized(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, typ := range weightTypes {
		bl := typ.BlockLen()
		var ns []int
		if bl == 1 {
			bl = 32 // float rows: blocks of 32, plus odd lengths
			ns = []int{1, 3}
		}
		for _, nb := range []int{1, 2, 7, 16} {
			ns = append(ns, nb*bl)
		}
		for _, n := range ns {
			for trial := 0; trial < 3; trial++ {
				w, a, wf, af := rows(r, typ, n)
				var want, mag float64
				for i := range wf {
					want += float64(wf[i]) * float64(af[i])
					mag += math.Abs(float64(wf[i]) * float64(af[i]))
				}
				got := float64(VecDot(typ, n, w, a))
				tol := 1e-5*mag + 1e-30 + sTolerance(typ, n, w, a)
				if d := math.Abs(got - want); d > tol {
					t.Errorf("%v n=%d: VecDot = %g, dequantized dot = %g (diff %g, sum|wa| %g)", typ, n, got, want, d, mag)
				}
			}
		}
	}
}

// sTolerance is the extra error allowed for Q4_1/Q5_1: their min term uses the
// Q8_1 field s, which ggml stores as fp16(d*sum(q)) with d before its own
// rounding to fp16, so m*s differs from m*d16*sum(q) by up to about 2^-10
// relative (two fp16 roundings) per block.
func sTolerance(typ quant.Type, n int, w, a []byte) float64 {
	if quant.VecDotType(typ) != quant.Q8_1 || typ == quant.Q8_1 {
		return 0
	}
	bx := typ.BlockSize()
	var tol float64
	for i := 0; i < n/quant.QK; i++ {
		m := math.Abs(float64(f16(w[i*bx+2:])))
		s := math.Abs(float64(f16(a[i*quant.BlockQ8_1+2:])))
		tol += m * s / 1024
	}
	return tol
}

// Trailing bytes after either row are ignored.
func TestVecDotIgnoresTail(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, typ := range weightTypes {
		n := 2 * max(typ.BlockLen(), 32)
		w, a, _, _ := rows(r, typ, n)
		want := VecDot(typ, n, w, a)
		w2 := append(append([]byte{}, w...), 0xff, 0x7f, 0x12, 0x34)
		a2 := append(append([]byte{}, a...), 0x7f, 0xff, 0x56, 0x78)
		if got := VecDot(typ, n, w2, a2); got != want {
			t.Errorf("%v: tail changed the result: %g vs %g", typ, got, want)
		}
	}
}

func TestVecDotNoAlloc(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, typ := range weightTypes {
		n := 4 * max(typ.BlockLen(), 32)
		w, a, _, _ := rows(r, typ, n)
		if allocs := testing.AllocsPerRun(10, func() { VecDot(typ, n, w, a) }); allocs != 0 {
			t.Errorf("%v: %v allocations per VecDot", typ, allocs)
		}
	}
}

func TestVecDotPanics(t *testing.T) {
	w := make([]byte, quant.Q4_0.RowSize(64))
	a := make([]byte, quant.Q8_0.RowSize(64))
	for name, f := range map[string]func(){
		"partial block": func() { VecDot(quant.Q4_0, 48, w, a) },
		"short weights": func() { VecDot(quant.Q4_0, 64, w[:20], a) },
		"short acts":    func() { VecDot(quant.Q4_0, 64, w, a[:40]) },
		"short f32":     func() { VecDot(quant.F32, 8, make([]byte, 31), make([]byte, 32)) },
		"no kernel":     func() { VecDot(quant.I8, 4, w, a) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// A hand-checked case: Q4_0 weights all q=9 (value (9-8)*d = d) with d = 0.5,
// Q8_0 activations all 2 with d = 0.25: each element contributes 0.5*0.5 = 0.25,
// so 64 elements give 16.
func TestVecDotQ4_0Hand(t *testing.T) {
	w := make([]byte, 2*quant.BlockQ4_0)
	a := make([]byte, 2*quant.BlockQ8_0)
	for b := 0; b < 2; b++ {
		x := w[b*quant.BlockQ4_0:]
		x[0], x[1] = 0x00, 0x38 // d = 0.5
		for j := 2; j < quant.BlockQ4_0; j++ {
			x[j] = 0x99
		}
		y := a[b*quant.BlockQ8_0:]
		y[0], y[1] = 0x00, 0x34 // d = 0.25
		for j := 2; j < quant.BlockQ8_0; j++ {
			y[j] = 2
		}
	}
	if got := VecDot(quant.Q4_0, 64, w, a); got != 16 {
		t.Errorf("got %g, want 16", got)
	}
}
