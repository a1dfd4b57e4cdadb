package kernels

import (
	"math"
	"testing"
)

// TestGELUMul: the table form is GELU within half precision's rounding of
// the input and the result, 0 below −10 and the identity above 10, and
// the values at a few points are the textbook ones.
func TestGELUMul(t *testing.T) {
	for x, want := range map[float32]float32{0: 0, 1: 0.841192, -1: -0.158808, 3: 2.996363} {
		if got := GELU(x); math.Abs(float64(got-want)) > 1e-5 {
			t.Errorf("GELU(%g) = %g, want %g", x, got, want)
		}
	}
	var g, u []float32
	for x := float32(-12); x <= 12; x += 0.01 {
		g, u = append(g, x), append(u, 0.5)
	}
	in := append([]float32(nil), g...)
	GELUMul(g, u)
	for i, x := range in {
		want := 0.5 * GELU(x)
		if x <= -10 {
			want = 0
		}
		if x >= 10 {
			want = 0.5 * x
		}
		if d := math.Abs(float64(g[i] - want)); d > 2e-3*math.Max(1, math.Abs(float64(want))) {
			t.Fatalf("GELUMul at %g: %g, want %g", x, g[i], want)
		}
	}
}
