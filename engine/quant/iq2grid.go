package quant

// The codebooks of the IQ2 formats. A point of a codebook is 8 magnitudes,
// each one of the three levels 8, 25 and 43; a codebook lists its points by
// a 16-bit key holding, in bits 2j and 2j+1, which level (0, 1 or 2)
// magnitude j takes. The keys and levels are the formats' constants: they
// are ggml's kgrid_2bit_256 (IQ2_XXS), kgrid_2bit_512 (IQ2_XS) and
// kgrid_2bit_1024 (IQ2_S), from iq2xs_init_impl in ggml/src/ggml-quants.c,
// and expanding them with the levels gives, entry for entry, the
// iq2xxs_grid, iq2xs_grid and iq2s_grid tables of ggml/src/ggml-common.h
// that ggml's decoders read (TestIQ2Grids pins each expansion by its
// SHA-256 and by spot values). The keys are in increasing order, so each
// list is also the sorted set of base-3 numbers it encodes.

// iq2Levels are the three magnitudes of an IQ2 codebook point.
var iq2Levels = [3]uint8{8, 25, 43}

// iq2xxsKeys are the 256 points of the IQ2_XXS codebook, from
// iqkeys/iq2xxs.txt.
var iq2xxsKeys = iqKeys("iq2xxs.txt", 256)

// iq2sKeys are the 1024 points of the IQ2_S codebook, from
// iqkeys/iq2s.txt.
var iq2sKeys = iqKeys("iq2s.txt", 1024)

// iq2xsKeys are the 512 points of the IQ2_XS codebook, from
// iqkeys/iq2xs.txt.
var iq2xsKeys = iqKeys("iq2xs.txt", 512)

// IQ2XXSGrid, IQ2XSGrid and IQ2SGrid are the codebooks expanded: point i,
// magnitude j.
var (
	IQ2XXSGrid = func() (g [256][8]uint8) {
		expandIQ2(g[:], iq2xxsKeys[:])
		return g
	}()
	IQ2XSGrid = func() (g [512][8]uint8) {
		expandIQ2(g[:], iq2xsKeys[:])
		return g
	}()
	IQ2SGrid = func() (g [1024][8]uint8) {
		expandIQ2(g[:], iq2sKeys[:])
		return g
	}()
)

func expandIQ2(g [][8]uint8, keys []uint16) {
	for i, k := range keys {
		for j := range 8 {
			g[i][j] = iq2Levels[k>>(2*j)&3]
		}
	}
}

// IQ2Signs maps the 7 stored sign bits of a group of 8 weights to its 8
// sign bits (bit j set: weight j is negative): bit 7 is the parity of the
// other seven, so that every group has an even number of negative weights
// (ggml's ksigns_iq2xs). IQ2_XXS and IQ2_XS store 7 bits; IQ2_S stores all
// 8.
var IQ2Signs = func() (s [128]uint8) {
	for i := range s {
		p := 0
		for b := i; b != 0; b >>= 1 {
			p ^= b & 1
		}
		s[i] = uint8(i | p<<7)
	}
	return s
}()
