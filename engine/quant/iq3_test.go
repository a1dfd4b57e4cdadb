package quant

import (
	"encoding/binary"
	"testing"
)

// The IQ3 codebooks are, byte for byte, ggml's iq3xxs_grid and iq3s_grid
// (their uint32 entries stored little-endian): the SHA-256 of each table,
// and a few entries as ggml-common.h writes them.
func TestIQ3Grids(t *testing.T) {
	for _, c := range []struct {
		name  string
		grid  [][4]uint8
		keys  []uint16
		sha   string
		spots map[int]uint64
	}{
		{"IQ3XXSGrid", IQ3XXSGrid[:], iq3xxsKeys[:], "46e35f5a997efdee6c99ce57854c8a0d4f0ff8ca57e5e8a60c0793ea580acf5d",
			map[int]uint64{0: 0x04040404, 1: 0x04040414, 77: 0x0c140c14, 255: 0x3e341c04}},
		{"IQ3SGrid", IQ3SGrid[:], iq3sKeys[:], "bd1af4945a1717c65610b0284e4628b9a1ba3b306fae3a06f6e5f597356e349f",
			map[int]uint64{0: 0x01010101, 1: 0x01010103, 77: 0x01090509, 255: 0x05090501, 511: 0x0f0f0101}},
	} {
		var raw []byte
		for _, pt := range c.grid {
			raw = append(raw, pt[:]...)
		}
		checkTable(t, c.name, raw, 4, c.sha, c.spots)
		checkKeys(t, c.name, c.keys, func(k uint16) bool { return k < 1<<12 })
	}
}

// The plain readings of block_iq3_xxs and block_iq3_s (ggml-quants.c
// dequantize_row_iq3_*), weight by weight.
func refDequantIQ3XXS(blk []byte) []float32 {
	d := float64(refHalf(blk[0], blk[1]))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		ib, l, j := i/32, i%32/8, i%8
		c := blk[66+4*ib:]
		aux := int(c[0]) + 256*int(c[1]) + 65536*int(c[2]) + 16777216*int(c[3])
		si, sc := aux>>(7*l)%128, aux>>28
		point := blk[2+8*ib+2*l+j/4]
		m := float64(IQ3XXSGrid[point][j%4])
		y[i] = float32(d * (0.5 + float64(sc)) / 2 * m * refSign(si, j))
	}
	return y
}

func refDequantIQ3S(blk []byte) []float32 {
	d := float64(refHalf(blk[0], blk[1]))
	y := make([]float32, 256)
	for i := 0; i < 256; i++ {
		ib, j := i/32, i%8
		p := i % 32 / 4 // point within the 32
		index := int(blk[2+8*ib+p]) + 256*(int(blk[66+ib])>>p%2)
		sign := 1.0
		if blk[74+i/8]>>j&1 == 1 {
			sign = -1
		}
		sc := int(blk[106+ib/2])
		if ib%2 == 0 {
			sc %= 16
		} else {
			sc /= 16
		}
		m := float64(IQ3SGrid[index][i%4])
		y[i] = float32(d * float64(1+2*sc) * m * sign)
	}
	return y
}

// IQ3_XXS by hand: d = 1 and all other bytes 0 (points 0, all 4s; no signs;
// s = 0, multiplier 0.25) make every weight 1; weights 32..63 get s = 1
// (0.75: 3), and their group 2 (weights 48..55) is points 77 (20 12 20 12)
// and 255 (4 28 52 62) with sign index 3: weights 48 and 49 negative.
func TestIQ3XXSGolden(t *testing.T) {
	blk := make([]byte, BlockIQ3_XXS)
	blk[0], blk[1] = 0x00, 0x3c
	blk[2+8+4], blk[2+8+5] = 77, 255
	binary.LittleEndian.PutUint32(blk[66+4:], 3<<14|1<<28)
	want := filled(QKK, 1, nil)
	for i := 32; i < 64; i++ {
		want[i] = 3
	}
	copy(want[48:], []float32{-15, -9, 15, 9, 3, 21, 39, 46.5})
	checkGolden(t, IQ3_XXS, blk, want)
}

// IQ3_S by hand: d = 1 and all other bytes 0 (points 0, all 1s; s = 0,
// multiplier 1) make every weight 1; weights 96..127 get s = 2 (5), and
// their group 1 (weights 104..111) is points 511 (1 1 15 15: 0xff and bit
// 2 of qh[3]) and 77 (9 5 9 1) with sign byte 0x80: only weight 111
// negative (IQ3_S keeps all 8 signs).
func TestIQ3SGolden(t *testing.T) {
	blk := make([]byte, BlockIQ3_S)
	blk[0], blk[1] = 0x00, 0x3c
	blk[2+24+2], blk[2+24+3] = 0xff, 77
	blk[66+3] = 1 << 2
	blk[74+13] = 0x80
	blk[106+1] = 2 << 4
	want := filled(QKK, 1, nil)
	for i := 96; i < 128; i++ {
		want[i] = 5
	}
	copy(want[104:], []float32{5, 5, 75, 75, 45, 25, 45, -5})
	checkGolden(t, IQ3_S, blk, want)
}
