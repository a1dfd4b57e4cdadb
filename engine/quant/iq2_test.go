package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// The IQ2 tests check the codebooks against the format's tables and the
// dequantizer against a second, deliberately plain reading of the format
// description (ggml-common.h block_iq2_xxs, block_iq2_xs and block_iq2_s,
// ggml-quants.c dequantize_row_iq2_*), written without the package's
// helpers: fields by byte offset, weight by weight, the eighth sign counted
// from the other seven.

// The expanded codebooks are, byte for byte, ggml's iq2xxs_grid,
// iq2xs_grid and iq2s_grid (their uint64 entries stored little-endian): the
// SHA-256 of each table, and a few of its entries as ggml-common.h writes
// them.
func TestIQ2Grids(t *testing.T) {
	for _, c := range []struct {
		name  string
		grid  [][8]uint8
		keys  []uint16
		sha   string
		spots map[int]uint64
	}{
		{"IQ2XXSGrid", IQ2XXSGrid[:], iq2xxsKeys[:], "05826b5d3e472a3a78f196be62ac78acf81df0f909626e12ab9fa2a5d490dd54",
			map[int]uint64{0: 0x0808080808080808, 1: 0x080808080808082b, 77: 0x08190808192b0808, 255: 0x2b2b2b1908081908}},
		{"IQ2XSGrid", IQ2XSGrid[:], iq2xsKeys[:], "06e47aaca60b4dc1d9b5a3f34540437058a6b142b4d7a59d5ded769b4d1bf1de",
			map[int]uint64{0: 0x0808080808080808, 1: 0x080808080808082b, 100: 0x0808192b08081908,
				255: 0x1908080808081908, 511: 0x2b2b2b2b2b2b2b2b}},
		{"IQ2SGrid", IQ2SGrid[:], iq2sKeys[:], "e1aa1473412b0552c2174c30ef22ab4073f6a181b85a17056e8249bd2932fd88",
			map[int]uint64{0: 0x0808080808080808, 1: 0x080808080808082b, 77: 0x0808082b2b081919,
				255: 0x081908191919082b, 1023: 0x2b2b2b2b2b2b2b2b}},
	} {
		var raw []byte
		for _, pt := range c.grid {
			raw = append(raw, pt[:]...)
		}
		checkTable(t, c.name, raw, 8, c.sha, c.spots)
		checkKeys(t, c.name, c.keys, noLevel3)
	}
	// ksigns_iq2xs: the 7 bits, and the parity above them.
	for i, want := range map[int]uint8{0: 0, 1: 129, 2: 130, 3: 3, 7: 135, 64: 192, 100: 228, 126: 126, 127: 255} {
		if IQ2Signs[i] != want {
			t.Errorf("IQ2Signs[%d] = %d, want %d", i, IQ2Signs[i], want)
		}
	}
}

// refSign is -1 when weight j of a group with sign index si is negative:
// bits 0-6 of si are weights 0-6; weight 7 is negative when an odd number
// of them are.
func refSign(si int, j int) float64 {
	neg := 0
	if j < 7 {
		neg = si >> j & 1
	} else {
		for b := 0; b < 7; b++ {
			neg += si >> b & 1
		}
		neg %= 2
	}
	if neg == 1 {
		return -1
	}
	return 1
}

func refDequantIQ2XS(blk []byte) []float32 {
	d := float64(refHalf(blk[0], blk[1]))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		g := i / 8
		q := int(blk[2+2*g]) + 256*int(blk[3+2*g])
		index, si := q%512, q/512
		sc := int(blk[66+i/32])
		if i%32 < 16 {
			sc %= 16
		} else {
			sc /= 16
		}
		m := float64(IQ2XSGrid[index][i%8])
		// every product here is exact in float32 (d has 11 significant
		// bits, 0.5+s 5, the magnitude 6)
		y[i] = float32(d * (0.5 + float64(sc)) / 4 * m * refSign(si, i%8))
	}
	return y
}

func refDequantIQ2XXS(blk []byte) []float32 {
	d := float64(refHalf(blk[0], blk[1]))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		ib, l := i/32, i%32/8
		c := blk[2+8*ib : 2+8*ib+8]
		aux := int(c[4]) + 256*int(c[5]) + 65536*int(c[6]) + 16777216*int(c[7])
		si, sc := aux>>(7*l)%128, aux>>28
		m := float64(IQ2XXSGrid[c[l]][i%8])
		y[i] = float32(d * (0.5 + float64(sc)) / 4 * m * refSign(si, i%8))
	}
	return y
}

func refDequantIQ2S(blk []byte) []float32 {
	d := float64(refHalf(blk[0], blk[1]))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		g, j := i/8, i%8
		index := int(blk[2+g]) + 256*(int(blk[66+g/4])>>(2*(g%4))%4)
		sign := 1.0
		if blk[34+g]>>j&1 == 1 {
			sign = -1
		}
		sc := int(blk[74+i/32])
		if i%32 < 16 {
			sc %= 16
		} else {
			sc /= 16
		}
		m := float64(IQ2SGrid[index][j])
		y[i] = float32(d * (0.5 + float64(sc)) / 4 * m * sign)
	}
	return y
}

// iqRefs are the IQ2 and IQ3 types with their plain readings (the IQ3
// ones in iq3_test.go); the tests below check them all.
var iqRefs = []iqRef{{IQ2_XXS, refDequantIQ2XXS}, {IQ2_XS, refDequantIQ2XS}, {IQ2_S, refDequantIQ2S},
	{IQ3_XXS, refDequantIQ3XXS}, {IQ3_S, refDequantIQ3S}}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// Random blocks (every index, sign index and scale; d of either sign,
// normal or subnormal) decode bit for bit as the plain reading does, one
// block and a row of several.
func TestIQCodebookDequantReference(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, c := range iqRefs {
		bs := c.typ.BlockSize()
		for trial := 0; trial < 2000; trial++ {
			blk := make([]byte, bs)
			for i := range blk {
				blk[i] = byte(r.Uint32())
			}
			blk[0], blk[1] = randomHalf(r)
			if trial%5 == 1 {
				for i := 2; i < bs; i++ {
					blk[i] = 0xff // every scale 15, the last points
				}
			}
			want := c.ref(blk)
			got := make([]float32, QKK)
			DequantizeRow(c.typ, blk, got)
			for i := range want {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("%v block % x: element %d = %g, want %g", c.typ, blk, i, got[i], want[i])
				}
			}
		}
		row := make([]byte, 3*bs)
		for i := range row {
			row[i] = byte(r.Uint32())
		}
		for b := 0; b < 3; b++ {
			row[b*bs], row[b*bs+1] = randomHalf(r)
		}
		got := make([]float32, 3*QKK)
		DequantizeRow(c.typ, row, got)
		for b := 0; b < 3; b++ {
			want := c.ref(row[b*bs : (b+1)*bs])
			for i := range want {
				if !sameBits(got[b*QKK+i], want[i]) {
					t.Fatalf("%v row block %d element %d = %g, want %g", c.typ, b, i, got[b*QKK+i], want[i])
				}
			}
		}
	}
}

// A hand-worked block: d = 1, every scale 0 (multiplier 0.5·0.25 = 1/8)
// and every group point 0 (all magnitudes 8) with no signs, so every
// weight is 1; but
//   - scales[1] = 0x21: weights 32..47 have multiplier 1.5/4 = 0.375,
//     weights 48..63 2.5/4 = 0.625;
//   - group 5 (weights 40..47) is point 1 (43, then seven 8s) with sign
//     index 3: weights 40 and 41 negative (two: no parity sign);
//   - group 31 (weights 248..255) is point 100 (8 25 8 8 43 25 8 8) with
//     sign index 1: weight 248, and weight 255 for the parity.
func TestIQ2Golden(t *testing.T) {
	blk := make([]byte, BlockIQ2_XS)
	blk[0], blk[1] = 0x00, 0x3c // 1.0
	blk[66+1] = 0x21
	binary.LittleEndian.PutUint16(blk[2+2*5:], 1|3<<9)
	binary.LittleEndian.PutUint16(blk[2+2*31:], 100|1<<9)
	want := filled(QKK, 1, nil)
	for i := 32; i < 48; i++ {
		want[i] = 3 // 0.375 · 8
	}
	for i := 48; i < 64; i++ {
		want[i] = 5 // 0.625 · 8
	}
	want[40], want[41] = -16.125, -3 // -0.375·43, -0.375·8
	copy(want[248:], []float32{-1, 3.125, 1, 1, 5.375, 3.125, 1, -1})
	checkGolden(t, IQ2_XS, blk, want)
}

// IQ2_XXS by hand: d = 1 and all other bytes 0 (point 0, all 8s; no
// signs; s = 0, multiplier 1/8) make every weight 1; weights 64..95 get
// s = 3 (7/8: 7) and their group 1 (weights 72..79) is point 77 (8 8 43
// 25 8 8 25 8) with sign index 5: weights 72 and 74 negative.
func TestIQ2XXSGolden(t *testing.T) {
	blk := make([]byte, BlockIQ2_XXS)
	blk[0], blk[1] = 0x00, 0x3c
	c := blk[2+8*2:]
	c[1] = 77
	binary.LittleEndian.PutUint32(c[4:], 5<<7|3<<28)
	want := filled(QKK, 1, nil)
	for i := 64; i < 96; i++ {
		want[i] = 7
	}
	copy(want[72:], []float32{-7, 7, -37.625, 21.875, 7, 7, 21.875, 7})
	checkGolden(t, IQ2_XXS, blk, want)
}

// IQ2_S by hand: d = 1 and all other bytes 0 make every weight 1; weights
// 64..79 get s = 2 (5/8: 5) and their group 9 (weights 72..79) is point
// 1023 (all 43s: index 0xff in qs[9], 3 in bits 2-3 of qh[2]) with sign
// byte 1: only weight 72 negative (IQ2_S keeps all 8 signs).
func TestIQ2SGolden(t *testing.T) {
	blk := make([]byte, BlockIQ2_S)
	blk[0], blk[1] = 0x00, 0x3c
	blk[2+9] = 0xff
	blk[66+2] = 3 << 2
	blk[34+9] = 0x01
	blk[74+2] = 0x02
	want := filled(QKK, 1, nil)
	for i := 64; i < 72; i++ {
		want[i] = 5
	}
	for i := 72; i < 80; i++ {
		want[i] = 26.875 // 5/8 · 43
	}
	want[72] = -26.875
	checkGolden(t, IQ2_S, blk, want)
}

// Garbage blocks: decoding never panics and agrees with the plain reading
// (NaN where d is NaN, infinities where d is infinite); quantizing rows of
// any float32 values (NaN, infinities, huge, tiny) never panics and writes
// blocks that decode to finite weights.
func FuzzIQCodebook(f *testing.F) {
	f.Add(make([]byte, BlockIQ3_S))
	f.Add([]byte{0x00, 0x7c, 1, 2, 3})       // d = +Inf
	f.Add([]byte{0x01, 0x7e, 0xff, 0xff, 9}) // d = NaN
	f.Add([]byte{0xff, 0x7b, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x7f, 0x80, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) { fuzzIQ(t, iqRefs, data) })
}

// The special float inputs the fuzz corpus may not reach, every run.
func TestIQCodebookQuantSpecial(t *testing.T) { checkQuantSpecial(t, iqRefs) }

// The quantizers keep the signs of every group of Gaussian weights, but
// for the one flip that an odd number of negatives forces in IQ2_XXS,
// IQ2_XS and IQ3_XXS (IQ2_S and IQ3_S store all 8 signs).
func TestIQCodebookQuantSigns(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	x := gaussian(r, 8*QKK, 1)
	for _, c := range iqRefs {
		q := make([]byte, c.typ.RowSize(len(x)))
		QuantizeRow(c.typ, x, q)
		y := make([]float32, len(x))
		DequantizeRow(c.typ, q, y)
		most := 1
		if c.typ == IQ2_S || c.typ == IQ3_S {
			most = 0
		}
		for g := 0; g < len(x)/8; g++ {
			flips := 0
			for j := 8 * g; j < 8*g+8; j++ {
				if (x[j] < 0) != (y[j] < 0) {
					flips++
				}
			}
			if flips > most {
				t.Fatalf("%v group %d: %d signs changed: %v -> %v", c.typ, g, flips, x[8*g:8*g+8], y[8*g:8*g+8])
			}
		}
	}
}
