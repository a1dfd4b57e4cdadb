package kernels

import "math"

// exp over float32 vectors, for softmax and SiLU. The platform kernels and
// expf below compute the same sequence: exp(x) = 2^n · p(r) with
// n = round(x/ln2), r = x − n·ln2 (ln2 split in two so r is exact), p a
// degree-7 polynomial, x clamped to [-87.34, 88.38] so 2^n stays normal.
// It is within 2 ulp of the exact value over that range.

const (
	expLo    = -87.33654
	expHi    = 88.37626
	expLog2e = 1.44269504088896341
	expLn2hi = 0.693359375
	expLn2lo = -2.12194440e-4
)

var expP = [6]float32{1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1}

func expf(x float32) float32 {
	x = min(max(x, expLo), expHi)
	n := float32(math.RoundToEven(float64(x * expLog2e)))
	r := fma32(-n, expLn2hi, x)
	r = fma32(-n, expLn2lo, r)
	p := expP[0]
	for _, c := range expP[1:] {
		p = fma32(p, r, c)
	}
	p = fma32(p, r*r, r) + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

func fma32(a, b, c float32) float32 { return float32(math.FMA(float64(a), float64(b), float64(c))) }

// ExpSub sets x[i] = exp(x[i] − m) and returns the sum of the results (the
// numerator and denominator of a softmax with maximum m).
func ExpSub(x []float32, m float32) float64 {
	var sum float64
	if f := cur.expSub; f != nil {
		if n := len(x) &^ 7; n > 0 {
			sum = float64(f(&x[0], n, m))
			x = x[n:]
		}
	}
	for i, v := range x {
		e := expf(v - m)
		x[i] = e
		sum += float64(e)
	}
	return sum
}

// ScaleMax sets x[i] = x[i]·s (a float32 product) and returns the largest
// result, −Inf for an empty x: the scaling and maximum of a softmax over
// attention scores, in one pass. A NaN among the products may or may not be
// what it returns (the softmax that follows is NaN either way).
func ScaleMax(x []float32, s float32) float32 {
	mx := float32(math.Inf(-1))
	if f := cur.scaleMax; f != nil {
		if n := len(x) &^ 7; n > 0 {
			mx = f(&x[0], n, s)
			x = x[n:]
		}
	}
	for i, v := range x {
		v *= s
		x[i] = v
		if v > mx {
			mx = v
		}
	}
	return mx
}

// SiLUMul sets g[i] = silu(g[i]) · u[i], silu(x) = x / (1 + exp(−x)): the
// SwiGLU gate.
func SiLUMul(g, u []float32) {
	u = u[:len(g)]
	if f := cur.siluMul; f != nil {
		if n := len(g) &^ 7; n > 0 {
			f(&g[0], &u[0], n)
			g, u = g[n:], u[n:]
		}
	}
	for i, x := range g {
		g[i] = x / (1 + expf(-x)) * u[i]
	}
}
