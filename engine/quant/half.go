package quant

import "math"

// fp16Table maps every IEEE half-precision bit pattern to its float32 value.
var fp16Table [1 << 16]float32

func init() {
	for h := range fp16Table {
		fp16Table[h] = math.Float32frombits(fp16Bits(uint16(h)))
	}
}

// fp16Bits widens a half float to the bits of the equal float32. Every half
// value is exactly representable; NaNs keep their payload and come out quiet,
// as the F16C VCVTPH2PS instruction does.
func fp16Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // inf or nan
		if mant == 0 {
			return sign | 0x7f800000
		}
		return sign | 0x7fc00000 | mant<<13
	case exp != 0: // normal
		return sign | (exp+127-15)<<23 | mant<<13
	case mant == 0: // signed zero
		return sign
	}
	// Subnormal: value = mant * 2^-24. Normalize so the leading one is bit 10.
	e := uint32(127 - 15 + 1)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x3ff)<<13
}

// FP16ToFP32 converts an IEEE 754 binary16 value (raw bits) to float32. The
// conversion is exact; it is a lookup in a 64Ki-entry table built at init.
func FP16ToFP32(h uint16) float32 { return fp16Table[h] }

// FP32ToFP16 converts f to IEEE 754 binary16 bits with round-to-nearest-even,
// producing subnormals, ±0 and ±inf (on overflow) exactly as the x86 F16C
// instruction VCVTPS2PH does with the default rounding mode. A NaN stays a NaN:
// sign kept, quiet bit set, top 9 payload bits kept.
func FP32ToFP16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant == 0 {
			return sign | 0x7c00
		}
		return sign | 0x7e00 | uint16(mant>>13)
	}
	e := exp - 127 + 15 // biased half exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Result is a half subnormal (or zero): q = value / 2^-24.
		if e < -10 {
			return sign // below half of the smallest subnormal: rounds to zero
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		q := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && q&1 == 1) {
			q++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(q)
	}
	q := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && q&1 == 1) {
		q++ // a carry into the exponent is correct, up to and including inf
	}
	return sign | uint16(q)
}

// BF16ToFP32 converts bfloat16 bits to float32 (exact: a 16-bit shift).
func BF16ToFP32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// FP32ToBF16 converts f to bfloat16 bits with round-to-nearest-even, as ggml's
// ggml_compute_fp32_to_bf16: subnormals are kept (not flushed), values that
// round past the largest finite bf16 become inf, and a NaN stays a NaN with its
// quiet bit forced on.
func FP32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}
