package quant

import "math"

// MXFP4 is the OCP microscaling 4-bit float (gpt-oss's expert weights): a
// block of 32 E2M1 values (4 bits each, low nibbles the first 16) sharing
// one E8M0 scale byte.
const MXFP4 Type = 39

// BlockMXFP4 is the bytes of an MXFP4 block: the scale, then 16 bytes of
// nibbles.
const BlockMXFP4 = 1 + QK/2

// MXFP4Values are the E2M1 values doubled (the scale is halved to match),
// by nibble.
var MXFP4Values = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// E8M0Half is half the power of two an E8M0 scale byte e stands for,
// 2^(e-128), as ggml computes it (the two smallest as subnormals).
func E8M0Half(e uint8) float32 {
	if e < 2 {
		return math.Float32frombits(uint32(0x00200000) << e)
	}
	return math.Float32frombits(uint32(e-1) << 23)
}

func dequantMXFP4(b []byte, y []float32) {
	d := E8M0Half(b[0])
	for j, q := range b[1:BlockMXFP4] {
		y[j] = d * float32(MXFP4Values[q&0xf])
		y[j+16] = d * float32(MXFP4Values[q>>4])
	}
}

// quantMXFP4 is ggml's quantize_row_mxfp4_ref: the scale from the block's
// largest magnitude (floor(log2 amax) - 2), each value the nearest level
// (the first on a tie).
func quantMXFP4(x []float32, b []byte) {
	var amax float32
	for _, v := range x[:QK] {
		amax = max(amax, abs32(v))
	}
	var e uint8
	if amax > 0 {
		e = uint8(int32(math.Floor(float64(log2f(amax)))) - 2 + 127)
	}
	b[0] = e
	d := E8M0Half(e)
	for j := 0; j < QK/2; j++ {
		b[1+j] = mxfp4Index(x[j], d) | mxfp4Index(x[j+QK/2], d)<<4
	}
}

// log2f is log2 in float32, as C's log2f gives it for the exponents that
// matter here (exact at powers of two).
func log2f(x float32) float32 { return float32(math.Log2(float64(x))) }

func mxfp4Index(x, d float32) uint8 {
	best, bestErr := 0, abs32(float32(MXFP4Values[0])*d-x)
	for i := 1; i < 16; i++ {
		if err := abs32(float32(MXFP4Values[i])*d - x); err < bestErr {
			best, bestErr = i, err
		}
	}
	return uint8(best)
}
