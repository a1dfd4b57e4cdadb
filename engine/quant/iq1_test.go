package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// The IQ1 tests check the codebook against the format's table and the
// dequantizers against a second, deliberately plain reading of the format
// description (ggml-common.h block_iq1_s and block_iq1_m, ggml-quants.c
// dequantize_row_iq1_s and _m), written without the package's helpers:
// fields by byte offset, weight by weight, in float64.

// The expanded codebook is, byte for byte, ggml's iq1s_grid (its uint64
// entries stored little-endian, each byte an int8 of -1, 0 or 1): the
// SHA-256 of the table, and a few of its entries as ggml-common.h writes
// them.
func TestIQ1Grid(t *testing.T) {
	var raw []byte
	for _, pt := range IQ1Grid {
		for _, v := range pt {
			raw = append(raw, byte(v))
		}
	}
	checkTable(t, "IQ1Grid", raw, 8, "07540ffc1aeaf6ad4d97e96b0fcc765aae39671d4ae4a27bbd0e796fde167c6a",
		map[int]uint64{0: 0xffffffffffffffff, 1: 0xffffffffffffff01, 2: 0xffffffffffff0000,
			100: 0xffff000000000000, 777: 0x00ff000100000000, 1024: 0x0000000000ff0100, 2046: 0x01010101010101ff,
			2047: 0x0101010101010101})
	checkKeys(t, "IQ1", iq1Keys[:], noLevel3)
}

// refIQ1Value is value j of codebook point index, read from the key list
// (digit j of the key, minus 1).
func refIQ1Value(index, j int) float64 {
	return float64(int(iq1Keys[index])>>(2*j)%4) - 1
}

func refDequantIQ1S(blk []byte) []float32 {
	d := float64(refHalf(blk[0], blk[1]))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		ib, l, j := i/32, i%32/8, i%8
		qh := int(blk[34+2*ib]) + 256*int(blk[35+2*ib])
		index := int(blk[2+4*ib+l]) + 256*(qh>>(3*l)%8)
		s := qh >> 12 % 8
		delta := 0.125
		if qh >= 0x8000 {
			delta = -0.125
		}
		// exact in float32 but for the one rounding: d has 11
		// significant bits, 2s+1 4, the shifted value 4
		y[i] = float32(d * float64(2*s+1) * (refIQ1Value(index, j) + delta))
	}
	return y
}

func refDequantIQ1M(blk []byte) []float32 {
	sc := func(k int) int { return int(blk[48+2*k]) + 256*int(blk[49+2*k]) }
	h := sc(0)/4096 + 16*(sc(1)/4096) + 256*(sc(2)/4096) + 4096*(sc(3)/4096)
	d := float64(refHalf(byte(h), byte(h>>8)))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		ib, l, j := i/32, i%32/8, i%8
		q := int(blk[32+2*ib+l/2])
		if l%2 == 1 {
			q /= 16
		}
		q %= 16
		index := int(blk[4*ib+l]) + 256*(q%8)
		delta := 0.125
		if q >= 8 {
			delta = -0.125
		}
		// ggml: ls1 for groups 0 and 1 of the 32, ls2 for 2 and 3
		shift := 6 * (ib % 2)
		if l >= 2 {
			shift += 3
		}
		s := sc(ib/2) >> shift % 8
		y[i] = float32(d * float64(2*s+1) * (refIQ1Value(index, j) + delta))
	}
	return y
}

var iq1Refs = []iqRef{{IQ1_S, refDequantIQ1S}, {IQ1_M, refDequantIQ1M}}

// randomIQ1Block fills blk with random bytes and a finite random d (either
// sign, normal or subnormal); every fifth block has all bits set but d's
// (every scale 7, the last points, negative deltas).
func randomIQ1Block(r *rand.Rand, typ Type, blk []byte, trial int) {
	for i := range blk {
		blk[i] = byte(r.Uint32())
		if trial%5 == 1 {
			blk[i] = 0xff
		}
	}
	lo, hi := randomHalf(r)
	h := uint16(lo) | uint16(hi)<<8
	if typ == IQ1_S {
		blk[0], blk[1] = lo, hi
		return
	}
	for k := 0; k < 4; k++ {
		blk[49+2*k] = blk[49+2*k]&0x0f | byte(h>>(4*k)&0xf)<<4
	}
}

// Random blocks decode bit for bit as the plain reading does, one block
// and a row of several.
func TestIQ1DequantReference(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, c := range iq1Refs {
		bs := c.typ.BlockSize()
		for trial := 0; trial < 3000; trial++ {
			blk := make([]byte, bs)
			randomIQ1Block(r, c.typ, blk, trial)
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
		for b := 0; b < 3; b++ {
			randomIQ1Block(r, c.typ, row[b*bs:(b+1)*bs], 0)
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

// IQ1_S by hand: d = 1 and all other bytes 0 (point 0, all -1; s = 0,
// multiplier 1; delta +1/8) make every weight -0.875; but
//   - qh[1] = 4<<6 | 3<<12 | 0x8000: weights 32..63 get s = 3 (7) and
//     delta -1/8 (-7.875), and their group 2 (weights 48..55) is point
//     1024 (0 1 -1 0 0 0 0 0: 4 in bits 6-8 of qh[1], 0 in qs[6]);
//   - qs[31] = 1: weights 248..255 are point 1 (1, then seven -1s).
func TestIQ1SGolden(t *testing.T) {
	blk := make([]byte, BlockIQ1_S)
	blk[0], blk[1] = 0x00, 0x3c
	binary.LittleEndian.PutUint16(blk[34+2:], 4<<6|3<<12|0x8000)
	blk[2+31] = 1
	want := filled(QKK, -0.875, nil)
	for i := 32; i < 64; i++ {
		want[i] = -7.875
	}
	copy(want[48:], []float32{-0.875, 6.125, -7.875, -0.875, -0.875, -0.875, -0.875, -0.875})
	want[248] = 1.125
	checkGolden(t, IQ1_S, blk, want)
}

// IQ1_M by hand: d = 1 (0x3c00: nibble 0xc atop scales[2], 0x3 atop
// scales[3]) and all other bytes 0 make every weight -0.875; weights
// 80..95 (h = 5) get s = 2 (5: bits 3-5 of scales[1]), and their group 11
// (weights 88..95) is point 777 (0 0 0 0 1 0 -1 0: 9 in qs[11], 3 in the
// high nibble of qh[5]) with delta -1/8 (bit 3 of that nibble).
func TestIQ1MGolden(t *testing.T) {
	blk := make([]byte, BlockIQ1_M)
	binary.LittleEndian.PutUint16(blk[48+2:], 2<<3)
	binary.LittleEndian.PutUint16(blk[48+4:], 0xc000)
	binary.LittleEndian.PutUint16(blk[48+6:], 0x3000)
	blk[11] = 9
	blk[32+5] = (3 | 8) << 4
	if got := IQ1MScale(blk); got != 0x3c00 {
		t.Fatalf("IQ1MScale = %#04x, want 0x3c00", got)
	}
	want := filled(QKK, -0.875, nil)
	for i := 80; i < 88; i++ {
		want[i] = -4.375
	}
	copy(want[88:], []float32{-0.625, -0.625, -0.625, -0.625, 4.375, -0.625, -5.625, -0.625})
	checkGolden(t, IQ1_M, blk, want)
}

// Garbage blocks: decoding never panics and agrees with the plain reading
// (NaN where d is NaN, infinities where d is infinite); quantizing rows of
// any float32 values (NaN, infinities, huge, tiny) never panics and writes
// blocks that decode to finite weights.
func FuzzIQ1(f *testing.F) {
	f.Add(make([]byte, BlockIQ1_M))
	f.Add([]byte{0x00, 0x7c, 1, 2, 3})       // IQ1_S d = +Inf
	f.Add([]byte{0x01, 0x7e, 0xff, 0xff, 9}) // IQ1_S d = NaN
	f.Add([]byte{0xff, 0x7b, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x7f, 0x80, 0xff})
	blk := make([]byte, BlockIQ1_M)
	for i := range blk {
		blk[i] = 0xff
	}
	f.Add(blk) // IQ1_M d = NaN
	f.Fuzz(func(t *testing.T, data []byte) { fuzzIQ(t, iq1Refs, data) })
}

// The special float inputs the fuzz corpus may not reach, every run.
func TestIQ1QuantSpecial(t *testing.T) { checkQuantSpecial(t, iq1Refs) }

// The quantizers keep the sign of every Gaussian weight of magnitude
// above the rms: such a weight is never the point's 0 with the wrong delta
// nor its other sign.
func TestIQ1QuantSigns(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	x := gaussian(r, 8*QKK, 1)
	for _, c := range iq1Refs {
		q := make([]byte, c.typ.RowSize(len(x)))
		QuantizeRow(c.typ, x, q)
		y := make([]float32, len(x))
		DequantizeRow(c.typ, q, y)
		flips := 0
		for i := range x {
			if math.Abs(float64(x[i])) > 1 && (x[i] < 0) != (y[i] < 0) {
				flips++
			}
		}
		// the codebook lacks some patterns: a few large weights take
		// the nearest point that has them as 0
		if flips > len(x)/100 {
			t.Errorf("%v: %d of %d weights above the rms changed sign", c.typ, flips, len(x))
		}
	}
}
