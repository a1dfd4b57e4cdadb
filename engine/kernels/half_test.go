package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// halfInputs mixes ordinary values with the edge cases of the conversion:
// signed zeros, half subnormals and their rounding ties, values that
// overflow to infinity, infinities and NaNs.
func halfInputs(rng *rand.Rand, n int) []float32 {
	special := []float32{0, float32(math.Copysign(0, -1)), 65504, 65519.99, 65520, -65520, 1e-8, 2.98e-8, 5.96e-8, -6.1e-5,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc12345),
		1 + 1.0/2048, 1 + 3.0/2048, math.Float32frombits(0x33000000), math.Float32frombits(0x33800001)}
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(4) {
		case 0:
			x[i] = special[rng.IntN(len(special))]
		case 1:
			x[i] = math.Float32frombits(rng.Uint32()) // any bit pattern
		default:
			x[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-24)))
		}
	}
	return x
}

// F32ToF16, RoundF16 and ScaleRoundF16 give quant.FP32ToFP16's bits on
// every level, for lengths around the 8-lane step.
func TestHalfKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	eachLevel(t, func(lv string) {
		for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 33, 1000} {
			x := halfInputs(rng, n)
			h := make([]uint16, n)
			F32ToF16(h, x)
			r := append([]float32(nil), x...)
			RoundF16(r)
			const scale = 0.37
			sr := append([]float32(nil), x...)
			ScaleRoundF16(sr, scale)
			for i, v := range x {
				ws := quant.FP16ToFP32(quant.FP32ToFP16(v * scale))
				if math.Float32bits(sr[i]) != math.Float32bits(ws) && !(sr[i] != sr[i] && ws != ws) {
					t.Fatalf("%s n=%d: ScaleRoundF16(%v, %v) = %v, want %v", lv, n, v, scale, sr[i], ws)
				}
				want := quant.FP32ToFP16(v)
				if h[i] != want {
					t.Fatalf("%s n=%d: F32ToF16(%v = %#08x) = %#04x, want %#04x", lv, n, v, math.Float32bits(v), h[i], want)
				}
				wr := quant.FP16ToFP32(want)
				if math.Float32bits(r[i]) != math.Float32bits(wr) && !(r[i] != r[i] && wr != wr) {
					t.Fatalf("%s n=%d: RoundF16(%v) = %v, want %v", lv, n, v, r[i], wr)
				}
			}
		}
	})
}

// F16ToF32 gives quant.FP16ToFP32's value for every one of the 65,536
// half bit patterns on every level, from every offset of the 8-lane step
// (a NaN may come out with another payload).
func TestF16ToF32(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	eachLevel(t, func(lv string) {
		for _, off := range []int{0, 1, 5} {
			src := all[off:]
			got := make([]float32, len(src))
			F16ToF32(got, src)
			for i, h := range src {
				want := quant.FP16ToFP32(h)
				if math.Float32bits(got[i]) != math.Float32bits(want) && !(got[i] != got[i] && want != want) {
					t.Fatalf("%s offset %d: F16ToF32(%#04x) = %v (%#08x), want %v (%#08x)", lv, off, h, got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
				}
			}
		}
	})
}
