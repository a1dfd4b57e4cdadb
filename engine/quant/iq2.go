package quant

import "encoding/binary"

// The 2-bit i-quants (ggml's IQ2_XXS, IQ2_XS and IQ2_S). A group of 8
// weights is one point of a fixed codebook of 8 magnitudes (IQ2XXSGrid,
// IQ2XSGrid, IQ2SGrid; see iq2grid.go) with 8 signs. IQ2_XXS and IQ2_XS
// store 7 of the signs: the eighth makes the number of negative weights
// even (IQ2Signs). A scale s of 4 bits gives its weights the multiplier
// d * (0.5 + s) * 0.25, i.e. d·(2s+1)/8.
//
//	block_iq2_xxs (256 weights): f16 d | uint16 qs[32]
//	    each 32 weights (ib) have 8 bytes at qs[4ib]: bytes 0-3 are the
//	    grid indices of groups 4ib..4ib+3, and the uint32 of bytes 4-7
//	    holds their sign indices in bits 7l..7l+6 and s in bits 28-31.
//	block_iq2_xs (256 weights): f16 d | uint16 qs[32] | scales[8]
//	    qs[g] (weights 8g..8g+7) = grid index (bits 0-8) | sign index << 9;
//	    s of weights 16h..16h+15 is the low nibble of scales[h/2] for
//	    even h, the high one for odd h.
//	block_iq2_s (256 weights): f16 d | qs[64] | qh[8] | scales[8]
//	    group g (weights 8g..8g+7): grid index qs[g] | ((qh[g/4] >>
//	    2(g%4)) & 3) << 8, its 8 sign bits qs[32+g]; scales as IQ2_XS.
//
//	weight 8g+j = multiplier * Grid[index][j] * (-1 if sign bit j)
//
// The dequantizers round as ggml's dequantize_row_iq2_* do (every product
// is exact in float32, so they are bit-exact in any order). The quantizers
// are shoal's own (see quantIQ in iqbook.go).

// Block sizes in bytes.
const (
	// block_iq2_xxs: f16 d | uint16 qs[32]
	BlockIQ2_XXS = 66
	// block_iq2_xs: f16 d | uint16 qs[32] | scales[8]
	BlockIQ2_XS = 74
	// block_iq2_s: f16 d | qs[64] | qh[8] | scales[8]
	BlockIQ2_S = 82
)

// iq2Mul is the multiplier of scale s.
func iq2Mul(d float32, s uint8) float32 { return d * (0.5 + float32(s)) * 0.25 }

func dequantIQ2_XXS(b []byte, y []float32) {
	d := f16(b, 0)
	for ib := 0; ib < QKK/32; ib++ {
		q := b[2+8*ib : 2+8*ib+8]
		aux := binary.LittleEndian.Uint32(q[4:])
		db := iq2Mul(d, uint8(aux>>28))
		for l := 0; l < 4; l++ {
			iq2Group(y[32*ib+8*l:32*ib+8*l+8], db, &IQ2XXSGrid[q[l]], IQ2Signs[aux>>(7*l)&127])
		}
	}
}

func dequantIQ2_XS(b []byte, y []float32) {
	d := f16(b, 0)
	for g := 0; g < QKK/8; g++ {
		q := binary.LittleEndian.Uint16(b[2+2*g:])
		db := iq2Mul(d, b[66+g/4]>>(4*(g/2%2))&0xf)
		iq2Group(y[8*g:8*g+8], db, &IQ2XSGrid[q&511], IQ2Signs[q>>9])
	}
}

func dequantIQ2_S(b []byte, y []float32) {
	d := f16(b, 0)
	for g := 0; g < QKK/8; g++ {
		idx := int(b[2+g]) | int(b[66+g/4]>>(2*(g%4))&3)<<8
		db := iq2Mul(d, b[74+g/4]>>(4*(g/2%2))&0xf)
		iq2Group(y[8*g:8*g+8], db, &IQ2SGrid[idx], b[34+g])
	}
}

// iq2Group writes the 8 weights of one group: scale times the codebook
// point's magnitudes, negated where signs has a bit set.
func iq2Group(y []float32, db float32, pt *[8]uint8, signs uint8) {
	for j, m := range pt {
		v := db * float32(m)
		if signs>>j&1 != 0 {
			v = -v
		}
		y[j] = v
	}
}
