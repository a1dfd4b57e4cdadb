package enginetest

import (
	"errors"
	"fmt"
	"math"

	"shoal/engine/gguf"
	"shoal/engine/quant"
)

var errLogitCount = errors.New("the logit count is not tokens × n_vocab")

// Metrics compares test logits with reference logits over all rows: the
// largest absolute difference, the RMS difference over the reference's
// standard deviation, and the mean and largest KL divergence of the rows'
// softmax (reference ‖ test).
type Metrics struct{ MaxAbs, NRMSE, MeanKL, MaxKL float64 }

// Compare compares got with ref, both rows of nVocab logits.
func Compare(ref, got []float32, nVocab int) Metrics {
	var m Metrics
	if len(ref) != len(got) || len(ref) == 0 {
		return Metrics{MaxAbs: math.Inf(1), NRMSE: math.Inf(1), MeanKL: math.Inf(1), MaxKL: math.Inf(1)}
	}
	var sumSq, sum, sumRef2 float64
	for i := range ref {
		d := float64(got[i]) - float64(ref[i])
		m.MaxAbs = math.Max(m.MaxAbs, math.Abs(d))
		sumSq += d * d
		sum += float64(ref[i])
		sumRef2 += float64(ref[i]) * float64(ref[i])
	}
	n := float64(len(ref))
	mean := sum / n
	m.NRMSE = math.Sqrt(sumSq/n) / math.Sqrt(sumRef2/n-mean*mean)
	rows := len(ref) / nVocab
	for r := range rows {
		kl := klDiv(ref[r*nVocab:(r+1)*nVocab], got[r*nVocab:(r+1)*nVocab])
		m.MeanKL += kl / float64(rows)
		m.MaxKL = math.Max(m.MaxKL, kl)
	}
	return m
}

func (m Metrics) String() string {
	return fmt.Sprintf("max|Δ|=%.4f nrmse=%.2e meanKL=%.2e maxKL=%.2e", m.MaxAbs, m.NRMSE, m.MeanKL, m.MaxKL)
}

// Check holds m to the bounds the oracle's README suggests for legitimate
// differences from llama.cpp, those of float models (F32, F16, BF16
// weights) or of quantized ones.
func (m Metrics) Check(float bool) error {
	if float {
		if m.MaxAbs > 0.02 || m.NRMSE > 2e-3 {
			return fmt.Errorf("float model outside tolerance (max|Δ| ≤ 0.02, nrmse ≤ 2e-3): %v", m)
		}
	} else if m.NRMSE > 0.07 || m.MeanKL > 0.005 || m.MaxKL > 0.01 || m.MaxAbs > 0.75 {
		return fmt.Errorf("quantized model outside tolerance (nrmse ≤ 0.07, mean KL ≤ 0.005, max KL ≤ 0.01, max|Δ| ≤ 0.75): %v", m)
	}
	return nil
}

// IsFloat reports whether every tensor of f is F32, F16 or BF16.
func IsFloat(f *gguf.File) bool {
	for _, ti := range f.Tensors {
		switch ti.Type {
		case quant.F32, quant.F16, quant.BF16:
		default:
			return false
		}
	}
	return true
}

func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - math.Log(s)
	}
	return out
}

func klDiv(p, q []float32) float64 {
	lp, lq := logSoftmax(p), logSoftmax(q)
	var kl float64
	for i := range lp {
		kl += math.Exp(lp[i]) * (lp[i] - lq[i])
	}
	return kl
}
