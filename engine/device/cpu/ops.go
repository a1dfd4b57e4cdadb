package cpu

import (
	"math"

	"shoal/engine/device"
	"shoal/engine/kernels"
)

// RMSNorm writes x / sqrt(mean(x²) + eps) * w to dst (ggml: the sum of
// squares in float64, the scale in float32, then the weight multiply).
func RMSNorm(dst, x, w []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	mean := float32(sum / float64(len(x)))
	scale := 1 / float32(math.Sqrt(float64(mean+eps)))
	for i, v := range x {
		dst[i] = (v * scale) * w[i]
	}
}

// Softmax normalizes x in place (max-subtracted, float32 exp, the sum in
// float64 as ggml does).
func Softmax(x []float32) {
	mx := kernels.ScaleMax(x, 1) // x·1 is x
	inv := float32(1 / kernels.ExpSub(x, mx))
	for i := range x {
		x[i] *= inv
	}
}

// AddBias adds b to the first len(b) values of x.
func AddBias(x, b []float32) {
	for i := range b {
		x[i] += b[i]
	}
}

// RopeTable fills cos/sin for one position: half = RopeDim/2 entries
// (ggml's rope cache: theta starts at pos·scale and is multiplied by
// base^(-2/n_dims) in float32 for each pair).
func RopeTable(cos, sin []float32, pos int, c *device.Spec) {
	freqs := c.RopeFreqs
	thetaScale := float32(math.Pow(float64(c.RopeTheta), -2.0/float64(c.RopeDim)))
	theta := float32(pos)
	if y := c.Yarn; y != nil {
		lo, hi := yarnCorrDims(c.RopeDim, y.OrigCtx, c.RopeTheta, y.BetaFast, y.BetaSlow)
		mscale := y.AttnFactor * (1 + 0.1*float32(math.Log(float64(1/c.RopeScale))))
		for i := range cos {
			extrap := theta
			if freqs != nil {
				extrap /= freqs[i]
			}
			interp := c.RopeScale * extrap
			ramp := 1 - min(1, max(0, (float32(i)-lo)/max(0.001, hi-lo)))
			t := interp*(1-ramp) + extrap*ramp
			cos[i] = float32(math.Cos(float64(t))) * mscale
			sin[i] = float32(math.Sin(float64(t))) * mscale
			theta *= thetaScale
		}
		return
	}
	for i := range cos {
		t := theta
		if freqs != nil {
			t /= freqs[i]
		}
		t *= c.RopeScale
		cos[i] = float32(math.Cos(float64(t)))
		sin[i] = float32(math.Sin(float64(t)))
		theta *= thetaScale
	}
}

// yarnCorrDims are the first and last pair indexes YaRN's ramp runs
// between (ggml_rope_yarn_corr_dims): the pairs that turn beta times over
// origCtx positions, for beta the fast and the slow bound.
func yarnCorrDims(nDims, origCtx int, base, betaFast, betaSlow float32) (lo, hi float32) {
	dim := func(beta float32) float64 {
		return float64(nDims) * math.Log(float64(origCtx)/(float64(beta)*2*math.Pi)) / (2 * math.Log(float64(base)))
	}
	lo = max(0, float32(math.Floor(dim(betaFast))))
	hi = min(float32(nDims-1), float32(math.Ceil(dim(betaSlow))))
	return lo, hi
}

// Rope rotates the first ropeDim dimensions of each head in x (nHead heads
// of headDim) by the angles in cos/sin.
func Rope(x []float32, nHead, headDim, ropeDim int, mode device.RopeMode, cos, sin []float32) {
	half := ropeDim / 2
	for h := 0; h < nHead; h++ {
		v := x[h*headDim : (h+1)*headDim]
		if mode == device.RopeNeoX {
			for i := 0; i < half; i++ {
				a, b := v[i], v[i+half]
				v[i] = a*cos[i] - b*sin[i]
				v[i+half] = a*sin[i] + b*cos[i]
			}
		} else {
			for i := 0; i < half; i++ {
				a, b := v[2*i], v[2*i+1]
				v[2*i] = a*cos[i] - b*sin[i]
				v[2*i+1] = a*sin[i] + b*cos[i]
			}
		}
	}
}
