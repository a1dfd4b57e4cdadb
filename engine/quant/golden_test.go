package quant

import (
	"testing"
)

// Hand-built blocks with values worked out by hand from the ggml layouts.
// Half floats used below: 0x3c00 = 1.0, 0x3800 = 0.5, 0x3400 = 0.25,
// 0xbc00 = -1.0, 0x4000 = 2.0 (stored little-endian: low byte first).

type part struct {
	off   int
	bytes []byte
}

// block returns size zero bytes with the given parts copied in at their offsets.
func block(size int, parts ...part) []byte {
	b := make([]byte, size)
	for _, p := range parts {
		copy(b[p.off:], p.bytes)
	}
	return b
}

// filled returns n copies of v with the given index → value overrides.
func filled(n int, v float32, at map[int]float32) []float32 {
	y := make([]float32, n)
	for i := range y {
		y[i] = v
	}
	for i, w := range at {
		y[i] = w
	}
	return y
}

func checkGolden(t *testing.T, typ Type, src []byte, want []float32) {
	t.Helper()
	got := make([]float32, len(want))
	DequantizeRow(typ, src, got)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%v: element %d = %g, want %g", typ, i, got[i], want[i])
		}
	}
}

func TestGoldenF32(t *testing.T) {
	// 0x3fc00000 = 1.5, 0xc1200000 = -10
	checkGolden(t, F32, []byte{0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x20, 0xc1}, []float32{1.5, -10})
}

func TestGoldenF16(t *testing.T) {
	checkGolden(t, F16, []byte{
		0x00, 0x3c, // 1
		0x00, 0xc0, // -2
		0x01, 0x00, // 2^-24, the smallest subnormal
		0x55, 0x35, // 0x3555: (1 + 341/1024) / 4 = 0.333251953125
	}, []float32{1, -2, 1.0 / (1 << 24), 0.333251953125})
}

func TestGoldenBF16(t *testing.T) {
	checkGolden(t, BF16, []byte{
		0x80, 0x3f, // 0x3f80 -> 0x3f800000 = 1
		0x40, 0xc0, // 0xc040 -> -3
		0x49, 0x40, // 0x4049 -> 0x40490000 = 3.140625
	}, []float32{1, -3, 3.140625})
}

// nibbles is qs[j] = j | (15-j)<<4: low nibbles 0..15 (elements 0..15),
// high nibbles 15..0 (elements 16..31).
var nibbles = []byte{
	0xf0, 0xe1, 0xd2, 0xc3, 0xb4, 0xa5, 0x96, 0x87,
	0x78, 0x69, 0x5a, 0x4b, 0x3c, 0x2d, 0x1e, 0x0f,
}

func TestGoldenQ4_0(t *testing.T) {
	// d = 0.5; x = (q - 8) * 0.5. Elements 0..15: q = 0..15 -> -4 .. 3.5;
	// elements 16..31: q = 15..0 -> 3.5 .. -4.
	src := append([]byte{0x00, 0x38}, nibbles...)
	checkGolden(t, Q4_0, src, []float32{
		-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5,
		3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5, -2, -2.5, -3, -3.5, -4,
	})
}

func TestGoldenQ4_1(t *testing.T) {
	// d = 0.5, m = -1; x = q * 0.5 - 1.
	src := append([]byte{0x00, 0x38, 0x00, 0xbc}, nibbles...)
	checkGolden(t, Q4_1, src, []float32{
		-1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5,
		6.5, 6, 5.5, 5, 4.5, 4, 3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, -1,
	})
}

func TestGoldenQ5_0(t *testing.T) {
	// d = 1; x = q - 16. qh = 0x80000001: fifth bit of elements 0 and 31.
	// qs[0] = 0x21: element 0 low nibble 1 (+16) -> 17-16 = 1; element 16 = 2 -> -14.
	// qs[15] = 0xf3: element 15 = 3 -> -13; element 31 = 15 (+16) -> 15.
	// Every other element is 0 -> -16.
	src := block(BlockQ5_0,
		part{0, []byte{0x00, 0x3c}},
		part{2, []byte{0x01, 0x00, 0x00, 0x80}},
		part{6, []byte{0x21}},
		part{6 + 15, []byte{0xf3}},
	)
	checkGolden(t, Q5_0, src, filled(32, -16, map[int]float32{0: 1, 16: -14, 15: -13, 31: 15}))
}

func TestGoldenQ5_1(t *testing.T) {
	// d = 0.5, m = 2; x = q * 0.5 + 2. qh = 0x00010000: fifth bit of element 16.
	// qs[0] = 0x3f: element 0 = 15 -> 9.5; element 16 = 3+16 = 19 -> 11.5.
	// Every other element is 0 -> 2.
	src := block(BlockQ5_1,
		part{0, []byte{0x00, 0x38, 0x00, 0x40}},
		part{4, []byte{0x00, 0x00, 0x01, 0x00}},
		part{8, []byte{0x3f}},
	)
	checkGolden(t, Q5_1, src, filled(32, 2, map[int]float32{0: 9.5, 16: 11.5}))
}

func TestGoldenQ8_0(t *testing.T) {
	// d = 0.25; qs = 1, -1, 127, -128, 4, 0... -> 0.25, -0.25, 31.75, -32, 1, 0...
	src := block(BlockQ8_0,
		part{0, []byte{0x00, 0x34}},
		part{2, []byte{0x01, 0xff, 0x7f, 0x80, 0x04}},
	)
	checkGolden(t, Q8_0, src, filled(32, 0, map[int]float32{0: 0.25, 1: -0.25, 2: 31.75, 3: -32, 4: 1}))
}

func TestGoldenQ8_1(t *testing.T) {
	// d = 0.5, s = 1.0 (unused by dequantization); qs[31] = -3 -> -1.5, qs[0] = 5 -> 2.5.
	src := block(BlockQ8_1,
		part{0, []byte{0x00, 0x38, 0x00, 0x3c}},
		part{4, []byte{0x05}},
		part{4 + 31, []byte{0xfd}},
	)
	checkGolden(t, Q8_1, src, filled(32, 0, map[int]float32{0: 2.5, 31: -1.5}))
}

func TestGoldenQ2_K(t *testing.T) {
	// d = 1, dmin = 0.5; sub-block k: x = (scales[k]&15)*q - 0.5*(scales[k]>>4).
	// Sub-block k of 16 takes its 2-bit values from qs[32*(k/8) + 16*(k%2) + l]
	// at bit 2*((k%8)/2).
	//   scales[0] = 0x21: x = q - 1 (elements 0..15, bits 0-1 of qs[0..15])
	//     qs[0] = 0xe7: bits 0-1 = 3 -> element 0 = 2 (bits 2-7 go to sub-blocks 2, 4, 6: scale 0)
	//     qs[1] = 0x02: element 1 = 1; the rest of sub-block 0 has q = 0 -> -1
	//   scales[1] = 0x03: x = 3q (elements 16..31, qs[16..31] bits 0-1)
	//     qs[16] = 0x03: element 16 = 9; the rest 0
	//   scales[15] = 0xf5: x = 5q - 7.5 (elements 240..255, qs[48..63] bits 6-7)
	//     qs[63] = 0xc0: element 255 = 15 - 7.5 = 7.5; the rest -7.5
	// All other scales are 0, so all other elements are 0.
	src := block(BlockQ2_K,
		part{0, []byte{0x21, 0x03}},
		part{15, []byte{0xf5}},
		part{16 + 0, []byte{0xe7, 0x02}},
		part{16 + 16, []byte{0x03}},
		part{16 + 63, []byte{0xc0}},
		part{80, []byte{0x00, 0x3c, 0x00, 0x38}},
	)
	want := filled(256, 0, map[int]float32{0: 2, 1: 1, 16: 9, 255: 7.5})
	for i := 2; i < 16; i++ {
		want[i] = -1
	}
	for i := 240; i < 255; i++ {
		want[i] = -7.5
	}
	checkGolden(t, Q2_K, src, want)
}

func TestGoldenQ3_K(t *testing.T) {
	// d = 1; sub-block k: x = (s_k - 32) * (q - (hbit ? 0 : 4)), q from qs like Q2_K,
	// hbit = hmask[l] bit (4*(k/8) + (k%8)/2) with l the same 0..31 index.
	// Scales (6-bit, low nibbles in bytes 0..7 (k<8) or their high nibble (k>=8),
	// top 2 bits in byte 8 + k%4 at bit 2*(k/4)):
	//   all s_k = 32 (low 0, top 2 -> bytes 8..11 = 0xaa) except
	//   s_0 = 33:  byte 0 = 0x01                          -> scale +1
	//   s_1 = 30:  byte 1 = 0x0e, byte 9 bits 0-1 = 1 (0xa9) -> scale -2
	//   s_15 = 63: byte 7 high nibble = 0xf, byte 11 bits 6-7 = 3 (0xea) -> scale +31
	// Sub-block 0: qs[0] = 0x03 and hmask[0] bit 0 set -> element 0 = 1*3 = 3;
	//   the rest have q = 0, no hbit -> -4 -> 1*-4 = -4.
	// Sub-block 1: qs[16] = 0x02, hmask[16] bit 0 -> element 16 = -2*2 = -4; rest -2*-4 = 8.
	// Sub-block 15: qs[63] bits 6-7 = 1, hmask[31] bit 7 -> element 255 = 31*1 = 31;
	//   rest 31*-4 = -124.
	// All other sub-blocks have scale 0 -> 0.
	src := block(BlockQ3_K,
		part{0, []byte{0x01}},
		part{16, []byte{0x01}},
		part{31, []byte{0x80}},
		part{32 + 0, []byte{0x03}},
		part{32 + 16, []byte{0x02}},
		part{32 + 63, []byte{0x40}},
		part{96, []byte{0x01, 0x0e, 0, 0, 0, 0, 0, 0xf0, 0xaa, 0xa9, 0xaa, 0xea}},
		part{108, []byte{0x00, 0x3c}},
	)
	want := filled(256, 0, nil)
	for i := 0; i < 16; i++ {
		want[i] = -4
		want[16+i] = 8
		want[240+i] = -124
	}
	want[0], want[16], want[255] = 3, -4, 31
	checkGolden(t, Q3_K, src, want)
}

func TestGoldenQ4_K(t *testing.T) {
	// d = 1, dmin = 0.5; sub-block j (32 elements): x = d*sc_j*q - dmin*m_j, with q the
	// low (j even) or high (j odd) nibble of qs[32*(j/2) + l].
	// scales = 42 00 00 c0 03 00 00 c0 51 00 00 ff:
	//   j=0: sc = 0x42&63 = 2, m = 0x03&63 = 3     -> x = 2q - 1.5
	//   j=4: sc = (0x51&15) | (0x42>>6)<<4 = 17, m = (0x51>>4) | (0x03>>6)<<4 = 5 -> x = 17q - 2.5
	//   j=7: sc = (0xff&15) | (0xc0>>6)<<4 = 63, m = (0xff>>4) | (0xc0>>6)<<4 = 63 -> x = 63q - 31.5
	//   all other sc, m = 0.
	// qs[0] = 0x07: element 0 = 2*7 - 1.5 = 12.5 (element 32: high nibble 0, scale 0 -> 0)
	// qs[64] = 0x01: element 128 = 17 - 2.5 = 14.5
	// qs[127] = 0xf0: element 255 = 63*15 - 31.5 = 913.5 (element 223: low nibble 0, scale 0 -> 0)
	src := block(BlockQ4_K,
		part{0, []byte{0x00, 0x3c, 0x00, 0x38}},
		part{4, []byte{0x42, 0x00, 0x00, 0xc0, 0x03, 0x00, 0x00, 0xc0, 0x51, 0x00, 0x00, 0xff}},
		part{16 + 0, []byte{0x07}},
		part{16 + 64, []byte{0x01}},
		part{16 + 127, []byte{0xf0}},
	)
	want := filled(256, 0, nil)
	for i := 0; i < 32; i++ {
		want[i] = -1.5
		want[128+i] = -2.5
		want[224+i] = -31.5
	}
	want[0], want[128], want[255] = 12.5, 14.5, 913.5
	checkGolden(t, Q4_K, src, want)
}

func TestGoldenQ5_K(t *testing.T) {
	// d = 0.5, dmin = 1; as Q4_K plus a fifth bit: element 32*j + l gets +16 when
	// qh[l] bit j is set.
	// scales = 04 02 00 00 01 00 00 00 00 00 01 00:
	//   j=0: sc 4, m 1 -> x = 2q - 1;  j=1: sc 2, m 0 -> x = q
	//   j=6: sc = (0x01&15) | (0x00>>6)<<4 = 1, m = 0 -> x = 0.5q
	// qs[0] = 0x52, qh[0] = 0x03: element 0 = 2+16 -> 35; element 32 = 5+16 -> 21
	// qs[1] = 0x0f: element 1 = 15 -> 29; element 33 = 0
	// qh[5] = 0x40: element 192+5 = 197 = 0+16 -> 8
	// The rest of sub-block 0 is -1, everything else 0.
	src := block(BlockQ5_K,
		part{0, []byte{0x00, 0x38, 0x00, 0x3c}},
		part{4, []byte{0x04, 0x02, 0, 0, 0x01, 0, 0, 0, 0, 0, 0x01, 0}},
		part{16 + 0, []byte{0x03}},
		part{16 + 5, []byte{0x40}},
		part{48 + 0, []byte{0x52, 0x0f}},
	)
	want := filled(256, 0, nil)
	for i := 0; i < 32; i++ {
		want[i] = -1
	}
	want[0], want[1], want[32], want[197] = 35, 29, 21, 8
	checkGolden(t, Q5_K, src, want)
}

func TestGoldenQ6_K(t *testing.T) {
	// d = 0.5; x = d * scales[k] * (q - 32), k = element/16, with q = 4 bits from ql
	// and 2 from qh. In each 128-element half h (ql += 64h, qh += 32h), for l < 32:
	//   element l      : ql[l] low,     qh[l] bits 0-1
	//   element l + 32 : ql[l+32] low,  qh[l] bits 2-3
	//   element l + 64 : ql[l] high,    qh[l] bits 4-5
	//   element l + 96 : ql[l+32] high, qh[l] bits 6-7
	// scales: [0] = 2, [2] = -1, [15] = 127, the rest 0.
	// ql[0] = 0x05, qh[0] = 0x02: element 0: q = 5 | 2<<4 = 37 -> 0.5*2*5 = 5;
	//   the rest of sub-block 0: q = 0 -> 0.5*2*-32 = -32.
	// ql[32] = 0x0a: element 32: q = 10 (qh[0] bits 2-3 = 0) -> 0.5*-1*-22 = 11;
	//   the rest of sub-block 2: 0.5*-1*-32 = 16.
	// ql[127] = 0xf0, qh[63] = 0xc0: element 255: q = 15 | 3<<4 = 63 -> 0.5*127*31 = 1968.5;
	//   the rest of sub-block 15: 0.5*127*-32 = -2032.
	src := block(BlockQ6_K,
		part{0, []byte{0x05}},
		part{32, []byte{0x0a}},
		part{127, []byte{0xf0}},
		part{128, []byte{0x02}},
		part{128 + 63, []byte{0xc0}},
		part{192, []byte{0x02, 0x00, 0xff}},
		part{192 + 15, []byte{0x7f}},
		part{208, []byte{0x00, 0x38}},
	)
	want := filled(256, 0, nil)
	for i := 0; i < 16; i++ {
		want[i] = -32
		want[32+i] = 16
		want[240+i] = -2032
	}
	want[0], want[32], want[255] = 5, 11, 1968.5
	checkGolden(t, Q6_K, src, want)
}

func TestGoldenQ8_K(t *testing.T) {
	// d = 0.125 (float32 0x3e000000); qs[0] = 8 -> 1, qs[1] = -16 -> -2, qs[255] = 127 -> 15.875.
	// bsums (unused here) = -8, 0, ..., 127.
	src := block(BlockQ8_K,
		part{0, []byte{0x00, 0x00, 0x00, 0x3e}},
		part{4, []byte{0x08, 0xf0}},
		part{4 + 255, []byte{0x7f}},
		part{260, []byte{0xf8, 0xff}},
		part{260 + 30, []byte{0x7f, 0x00}},
	)
	checkGolden(t, Q8_K, src, filled(256, 0, map[int]float32{0: 1, 1: -2, 255: 15.875}))
}
