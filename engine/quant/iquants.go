package quant

import "encoding/binary"

// The 4-bit non-linear formats (ggml's IQ4_NL and IQ4_XS). A weight is a
// scale times one of 16 fixed signed levels (IQ4NLValues), chosen by a 4-bit
// index; within every 32 weights, weight j < 16 sits in the low nibble of
// qs[j] and weight j+16 in its high nibble, as in Q4_0.
//
//	block_iq4_nl (32 weights):  f16 d | qs[16]
//	    weight j = d * IQ4NLValues[nibble j]
//	block_iq4_xs (256 weights): f16 d | uint16 scales_h | scales_l[4] | qs[128]
//	    sub-block ib (weights 32ib..32ib+31, nibbles qs[16ib:16ib+16]) has the
//	    6-bit scale ls = (scales_l[ib/2] >> 4*(ib%2)) & 0xf
//	                   | ((scales_h >> 2*ib) & 3) << 4,
//	    weight = (d * (ls - 32)) * IQ4NLValues[nibble]
//
// The dequantizers round as ggml's dequantize_row_iq4_nl/_xs (one float32
// product, or two for IQ4_XS in that order), so they are bit-exact. The
// quantizers are shoal's own (see quantIQ4NL); they need not give ggml's
// bytes.

// IQ4NLValues is the table of levels of IQ4_NL and IQ4_XS (ggml's
// kvalues_iq4nl), part of the format.
var IQ4NLValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// Block sizes in bytes.
const (
	// block_iq4_nl: f16 d | qs[16]
	BlockIQ4_NL = 18
	// block_iq4_xs: f16 d | uint16 scales_h | scales_l[4] | qs[128]
	BlockIQ4_XS = 136
)

// IQ4XSScale returns the 6-bit scale (0..63; the multiplier is the value
// minus 32) of sub-block ib (0..7) of the IQ4_XS block b.
func IQ4XSScale(b []byte, ib int) int {
	h := binary.LittleEndian.Uint16(b[2:])
	lo := int(b[4+ib/2]>>(4*(ib%2))) & 0xf
	return lo | int(h>>(2*ib)&3)<<4
}

func dequantIQ4_NL(b []byte, y []float32) {
	d := f16(b, 0)
	for j, q := range b[2 : 2+16] {
		y[j] = d * float32(IQ4NLValues[q&0xf])
		y[j+16] = d * float32(IQ4NLValues[q>>4])
	}
}

func dequantIQ4_XS(b []byte, y []float32) {
	d := f16(b, 0)
	for ib := 0; ib < QKK/32; ib++ {
		dl := d * float32(IQ4XSScale(b, ib)-32)
		qs, yb := b[8+16*ib:8+16*ib+16], y[32*ib:32*ib+32]
		for j, q := range qs {
			yb[j] = dl * float32(IQ4NLValues[q&0xf])
			yb[j+16] = dl * float32(IQ4NLValues[q>>4])
		}
	}
}

// iq4Below[i] is the index of the largest level <= i-128 (0 below the
// first), for iq4Index.
var iq4Below = func() (t [256]uint8) {
	for i := range t {
		for l, v := range IQ4NLValues {
			if int(v) <= i-128 {
				t[i] = uint8(l)
			}
		}
	}
	return t
}()

// iq4Index returns the index of the level of IQ4NLValues nearest to v (the
// lower one on a tie).
func iq4Index(v float32) uint8 {
	if !(v > float32(IQ4NLValues[0])) { // also NaN
		return 0
	}
	if v >= float32(IQ4NLValues[15]) {
		return 15
	}
	// -127 < v < 113: the level below v is the one below floor(v) (levels
	// are integers), and the nearest is it or the next.
	// (v+128 may round up to 241: the level below is still at most 14.)
	l := min(iq4Below[int(v+128)], 14)
	if v-float32(IQ4NLValues[l]) <= float32(IQ4NLValues[l+1])-v {
		return l
	}
	return l + 1
}

// iq4Fit fits x ≈ d * IQ4NLValues[L] for one group of 32: for each of a
// few candidate inverse scales (the element of largest magnitude mapped to
// a level near either end of the table) it picks the nearest levels, then
// the least-squares d for those levels, and keeps the candidate with the
// smallest squared error. It returns d (0 for an all-zero group) and
// leaves L unset: the caller picks the levels again for its rounded scale.
func iq4Fit(x []float32) float32 {
	max, amax := absMax(x)
	if amax < groupMaxEps {
		return 0
	}
	var bestD, best float32 // best = sumqx²/sumq2, the error reduction
	for _, end := range [2]float32{float32(IQ4NLValues[0]), float32(IQ4NLValues[15])} {
		for t := -6; t <= 6; t++ {
			id := (end + float32(t)) / max
			var sumqx, sumq2 float32
			for _, v := range x {
				q := float32(IQ4NLValues[iq4Index(id*v)])
				sumqx += q * v
				sumq2 += q * q
			}
			if sumq2 > 0 && sumqx*sumqx > best*sumq2 {
				bestD, best = sumqx/sumq2, sumqx*sumqx/sumq2
			}
		}
	}
	return bestD
}

// iq4Pack stores the nearest level indices of x for scale d as nibbles in
// qs (16 bytes for 32 weights) and returns the squared error.
func iq4Pack(x []float32, d float32, qs []byte) float32 {
	id := inv(d)
	var e float32
	for j := 0; j < 16; j++ {
		l0, l1 := iq4Index(x[j]*id), iq4Index(x[j+16]*id)
		qs[j] = l0 | l1<<4
		e0 := x[j] - d*float32(IQ4NLValues[l0])
		e1 := x[j+16] - d*float32(IQ4NLValues[l1])
		e += e0*e0 + e1*e1
	}
	return e
}

// quantIQ4NL picks the block's scale by iq4Fit, rounds it to f16 and picks
// the levels for the rounded scale. The error of a weight is at most half
// the largest gap between levels (24/2 of 127ths of the largest element),
// and on Gaussian data the rms error is about 7.4% of the rms (see
// rmseBound).
func quantIQ4_NL(x []float32, b []byte) {
	putF16(b, 0, iq4Fit(x))
	iq4Pack(x, f16(b, 0), b[2:18])
}

// quantIQ4_XS fits each sub-block of 32 as IQ4_NL does, sets the block
// scale d so that the sub-block scale of largest magnitude is -32·d, and
// gives each sub-block the 6-bit multiplier (one of the nearest two or
// three to its fit) whose levels leave the smallest squared error.
func quantIQ4_XS(x []float32, b []byte) {
	var scales [QKK / 32]float32
	var maxS, amaxS float32
	for ib := range scales {
		s := iq4Fit(x[32*ib : 32*ib+32])
		scales[ib] = s
		if a := abs32(s); a > amaxS {
			amaxS, maxS = a, s
		}
	}
	clear(b[:BlockIQ4_XS])
	putF16(b, 0, maxS/-32)
	d := f16(b, 0)
	id := inv(d)
	var sh uint16
	var tmp [16]byte
	for ib, s := range scales {
		xb, qs := x[32*ib:32*ib+32], b[8+16*ib:8+16*ib+16]
		l0 := clampInt(nearestInt(id*s), -32, 31)
		best, bestE := l0, float32(-1)
		for l := max(-32, l0-1); l <= min(31, l0+1); l++ {
			e := iq4Pack(xb, d*float32(l), tmp[:])
			if bestE < 0 || e < bestE {
				best, bestE = l, e
				copy(qs, tmp[:])
			}
		}
		ls := uint8(best + 32)
		b[4+ib/2] |= (ls & 0xf) << (4 * (ib % 2))
		sh |= uint16(ls>>4) << (2 * ib)
	}
	binary.LittleEndian.PutUint16(b[2:], sh)
}
