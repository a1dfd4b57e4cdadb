package quant

import "encoding/binary"

// The 3-bit i-quants (ggml's IQ3_XXS and IQ3_S). A group of 8 weights is
// two points of a fixed codebook of 4 magnitudes (IQ3XXSGrid, IQ3SGrid; see
// iq3grid.go) with 8 signs; IQ3_XXS stores 7 of them, as IQ2_XS does
// (IQ2Signs), IQ3_S all 8. Each 32 weights have a 4-bit scale s.
//
//	block_iq3_xxs (256 weights): f16 d | qs[64] | scales_and_signs[32]
//	    32 weights ib: points qs[8ib..8ib+7] (two per group of 8); the
//	    uint32 at scales_and_signs[4ib] holds the 4 groups' sign indices
//	    in bits 7l..7l+6 and s in bits 28-31; multiplier d * (0.5+s) * 0.5.
//	block_iq3_s (256 weights): f16 d | qs[64] | qh[8] | signs[32] | scales[4]
//	    32 weights ib: point p (0..7) is qs[8ib+p] | (bit p of qh[ib]) << 8;
//	    group g's sign bits are signs[g]; s is the low nibble of
//	    scales[ib/2] for even ib, the high one for odd ib; multiplier
//	    d * (1 + 2s).
//
//	weight 8g+j = multiplier * Grid[point j/4 of the group][j%4]
//	              * (-1 if sign bit j)
//
// The dequantizers round as ggml's dequantize_row_iq3_* do (every product
// is exact in float32). The quantizers are shoal's own (see quantIQ in
// iqbook.go).

// Block sizes in bytes.
const (
	// block_iq3_xxs: f16 d | qs[64] | scales_and_signs[32]
	BlockIQ3_XXS = 98
	// block_iq3_s: f16 d | qs[64] | qh[8] | signs[32] | scales[4]
	BlockIQ3_S = 110
)

// iq3Group writes the 8 weights of one group: multiplier times the two
// points' magnitudes, negated where signs has a bit set.
func iq3Group(y []float32, db float32, p0, p1 *[4]uint8, signs uint8) {
	for j := 0; j < 4; j++ {
		v0, v1 := db*float32(p0[j]), db*float32(p1[j])
		if signs>>j&1 != 0 {
			v0 = -v0
		}
		if signs>>(j+4)&1 != 0 {
			v1 = -v1
		}
		y[j], y[j+4] = v0, v1
	}
}

func iq3xxsMul(d float32, s uint8) float32 { return d * (0.5 + float32(s)) * 0.5 }
func iq3sMul(d float32, s uint8) float32   { return d * float32(1+2*int(s)) }

func dequantIQ3_XXS(b []byte, y []float32) {
	d := f16(b, 0)
	for ib := 0; ib < QKK/32; ib++ {
		q := b[2+8*ib : 2+8*ib+8]
		aux := binary.LittleEndian.Uint32(b[66+4*ib:])
		db := iq3xxsMul(d, uint8(aux>>28))
		for l := 0; l < 4; l++ {
			iq3Group(y[32*ib+8*l:], db, &IQ3XXSGrid[q[2*l]], &IQ3XXSGrid[q[2*l+1]], IQ2Signs[aux>>(7*l)&127])
		}
	}
}

func dequantIQ3_S(b []byte, y []float32) {
	d := f16(b, 0)
	for ib := 0; ib < QKK/32; ib++ {
		q, qh := b[2+8*ib:2+8*ib+8], int(b[66+ib])
		db := iq3sMul(d, b[106+ib/2]>>(4*(ib%2))&0xf)
		for l := 0; l < 4; l++ {
			i0 := int(q[2*l]) | (qh>>(2*l)&1)<<8
			i1 := int(q[2*l+1]) | (qh>>(2*l+1)&1)<<8
			iq3Group(y[32*ib+8*l:], db, &IQ3SGrid[i0], &IQ3SGrid[i1], b[74+4*ib+l])
		}
	}
}

var (
	iq3xxsFormat = &iqFormat{size: BlockIQ3_XXS, book: newBook(iq3xxsLevels[:], 4, flat4(IQ3XXSGrid[:])), sub: 32, parity: true,
		mul: iq3xxsMul, den: 4,
		put: func(b []byte, g int, idx [2]uint16, signs uint8) {
			ib, l := g/4, g%4
			b[2+8*ib+2*l], b[2+8*ib+2*l+1] = uint8(idx[0]), uint8(idx[1])
			aux := binary.LittleEndian.Uint32(b[66+4*ib:]) | uint32(signs&127)<<(7*l)
			binary.LittleEndian.PutUint32(b[66+4*ib:], aux)
		},
		putScale: func(b []byte, h int, s uint8) { b[66+4*h+3] |= s << 4 }}
	iq3sFormat = &iqFormat{size: BlockIQ3_S, book: newBook(iq3sLevels[:], 4, flat4(IQ3SGrid[:])), sub: 32,
		mul: iq3sMul, den: 1,
		put: func(b []byte, g int, idx [2]uint16, signs uint8) {
			ib, l := g/4, g%4
			b[2+8*ib+2*l], b[2+8*ib+2*l+1] = uint8(idx[0]), uint8(idx[1])
			b[66+ib] |= uint8(idx[0]>>8)<<(2*l) | uint8(idx[1]>>8)<<(2*l+1)
			b[74+g] = signs
		},
		putScale: func(b []byte, h int, s uint8) { b[106+h/2] |= s << (4 * (h % 2)) }}
)

func quantIQ3_XXS(x []float32, b []byte) { quantIQ(iq3xxsFormat, x, b) }
func quantIQ3_S(x []float32, b []byte)   { quantIQ(iq3sFormat, x, b) }
