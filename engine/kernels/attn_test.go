package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// TestAxpyF16 compares AxpyF16 on every kernel level with the generic loop
// (an FMA rounds once, so the bound is one float32 rounding of the terms).
func TestAxpyF16(t *testing.T) {
	defer SetLevel(Path()) // restore the level the run was started with
	rng := rand.New(rand.NewPCG(1, 2))
	for _, lv := range Levels() {
		if err := SetLevel(lv); err != nil {
			t.Fatal(err)
		}
		if Path() != lv {
			t.Fatalf("level %s: Path() = %s", lv, Path())
		}
		for _, n := range []int{1, 7, 8, 9, 16, 64, 100, 129} {
			x := make([]uint16, n)
			y := make([]float32, n)
			for i := range x {
				x[i] = quant.FP32ToFP16(float32(rng.NormFloat64()))
				y[i] = float32(rng.NormFloat64())
			}
			want := append([]float32(nil), y...)
			alpha := float32(rng.NormFloat64())
			axpyF16Generic(want, alpha, x)
			AxpyF16(y, alpha, x)
			for i := range y {
				tol := 1e-6 * (math.Abs(float64(want[i])) + math.Abs(float64(alpha*quant.FP16ToFP32(x[i]))) + 1e-30)
				if d := math.Abs(float64(y[i] - want[i])); d > tol {
					t.Fatalf("level %s n=%d: y[%d] = %v, want %v", lv, n, i, y[i], want[i])
				}
			}
		}
	}
}
