package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// expf is within 2 ulp of math.Exp over the clamped range, and saturates
// outside it.
func TestExpf(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 200000; i++ {
		x := float32(rng.Float64()*176 - 88)
		if i < 1000 {
			x = float32(rng.NormFloat64())
		}
		got, want := float64(expf(x)), math.Exp(float64(x))
		if x < expLo || x > expHi {
			continue
		}
		if e := math.Abs(got-want) / want; e > 2.5e-7 {
			t.Fatalf("expf(%v) = %v, want %v (rel %.3g)", x, got, want, e)
		}
	}
	if v := expf(-1000); v <= 0 || v > 1e-37 {
		t.Errorf("expf(-1000) = %v", v)
	}
	if v := expf(1000); math.IsInf(float64(v), 0) || v < 1e38 {
		t.Errorf("expf(1000) = %v", v)
	}
}

// ExpSub and SiLUMul on every level agree with the scalar expf sequence
// (platform kernels may differ by an FMA contraction: 1 ulp) for lengths
// around the 8-lane step.
func TestExpKernels(t *testing.T) {
	defer SetLevel(Path())
	rng := rand.New(rand.NewPCG(7, 8))
	for _, lv := range Levels() {
		if err := SetLevel(lv); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, 1, 7, 8, 9, 16, 31, 100, 1000} {
			x := make([]float32, n)
			g := make([]float32, n)
			u := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 10)
				g[i] = float32(rng.NormFloat64() * 20)
				u[i] = float32(rng.NormFloat64())
			}
			m := float32(3)
			wantX, wantG := make([]float32, n), make([]float32, n)
			var wantSum float64
			for i := range x {
				wantX[i] = expf(x[i] - m)
				wantSum += float64(wantX[i])
				wantG[i] = g[i] / (1 + expf(-g[i])) * u[i]
			}
			sum := ExpSub(x, m)
			SiLUMul(g, u)
			for i := range x {
				if !close32(x[i], wantX[i], 3e-7) {
					t.Fatalf("%s n=%d: exp[%d] = %v, want %v", lv, n, i, x[i], wantX[i])
				}
				if !close32(g[i], wantG[i], 5e-7) {
					t.Fatalf("%s n=%d: silu[%d] = %v, want %v", lv, n, i, g[i], wantG[i])
				}
			}
			if math.Abs(sum-wantSum) > 1e-6*wantSum+1e-30 {
				t.Fatalf("%s n=%d: sum %v, want %v", lv, n, sum, wantSum)
			}
		}
	}
}

// TestScaleMax compares every level's ScaleMax with the scalar products
// and maximum, the maximum placed at every lane and in the scalar tail.
func TestScaleMax(t *testing.T) {
	defer SetLevel(Path())
	rng := rand.New(rand.NewPCG(9, 10))
	for _, lv := range Levels() {
		if err := SetLevel(lv); err != nil {
			t.Fatal(err)
		}
		if got := ScaleMax(nil, 2); !math.IsInf(float64(got), -1) {
			t.Fatalf("%s: empty: %v, want -Inf", lv, got)
		}
		for _, n := range []int{1, 7, 8, 9, 16, 17, 31, 64, 100} {
			for top := 0; top < n; top++ {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(rng.NormFloat64()*10 - 50)
				}
				x[top] = 7.25
				s := float32(0.125)
				want := make([]float32, n)
				for i, v := range x {
					want[i] = v * s
				}
				if got := ScaleMax(x, s); got != 7.25*s {
					t.Fatalf("%s n=%d max at %d: %v, want %v", lv, n, top, got, 7.25*s)
				}
				for i := range x {
					if x[i] != want[i] {
						t.Fatalf("%s n=%d: x[%d] = %v, want %v", lv, n, i, x[i], want[i])
					}
				}
			}
		}
	}
}

func close32(a, b float32, rel float64) bool {
	return math.Abs(float64(a)-float64(b)) <= rel*math.Abs(float64(b))+1e-37
}
