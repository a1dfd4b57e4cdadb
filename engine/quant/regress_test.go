package quant

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"testing"
)

// regressionInput is a fixed row (no dependence on math/rand's algorithms):
// bell-shaped values from an LCG, one block of exact ties on quarter steps
// and one all-zero sub-block.
func regressionInput() []float32 {
	const n = 8 * QKK
	x := make([]float32, n)
	s := uint32(12345)
	next := func() float64 {
		s = s*1664525 + 1013904223
		return float64(s>>8) / (1 << 24)
	}
	for i := range x {
		v := next() + next() + next() - 1.5 // roughly bell-shaped in [-1.5, 1.5]
		x[i] = float32(v * 0.05 * math.Exp(2*next()-1))
	}
	for i := QKK; i < 2*QKK; i++ {
		x[i] = float32(int(next()*9)-4) * 0.25
	}
	for i := 3 * QKK; i < 3*QKK+32; i++ {
		x[i] = 0
	}
	return x
}

// The SHA-256 (first 16 hex digits) of QuantizeRow's output for
// regressionInput. When recorded, each quantized output (all but F32 and BF16)
// was compared byte for byte with a C transcription of ggml's
// quantize_row_*_ref (and F16 with C's _Float16 conversion), built with
// -ffp-contract=off, as were many randomized rows: all identical. A change
// here means the quantizers no longer match ggml.
var regressionHashes = map[Type]string{
	F32:  "c5a70b2b7b52b23a",
	F16:  "13ea224a25854afd",
	BF16: "e4a0b5e33a57d650",
	Q4_0: "32aec28df7de9192",
	Q4_1: "babe57e4f913f7a0",
	Q5_0: "3d9be2efbcae18a7",
	Q5_1: "34698de2a86c4c59",
	Q8_0: "e905c0e74225dd0f",
	Q8_1: "919e80a5a56982a9",
	Q2_K: "92788c910e4db4f2",
	Q3_K: "2fe425df5573ce83",
	Q4_K: "e63e557ffec8d216",
	Q5_K: "defd929e2a46047d",
	Q6_K: "9b87f6a6bf1bd9cd",
	Q8_K: "6e9648333acad85a",
}

func TestQuantizeRegression(t *testing.T) {
	x := regressionInput()
	for _, typ := range allTypes {
		q := make([]byte, typ.RowSize(len(x)))
		QuantizeRow(typ, x, q)
		sum := sha256.Sum256(q)
		got := hex.EncodeToString(sum[:8])
		if want, ok := regressionHashes[typ]; !ok {
			t.Errorf("%v: no recorded hash; got %s", typ, got)
		} else if got != want {
			t.Errorf("%v: output hash %s, want %s", typ, got, want)
		}
	}
}
