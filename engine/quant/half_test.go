package quant

import (
	"math"
	"testing"
)

func TestFP16ToFP32Known(t *testing.T) {
	cases := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0},
		{0x3c00, 1},
		{0x3800, 0.5},
		{0xc000, -2},
		{0x3555, 0.333251953125},        // 0x155/1024 = 341/1024; (1+341/1024)/4
		{0x7bff, 65504},                 // largest finite
		{0x0400, 1.0 / (1 << 14)},       // smallest normal 2^-14
		{0x0001, 1.0 / (1 << 24)},       // smallest subnormal 2^-24
		{0x03ff, 1023.0 / (1 << 24)},    // largest subnormal
		{0x8001, -1.0 / (1 << 24)},      // negative subnormal
		{0x7c00, float32(math.Inf(1))},  // +inf
		{0xfc00, float32(math.Inf(-1))}, // -inf
	}
	for _, c := range cases {
		if got := FP16ToFP32(c.h); got != c.want {
			t.Errorf("FP16ToFP32(%#04x) = %g, want %g", c.h, got, c.want)
		}
	}
	if b := math.Float32bits(FP16ToFP32(0x8000)); b != 0x80000000 {
		t.Errorf("FP16ToFP32(0x8000) bits = %#x, want -0", b)
	}
	for _, h := range []uint16{0x7c01, 0x7e00, 0xfe00, 0x7fff, 0x7d55} {
		f := FP16ToFP32(h)
		b := math.Float32bits(f)
		if !math.IsNaN(float64(f)) || b&0x00400000 == 0 || b>>31 != uint32(h>>15) {
			t.Errorf("FP16ToFP32(%#04x) = %#x, want a quiet NaN of the same sign", h, b)
		}
		if b&0x3fe000 != uint32(h&0x1ff)<<13 {
			t.Errorf("FP16ToFP32(%#04x) = %#x lost the payload", h, b)
		}
	}
}

// Every finite half survives float32 and back; NaNs stay NaNs of the same sign.
func TestFP16RoundTripAll(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got := FP32ToFP16(FP16ToFP32(h))
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 || got&0x8000 != h&0x8000 {
				t.Errorf("NaN %#04x came back as %#04x", h, got)
			}
			continue
		}
		if got != h {
			t.Errorf("%#04x came back as %#04x", h, got)
		}
	}
}

// For every pair of neighbouring finite halves a < b, the float32 midpoint
// rounds to the one with an even mantissa and the float32s just beside it
// round to the nearer one. This covers subnormals, the subnormal/normal
// boundary and every binade.
func TestFP32ToFP16Ties(t *testing.T) {
	for h := uint16(0); h < 0x7bff; h++ {
		a, b := FP16ToFP32(h), FP16ToFP32(h+1)
		mid := float32((float64(a) + float64(b)) / 2) // exact: needs 12 significant bits
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		if got := FP32ToFP16(mid); got != even {
			t.Fatalf("tie %g between %#04x and %#04x -> %#04x, want %#04x", mid, h, h+1, got, even)
		}
		if got := FP32ToFP16(math.Nextafter32(mid, 0)); got != h {
			t.Fatalf("just below tie %g -> %#04x, want %#04x", mid, got, h)
		}
		if got := FP32ToFP16(math.Nextafter32(mid, 1e9)); got != h+1 {
			t.Fatalf("just above tie %g -> %#04x, want %#04x", mid, got, h+1)
		}
		// Negative values are symmetric.
		if got := FP32ToFP16(-mid); got != even|0x8000 {
			t.Fatalf("tie %g -> %#04x, want %#04x", -mid, got, even|0x8000)
		}
	}
}

func TestFP32ToFP16Special(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		f    float32
		want uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},
		{65519.99, 0x7bff},        // below the tie with 65536
		{65520, 0x7c00},           // tie between 0x7bff (odd) and 2^16: even is inf
		{1e6, 0x7c00},             // overflow
		{-1e6, 0xfc00},            // overflow
		{inf, 0x7c00},             //
		{-inf, 0xfc00},            //
		{1.0 / (1 << 25), 0x0000}, // half the smallest subnormal: tie to even (0)
		{3.0 / (1 << 25), 0x0002}, // 1.5 subnormal units: tie to even (2)
		{1.0 / (1 << 26), 0x0000}, // a quarter unit
		{1e-30, 0x0000},           // far below
		{-1e-30, 0x8000},          // keeps the sign
		{math.SmallestNonzeroFloat32, 0x0000},
		{2047.0 / (1 << 25), 0x0400}, // 1023.5 units: rounds up into the smallest normal
		{0.1, 0x2e66},                // 0.1 -> 0.0999755859375
		{0.333333333, 0x3555},
	}
	for _, c := range cases {
		if got := FP32ToFP16(c.f); got != c.want {
			t.Errorf("FP32ToFP16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	for _, bits := range []uint32{0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0xff812345} {
		got := FP32ToFP16(math.Float32frombits(bits))
		if got&0x7c00 != 0x7c00 || got&0x3ff == 0 || got&0x200 == 0 || uint32(got>>15) != bits>>31 {
			t.Errorf("FP32ToFP16(NaN %#x) = %#04x, want a quiet NaN of the same sign", bits, got)
		}
	}
}

func TestBF16(t *testing.T) {
	if got := BF16ToFP32(0x3f80); got != 1 {
		t.Errorf("BF16ToFP32(0x3f80) = %g", got)
	}
	if got := BF16ToFP32(0x4049); got != 3.140625 {
		t.Errorf("BF16ToFP32(0x4049) = %g", got)
	}
	if got := BF16ToFP32(0xc040); got != -3 {
		t.Errorf("BF16ToFP32(0xc040) = %g", got)
	}
	cases := []struct {
		bits uint32 // float32 input
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // tie, 0x3f80 is even
		{0x3f818000, 0x3f82}, // tie, rounds up to even
		{0x3f808001, 0x3f81}, // just above the tie
		{0x3f807fff, 0x3f80}, // just below the tie
		{0xbf808001, 0xbf81}, // negative
		{0x00010000, 0x0001}, // subnormal kept, not flushed
		{0x00008000, 0x0000}, // subnormal tie to even zero
		{0x00018000, 0x0002}, // subnormal tie to even
		{0x7f7fffff, 0x7f80}, // max float rounds to inf
		{0x7f800000, 0x7f80}, // +inf
		{0xff800000, 0xff80}, // -inf
		{0x80000000, 0x8000}, // -0
		{0x7f800001, 0x7fc0}, // signalling NaN with a payload only in the low bits: quiet bit forced
		{0xff812345, 0xffc1}, // negative NaN keeps the top payload bits
		{0x7fc00000, 0x7fc0}, // quiet NaN
	}
	for _, c := range cases {
		if got := FP32ToBF16(math.Float32frombits(c.bits)); got != c.want {
			t.Errorf("FP32ToBF16(%#08x) = %#04x, want %#04x", c.bits, got, c.want)
		}
	}
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		if h&0x7f80 == 0x7f80 && h&0x7f != 0 {
			continue // NaNs get the quiet bit
		}
		if got := FP32ToBF16(BF16ToFP32(h)); got != h {
			t.Fatalf("bf16 %#04x came back as %#04x", h, got)
		}
	}
}
