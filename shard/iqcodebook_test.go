package shard

import (
	"testing"

	"shoal/engine/quant"
)

// The IQ2, IQ3 and IQ1 blocks are 256 columns, as IQ4_XS's: FFN [512,1024) is
// two blocks and is cut by columns, FFN [384,1024) is not on a boundary and
// falls back to whole output rows.
func TestIQCodebookSlices(t *testing.T) {
	for _, tc := range []iquantSlice{
		{"iq2_xxs", quant.IQ2_XXS, 512, true},
		{"iq2_xxs", quant.IQ2_XXS, 384, false},
		{"iq2_xs", quant.IQ2_XS, 512, true},
		{"iq2_xs", quant.IQ2_XS, 384, false},
		{"iq2_s", quant.IQ2_S, 512, true},
		{"iq2_s", quant.IQ2_S, 384, false},
		{"iq3_xxs", quant.IQ3_XXS, 512, true},
		{"iq3_xxs", quant.IQ3_XXS, 384, false},
		{"iq3_s", quant.IQ3_S, 512, true},
		{"iq3_s", quant.IQ3_S, 384, false},
		{"iq1_s", quant.IQ1_S, 512, true},
		{"iq1_s", quant.IQ1_S, 384, false},
		{"iq1_m", quant.IQ1_M, 512, true},
		{"iq1_m", quant.IQ1_M, 384, false},
	} {
		// Quantizing seven i-quant models takes minutes under the race
		// detector, and the slicing runs on one goroutine: one type there.
		if raceOn && tc.typ != "iq2_xxs" {
			continue
		}
		checkIQuantSlice(t, tc)
	}
}
