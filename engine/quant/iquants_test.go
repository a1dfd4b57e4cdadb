package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The IQ4 tests check the dequantizers against a second, deliberately plain
// reading of the format description (ggml-common.h block_iq4_nl and
// block_iq4_xs, ggml-quants.c dequantize_row_iq4_nl/_xs), written without
// the package's helpers: fields by byte offset, the bits of each scale
// gathered one by one.

// refLevels is the format's level table, written out again.
var refLevels = []float32{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

func refHalf(lo, hi byte) float32 {
	return float32(halfToFloat64(uint16(lo) | uint16(hi)<<8))
}

// halfToFloat64 decodes an IEEE half by its definition (no tables, no bit
// tricks): sign, 5-bit exponent (bias 15), 10-bit fraction.
func halfToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, f := int(h>>10&0x1f), float64(h&0x3ff)
	switch e {
	case 0:
		return sign * f / 1024 * math.Pow(2, -14)
	case 31:
		if f == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * (1 + f/1024) * math.Pow(2, float64(e-15))
}

func refDequantIQ4NL(blk []byte) []float32 {
	d := refHalf(blk[0], blk[1])
	y := make([]float32, 32)
	for i := 0; i < 32; i++ {
		var idx byte
		if i < 16 {
			idx = blk[2+i] % 16
		} else {
			idx = blk[2+i-16] / 16
		}
		y[i] = d * refLevels[idx]
	}
	return y
}

func refDequantIQ4XS(blk []byte) []float32 {
	d := refHalf(blk[0], blk[1])
	scalesH := int(blk[2]) + 256*int(blk[3])
	y := make([]float32, 256)
	for ib := 0; ib < 8; ib++ {
		// low 4 bits: the low nibble of scales_l[ib/2] for even ib, the high
		// nibble for odd ib; high 2 bits: bits 2ib and 2ib+1 of scales_h.
		low := int(blk[4+ib/2])
		if ib%2 == 1 {
			low /= 16
		}
		low %= 16
		bit4 := (scalesH >> (2 * ib)) % 2
		bit5 := (scalesH >> (2*ib + 1)) % 2
		ls := low + 16*bit4 + 32*bit5
		dl := d * float32(ls-32)
		for i := 0; i < 32; i++ {
			var idx byte
			if i < 16 {
				idx = blk[8+16*ib+i] % 16
			} else {
				idx = blk[8+16*ib+i-16] / 16
			}
			y[32*ib+i] = dl * refLevels[idx]
		}
	}
	return y
}

// randomHalf returns a finite random half (either sign, normal or
// subnormal) as two bytes.
func randomHalf(r *rand.Rand) (byte, byte) {
	for {
		h := uint16(r.Uint32())
		if h>>10&0x1f != 31 {
			return byte(h), byte(h >> 8)
		}
	}
}

// Random blocks, plus blocks whose nibbles are all 0 or all 15 (the ends of
// the table) and scales at their extremes (0 and 63, i.e. -32 and +31, and
// negative d), decode bit for bit as the plain reading does.
func TestIQ4DequantReference(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	check := func(typ Type, blk []byte, want []float32) {
		t.Helper()
		got := make([]float32, len(want))
		DequantizeRow(typ, blk, got)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%v block % x: element %d = %g, want %g", typ, blk, i, got[i], want[i])
			}
		}
	}
	for trial := 0; trial < 2000; trial++ {
		nl := make([]byte, BlockIQ4_NL)
		xs := make([]byte, BlockIQ4_XS)
		for i := range nl {
			nl[i] = byte(r.Uint32())
		}
		for i := range xs {
			xs[i] = byte(r.Uint32())
		}
		switch trial % 5 {
		case 1: // all nibbles 0 (level -127)
			clear(nl[2:])
			clear(xs[8:])
		case 2: // all nibbles 15 (level 113)
			for i := 2; i < len(nl); i++ {
				nl[i] = 0xff
			}
			for i := 8; i < len(xs); i++ {
				xs[i] = 0xff
			}
		case 3: // every scale 0 (-32) or 63 (+31)
			if trial%2 == 0 {
				xs[2], xs[3], xs[4], xs[5], xs[6], xs[7] = 0, 0, 0, 0, 0, 0
			} else {
				xs[2], xs[3], xs[4], xs[5], xs[6], xs[7] = 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
			}
		}
		nl[0], nl[1] = randomHalf(r)
		xs[0], xs[1] = randomHalf(r)
		if trial%7 == 0 {
			nl[1] |= 0x80 // negative d
			xs[1] |= 0x80
		}
		check(IQ4_NL, nl, refDequantIQ4NL(nl))
		check(IQ4_XS, xs, refDequantIQ4XS(xs))
	}
	// A row of several blocks decodes block by block.
	row := make([]byte, 3*BlockIQ4_XS)
	for i := range row {
		row[i] = byte(r.Uint32())
	}
	for b := 0; b < 3; b++ {
		row[b*BlockIQ4_XS], row[b*BlockIQ4_XS+1] = randomHalf(r)
	}
	got := make([]float32, 3*QKK)
	DequantizeRow(IQ4_XS, row, got)
	for b := 0; b < 3; b++ {
		want := refDequantIQ4XS(row[b*BlockIQ4_XS : (b+1)*BlockIQ4_XS])
		for i := range want {
			if math.Float32bits(got[b*QKK+i]) != math.Float32bits(want[i]) {
				t.Fatalf("IQ4_XS row block %d element %d = %g, want %g", b, i, got[b*QKK+i], want[i])
			}
		}
	}
}

// Hand-worked blocks: IQ4_NL with d = 0.5, nibbles 0 and 15 in byte 0
// (weights 0 and 16), and IQ4_XS with d = 0.25 whose sub-block 3 has scale
// 5 + 2·16 = 37 (multiplier 5) and sub-block 0 scale 0 (multiplier -32).
func TestIQ4Golden(t *testing.T) {
	nl := make([]byte, BlockIQ4_NL)
	nl[0], nl[1] = 0x00, 0x38 // 0.5
	for i := 2; i < BlockIQ4_NL; i++ {
		nl[i] = 0x88 // level 1 everywhere
	}
	nl[2] = 0xf0 // weight 0: level -127; weight 16: level 113
	want := filled(32, 0.5, map[int]float32{0: -63.5, 16: 56.5})
	checkGolden(t, IQ4_NL, nl, want)

	xs := make([]byte, BlockIQ4_XS)
	xs[0], xs[1] = 0x00, 0x34 // 0.25
	// scales: sub-blocks other than 0 and 3 get 32 (multiplier 0): low
	// nibble 0, high bits 2 (binary 10).
	var h uint16
	for ib := 0; ib < 8; ib++ {
		switch ib {
		case 0: // 0: low 0, high 0
		case 3: // 37 = 0b100101: low 5, high 2
			xs[4+ib/2] |= 5 << 4
			h |= 2 << (2 * ib)
		default:
			h |= 2 << (2 * ib)
		}
	}
	xs[2], xs[3] = byte(h), byte(h>>8)
	for i := 8; i < BlockIQ4_XS; i++ {
		xs[i] = 0x98 // low nibble level 1, high nibble level 13
	}
	want = make([]float32, QKK)
	for i := 0; i < 32; i++ {
		v := float32(1)
		if i >= 16 {
			v = 13
		}
		want[i] = 0.25 * -32 * v
		want[96+i] = 0.25 * 5 * v
	}
	checkGolden(t, IQ4_XS, xs, want)
	if got := IQ4XSScale(xs, 3); got != 37 {
		t.Errorf("IQ4XSScale(sub-block 3) = %d, want 37", got)
	}
}

// The quantizer picks, for its own scale, the nearest level for every
// weight: no weight is further from its decoded value than half the gap
// between the two levels around it (plus the scale's rounding).
func TestIQ4QuantNearest(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for _, typ := range []Type{IQ4_NL, IQ4_XS} {
		n := 4 * QKK
		x := gaussian(r, n, 1)
		q := make([]byte, typ.RowSize(n))
		QuantizeRow(typ, x, q)
		y := make([]float32, n)
		DequantizeRow(typ, q, y)
		bl, bs := typ.BlockLen(), typ.BlockSize()
		for i := range x {
			blk := q[i/bl*bs:]
			var s float64
			if typ == IQ4_NL {
				s = float64(f16(blk, 0))
			} else {
				s = float64(f16(blk, 0)) * float64(IQ4XSScale(blk, i%bl/32)-32)
			}
			// the largest error the nearest level can leave: half of the
			// widest gap (24) inside the table, or the distance past an end.
			v := float64(x[i]) / s
			lim := 12.0
			if v < -127 {
				lim = -127 - v
			} else if v > 113 {
				lim = v - 113
			}
			if d := math.Abs(float64(y[i]-x[i])) / math.Abs(s); d > lim+1e-3 {
				t.Fatalf("%v element %d: %g decoded as %g (scale %g): %g levels off", typ, i, x[i], y[i], s, d)
			}
		}
	}
}

// iq4Index is the nearest level, the lower one on a tie, for values across
// the table and past its ends.
func TestIQ4Index(t *testing.T) {
	for k := -600; k <= 600; k++ {
		v := float32(k) / 4
		best := 0
		for l := range refLevels {
			if math.Abs(float64(v-refLevels[l])) < math.Abs(float64(v-refLevels[best])) {
				best = l
			}
		}
		if got := iq4Index(v); int(got) != best {
			t.Fatalf("iq4Index(%g) = %d, want %d", v, got, best)
		}
	}
}

func TestIQ4IndexNearEnds(t *testing.T) {
	for _, v := range []float32{math.Nextafter32(113, 0), math.Nextafter32(-127, 0), -126.99, 112.9999, float32(math.NaN())} {
		_ = iq4Index(v) // must not panic
	}
	if got := iq4Index(math.Nextafter32(113, 0)); got != 15 {
		t.Errorf("iq4Index(just below 113) = %d, want 15", got)
	}
}
