package kernels

import (
	"math"
	"sync"

	"shoal/engine/quant"
)

// geluTable maps each half-precision input to GELU's value, rounded to
// half precision: how ggml evaluates GELU on float32 (it rounds the input
// to half, looks the value up, and widens it back).
var geluTable = sync.OnceValue(func() []float32 {
	t := make([]float32, 1<<16)
	for h := range t {
		t[h] = quant.FP16ToFP32(quant.FP32ToFP16(GELU(quant.FP16ToFP32(uint16(h)))))
	}
	return t
})

// GELU is the tanh form of GELU in float32:
// 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))).
func GELU(x float32) float32 {
	const sqrt2OverPi, a = 0.79788456080286535587989211986876, 0.044715
	return 0.5 * x * (1 + float32(math.Tanh(float64(sqrt2OverPi*x*(1+a*x*x)))))
}

// GELUMul sets g[i] = gelu(g[i]) · u[i], GELU as ggml's table gives it
// (0 below −10, the identity above 10): the GeGLU gate.
func GELUMul(g, u []float32) {
	t := geluTable()
	u = u[:len(g)]
	for i, x := range g {
		switch {
		case x <= -10:
			g[i] = 0
		case x >= 10:
			g[i] = x * u[i]
		default:
			g[i] = t[quant.FP32ToFP16(x)] * u[i]
		}
	}
}
