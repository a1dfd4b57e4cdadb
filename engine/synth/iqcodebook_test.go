package synth_test

import "testing"

// A model of each IQ2 and IQ3 type generates what the same model
// dequantized to F32 generates, as TestIQ4ModelMatchesDequantized checks
// for the IQ4 types: its logits finite and within enginetest's bounds for
// quantized models (the two differ only by the quantized activations).
// (Measured: nrmse IQ2_XXS 3.8e-2, IQ2_XS 3.9e-2, IQ2_S 3.8e-2, IQ3_XXS
// 3.7e-2, IQ3_S 4.1e-2, at most one near-tie flipped, as IQ4_XS's 3.8e-2.)
func TestIQCodebookModelMatchesDequantized(t *testing.T) {
	for _, typ := range []string{"iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s"} {
		t.Run(typ, func(t *testing.T) { modelMatchesDequantized(t, typ) })
	}
}

// The same for IQ1_S and IQ1_M, whose weights keep about 0.45 and 0.42 of
// their rms as error (the model still generates what its dequantized copy
// does: the two differ only by the quantized activations). (Measured on
// amd64: nrmse IQ1_S 3.3e-2, IQ1_M 3.8e-2, two near-ties flipped each, the
// most modelMatchesDequantized allows.)
func TestIQ1ModelMatchesDequantized(t *testing.T) {
	for _, typ := range []string{"iq1_s", "iq1_m"} {
		t.Run(typ, func(t *testing.T) { modelMatchesDequantized(t, typ) })
	}
}
