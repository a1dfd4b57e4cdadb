package quant

import (
	"encoding/binary"
	"math"
)

// The 32-element formats. Element j of the first half of a block sits in the
// low nibble of qs[j], element j+16 in its high nibble; Q5 formats keep the
// fifth bit of element k in bit k of the little-endian uint32 qh.

// absMax returns the element of largest magnitude (the first one on ties) and
// that magnitude, as ggml's "amax / max" loops.
func absMax(x []float32) (max, amax float32) {
	for _, v := range x {
		if av := abs32(v); amax < av {
			amax, max = av, v
		}
	}
	return max, amax
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

func minMax(x []float32) (min, max float32) {
	min, max = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < min {
			min = v
		}
		if v > max {
			max = v
		}
	}
	return min, max
}

func inv(d float32) float32 {
	if d != 0 {
		return 1 / d
	}
	return 0
}

// ---- Q4_0: x = (q - 8) * d

func dequantQ4_0(b []byte, y []float32) {
	d := f16(b, 0)
	qs := b[2 : 2+16]
	for j, q := range qs {
		y[j] = float32(int(q&0xf)-8) * d
		y[j+16] = float32(int(q>>4)-8) * d
	}
}

func quantQ4_0(x []float32, b []byte) {
	max, _ := absMax(x)
	d := max / -8
	id := inv(d)
	putF16(b, 0, d)
	for j := 0; j < 16; j++ {
		x0 := float32(x[j] * id) // explicit rounding: no fused multiply-add
		x1 := float32(x[j+16] * id)
		q0 := min(15, int(int8(x0+8.5)))
		q1 := min(15, int(int8(x1+8.5)))
		b[2+j] = uint8(q0) | uint8(q1)<<4
	}
}

// ---- Q4_1: x = q * d + m

func dequantQ4_1(b []byte, y []float32) {
	d, m := f16(b, 0), f16(b, 2)
	qs := b[4 : 4+16]
	for j, q := range qs {
		y[j] = float32(float32(q&0xf)*d) + m
		y[j+16] = float32(float32(q>>4)*d) + m
	}
}

func quantQ4_1(x []float32, b []byte) {
	lo, hi := minMax(x)
	d := (hi - lo) / 15
	id := inv(d)
	putF16(b, 0, d)
	putF16(b, 2, lo)
	for j := 0; j < 16; j++ {
		x0 := float32((x[j] - lo) * id) // explicit rounding: no fused multiply-add
		x1 := float32((x[j+16] - lo) * id)
		q0 := min(15, int(int8(x0+0.5)))
		q1 := min(15, int(int8(x1+0.5)))
		b[4+j] = uint8(q0) | uint8(q1)<<4
	}
}

// ---- Q5_0: x = (q - 16) * d

func dequantQ5_0(b []byte, y []float32) {
	d := f16(b, 0)
	qh := binary.LittleEndian.Uint32(b[2:])
	qs := b[6 : 6+16]
	for j, q := range qs {
		h0 := (qh >> uint(j) << 4) & 0x10
		h1 := (qh >> uint(j+12)) & 0x10
		y[j] = float32(int(uint32(q&0xf)|h0)-16) * d
		y[j+16] = float32(int(uint32(q>>4)|h1)-16) * d
	}
}

func quantQ5_0(x []float32, b []byte) {
	max, _ := absMax(x)
	d := max / -16
	id := inv(d)
	putF16(b, 0, d)
	var qh uint32
	for j := 0; j < 16; j++ {
		x0 := float32(x[j] * id) // explicit rounding: no fused multiply-add
		x1 := float32(x[j+16] * id)
		q0 := uint32(min(31, int(int8(x0+16.5))))
		q1 := uint32(min(31, int(int8(x1+16.5))))
		b[6+j] = uint8(q0&0xf) | uint8(q1&0xf)<<4
		qh |= (q0 >> 4 & 1) << uint(j)
		qh |= (q1 >> 4 & 1) << uint(j+16)
	}
	binary.LittleEndian.PutUint32(b[2:], qh)
}

// ---- Q5_1: x = q * d + m

func dequantQ5_1(b []byte, y []float32) {
	d, m := f16(b, 0), f16(b, 2)
	qh := binary.LittleEndian.Uint32(b[4:])
	qs := b[8 : 8+16]
	for j, q := range qs {
		h0 := (qh >> uint(j) << 4) & 0x10
		h1 := (qh >> uint(j+12)) & 0x10
		y[j] = float32(float32(uint32(q&0xf)|h0)*d) + m
		y[j+16] = float32(float32(uint32(q>>4)|h1)*d) + m
	}
}

func quantQ5_1(x []float32, b []byte) {
	lo, hi := minMax(x)
	d := (hi - lo) / 31
	id := inv(d)
	putF16(b, 0, d)
	putF16(b, 2, lo)
	var qh uint32
	for j := 0; j < 16; j++ {
		x0 := float32((x[j] - lo) * id) // explicit rounding: no fused multiply-add
		x1 := float32((x[j+16] - lo) * id)
		q0 := uint32(uint8(x0 + 0.5))
		q1 := uint32(uint8(x1 + 0.5))
		b[8+j] = uint8(q0&0xf) | uint8(q1&0xf)<<4
		qh |= (q0 >> 4 & 1) << uint(j)
		qh |= (q1 >> 4 & 1) << uint(j+16)
	}
	binary.LittleEndian.PutUint32(b[4:], qh)
}

// ---- Q8_0: x = q * d

func dequantQ8_0(b []byte, y []float32) {
	d := f16(b, 0)
	for j, q := range b[2 : 2+32] {
		y[j] = float32(int8(q)) * d
	}
}

// roundf rounds half away from zero, as C's roundf.
func roundf(v float32) float32 { return float32(math.Round(float64(v))) }

func quantQ8_0(x []float32, b []byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	id := inv(d)
	putF16(b, 0, d)
	for j, v := range x {
		b[2+j] = uint8(int8(roundf(v * id)))
	}
}

// ---- Q8_1: x = q * d; s = d * sum(q) (d before rounding to f16)

func dequantQ8_1(b []byte, y []float32) {
	d := f16(b, 0)
	for j, q := range b[4 : 4+32] {
		y[j] = float32(int8(q)) * d
	}
}

func quantQ8_1(x []float32, b []byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	id := inv(d)
	putF16(b, 0, d)
	sum := 0
	for j, v := range x {
		q := int8(roundf(v * id))
		b[4+j] = uint8(q)
		sum += int(q)
	}
	putF16(b, 2, float32(sum)*d)
}
