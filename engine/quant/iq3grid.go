package quant

// The codebooks of the IQ3 formats. A point is 4 magnitudes, each one of 8
// levels; a codebook lists its points by a 12-bit key holding, in bits
// 3j..3j+2, which level (0..7) magnitude j takes. The keys and levels are
// the formats' constants: the keys are ggml's kgrid_256 (IQ3_XXS) and
// kgrid_512 (IQ3_S), from iq3xs_init_impl in ggml/src/ggml-quants.c, and
// expanding them with the levels gives, entry for entry, the iq3xxs_grid
// and iq3s_grid tables of ggml/src/ggml-common.h that ggml's decoders read
// (TestIQ3Grids pins each expansion by its SHA-256 and by spot values).

// The levels of the IQ3 codebooks: IQ3_XXS's, and IQ3_S's (the odd
// numbers 1..15).
var (
	iq3xxsLevels = [8]uint8{4, 12, 20, 28, 36, 44, 52, 62}
	iq3sLevels   = [8]uint8{1, 3, 5, 7, 9, 11, 13, 15}
)

// iq3xxsKeys are the 256 points of the IQ3_XXS codebook, from
// iqkeys/iq3xxs.txt.
var iq3xxsKeys = iqKeys("iq3xxs.txt", 256)

// iq3sKeys are the 512 points of the IQ3_S codebook, from
// iqkeys/iq3s.txt.
var iq3sKeys = iqKeys("iq3s.txt", 512)

// IQ3XXSGrid and IQ3SGrid are the codebooks expanded: point i, magnitude j.
var (
	IQ3XXSGrid = func() (g [256][4]uint8) {
		expandIQ3(g[:], iq3xxsKeys[:], &iq3xxsLevels)
		return g
	}()
	IQ3SGrid = func() (g [512][4]uint8) {
		expandIQ3(g[:], iq3sKeys[:], &iq3sLevels)
		return g
	}()
)

func expandIQ3(g [][4]uint8, keys []uint16, levels *[8]uint8) {
	for i, k := range keys {
		for j := range 4 {
			g[i][j] = levels[k>>(3*j)&7]
		}
	}
}
