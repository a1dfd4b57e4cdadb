package kernels

import (
	"encoding/binary"

	"shoal/engine/quant"
)

// Dots of the 32-element formats. Per block: an exact integer sum, then float32
// scales. The explicit float32 conversions keep Go from fusing a product into
// the following addition, so the rounding matches ggml's unfused C.

func dotQ4_0Q8_0Generic(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ4_0, quant.BlockQ8_0
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		qs, q8 := x[2:18], y[2:34]
		var s0, s1 int32
		for j, q := range qs {
			s0 += (int32(q&0xf) - 8) * int32(int8(q8[j]))
			s1 += (int32(q>>4) - 8) * int32(int8(q8[j+16]))
		}
		sumf += float32(float32(s0+s1) * f16(x) * f16(y))
	}
	return sumf
}

func dotQ4_1Q8_1Generic(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ4_1, quant.BlockQ8_1
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		qs, q8 := x[4:20], y[4:36]
		var s0, s1 int32
		for j, q := range qs {
			s0 += int32(q&0xf) * int32(int8(q8[j]))
			s1 += int32(q>>4) * int32(int8(q8[j+16]))
		}
		dd := f16(x) * f16(y)
		sumf += float32(dd*float32(s0+s1)) + float32(f16(x[2:])*f16(y[2:]))
	}
	return sumf
}

func dotQ5_0Q8_0Generic(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ5_0, quant.BlockQ8_0
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		s0, s1 := q5_0Sums(binary.LittleEndian.Uint32(x[2:]), x[6:22], y[2:34])
		sumf += float32(f16(x) * f16(y) * float32(s0+s1))
	}
	return sumf
}

func dotQ5_1Q8_1Generic(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ5_1, quant.BlockQ8_1
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		qh := binary.LittleEndian.Uint32(x[4:])
		qs, q8 := x[8:24], y[4:36]
		var s0, s1 int32
		for j, q := range qs {
			h0 := int32(qh>>uint(j)&1) << 4
			h1 := int32(qh>>uint(j+16)&1) << 4
			s0 += (int32(q&0xf) | h0) * int32(int8(q8[j]))
			s1 += (int32(q>>4) | h1) * int32(int8(q8[j+16]))
		}
		dd := f16(x) * f16(y)
		sumf += float32(dd*float32(s0+s1)) + float32(f16(x[2:])*f16(y[2:]))
	}
	return sumf
}

func dotQ8_0Q8_0Generic(nb int, w, a []byte) float32 {
	const bs = quant.BlockQ8_0
	w, a = row(w, nb*bs), row(a, nb*bs)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bs:(i+1)*bs], a[i*bs:(i+1)*bs]
		s := int8Dot32((*[32]byte)(x[2:34]), (*[32]byte)(y[2:34]))
		sumf += float32(float32(s) * (f16(x) * f16(y)))
	}
	return sumf
}

func dotQ8_1Q8_1Generic(nb int, w, a []byte) float32 {
	const bs = quant.BlockQ8_1
	w, a = row(w, nb*bs), row(a, nb*bs)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bs:(i+1)*bs], a[i*bs:(i+1)*bs]
		s := int8Dot32((*[32]byte)(x[4:36]), (*[32]byte)(y[4:36]))
		sumf += float32(float32(s) * (f16(x) * f16(y)))
	}
	return sumf
}

// int8Dot32 is the integer dot of 32 int8 quants with 32 others.
func int8Dot32(qx, qy *[32]byte) (s int32) {
	for j, q := range qx {
		s += int32(int8(q)) * int32(int8(qy[j]))
	}
	return s
}

// q5_0Sums is the integer dot of one Q5_0 block's 32 quants (low nibbles
// qs, fifth bits qh, offset by -16) with 32 int8 quants, as two halves.
func q5_0Sums(qh uint32, qs, q8 []byte) (s0, s1 int32) {
	for j, q := range qs {
		h0 := int32(qh>>uint(j)&1) << 4
		h1 := int32(qh>>uint(j+16)&1) << 4
		s0 += ((int32(q&0xf) | h0) - 16) * int32(int8(q8[j]))
		s1 += ((int32(q>>4) | h1) - 16) * int32(int8(q8[j+16]))
	}
	return s0, s1
}

// dotIQ4_NLQ8_0Generic follows ggml_vec_dot_iq4_nl_q8_0_generic: per block
// the integer dot of the table levels with the quants, times d_y·d_x.
func dotIQ4_NLQ8_0Generic(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ4_NL, quant.BlockQ8_0
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		s0, s1 := iq4Sums((*[16]byte)(x[2:18]), (*[32]byte)(y[2:34]))
		sumf += float32(f16(y) * f16(x) * float32(s0+s1))
	}
	return sumf
}

// dotMXFP4Q8_0Generic follows ggml_vec_dot_mxfp4_q8_0_generic: per block
// the integer dot of the doubled E2M1 levels with the quants, times d_y and
// the halved E8M0 scale.
func dotMXFP4Q8_0Generic(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockMXFP4, quant.BlockQ8_0
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		s0, s1 := lutSums(&quant.MXFP4Values, (*[16]byte)(x[1:bx]), (*[32]byte)(y[2:34]))
		sumf += f16(y) * quant.E8M0Half(x[0]) * float32(s0+s1)
	}
	return sumf
}

// iq4Sums is the integer dot of 32 IQ4 levels (nibbles qs: low ones the
// first 16 elements, high ones the next 16) with 32 int8 quants, as two
// halves.
func iq4Sums(qs *[16]byte, q8 *[32]byte) (s0, s1 int32) { return lutSums(&quant.IQ4NLValues, qs, q8) }

// lutSums is the integer dot of the 32 levels tbl gives the nibbles qs
// (low ones the first 16 elements, high ones the next 16) with 32 int8
// quants, as two halves: IQ4_NL's and MXFP4's blocks.
func lutSums(tbl *[16]int8, qs *[16]byte, q8 *[32]byte) (s0, s1 int32) {
	for j, q := range qs {
		s0 += int32(tbl[q&0xf]) * int32(int8(q8[j]))
		s1 += int32(tbl[q>>4]) * int32(int8(q8[j+16]))
	}
	return s0, s1
}
