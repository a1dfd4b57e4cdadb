package quant

// The codebook of the IQ1 formats (IQ1_S and IQ1_M share it). A point is 8
// values, each -1, 0 or +1; the codebook lists its 2048 points by a 16-bit
// key holding, in bits 2j and 2j+1, the digit (0, 1 or 2) of value j, which
// is the digit minus 1. The keys are the format's constants: they are
// ggml's kgrid_1bit_2048, from iq2xs_init_impl in ggml/src/ggml-quants.c,
// and expanding them gives, entry for entry, the iq1s_grid table of
// ggml/src/ggml-common.h that ggml's decoders read (TestIQ1Grid pins the
// expansion by its SHA-256 and by spot values). The keys are in increasing
// order.

// iq1Keys are the 2048 points of the IQ1 codebook, from
// iqkeys/iq1s.txt.
var iq1Keys = iqKeys("iq1s.txt", 2048)

// IQ1Grid is the codebook expanded: point i, value j (-1, 0 or +1).
var IQ1Grid = func() (g [2048][8]int8) {
	for i, k := range iq1Keys {
		for j := range 8 {
			g[i][j] = int8(k>>(2*j)&3) - 1
		}
	}
	return g
}()
