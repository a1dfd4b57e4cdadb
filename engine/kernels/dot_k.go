package kernels

import (
	"encoding/binary"

	"shoal/engine/quant"
)

// Dots of the K-quants with Q8_K activations. Like ggml's scalar versions,
// Q3_K..Q6_K keep eight int32 lanes per block (lane l gets the elements whose
// index is l mod 8), scale them by d into eight float32 lane sums, and add the
// lanes only at the end; the min terms of Q4_K/Q5_K go into a separate float32
// through the Q8_K bsums.

// Q8_K block fields: f32 d | int8 qs[256] | int16 bsums[16].
func q8kBsum(y []byte, j int) int32 {
	return int32(int16(binary.LittleEndian.Uint16(y[260+2*j:])))
}

func dotQ2_KQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ2_K, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		sc, q2 := x[0:16], x[16:80]
		q8 := y[4:260]
		var summs int32
		for j, s := range sc {
			summs += q8kBsum(y, j) * int32(s>>4)
		}
		dy := f32(y)
		dall := dy * f16(x[80:])
		dmin := dy * f16(x[82:])
		var isum int32
		is := 0
		for k := 0; k < 2; k++ {
			q := q2[32*k : 32*k+32]
			for shift := uint(0); shift < 8; shift += 2 {
				for half := 0; half < 32; half += 16 {
					var s int32
					for l := half; l < half+16; l++ {
						s += int32(int8(q8[l])) * int32((q[l]>>shift)&3)
					}
					isum += int32(sc[is]&0xf) * s
					is++
				}
				q8 = q8[32:]
			}
		}
		sumf += float32(dall*float32(isum)) - float32(dmin*float32(summs))
	}
	return sumf
}

// q3kScale unpacks the 6-bit scale j of a Q3_K block (see quant's layout notes):
// the low nibble of byte j (j<8) or the high nibble of byte j-8, and bits
// 2*(j/4) of byte 8+j%4 on top.
func q3kScale(sc []byte, j int) int32 {
	var lo byte
	if j < 8 {
		lo = sc[j] & 0xf
	} else {
		lo = sc[j-8] >> 4
	}
	return int32(lo | (sc[8+j%4]>>(2*(j/4))&3)<<4)
}

// addLanes16 adds scale * a[k]*q8[k] into lane k mod 8 for a sub-block of 16
// elements. (int32 products and sums are exact, so the
// grouping inside a lane does not matter.)
func addLanes16(aux *[8]int32, scale int32, a *[16]int8, q8 *[16]byte) {
	for l := 0; l < 8; l++ {
		aux[l] += scale * (int32(a[l])*int32(int8(q8[l])) + int32(a[l+8])*int32(int8(q8[l+8])))
	}
}

func dotQ3_KQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ3_K, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sums [8]float32
	var vals [256]int8
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		hm, q3, sc := x[0:32], x[32:96], x[96:108]
		m := uint8(1)
		k := 0
		for half := 0; half < 2; half++ {
			q := q3[32*half : 32*half+32]
			for shift := uint(0); shift < 8; shift += 2 {
				for l := 0; l < 32; l++ {
					v := int8((q[l] >> shift) & 3)
					if hm[l]&m == 0 {
						v -= 4
					}
					vals[k] = v
					k++
				}
				m <<= 1
			}
		}
		var aux [8]int32
		q8 := y[4:260]
		for j := 0; j < 16; j++ {
			addLanes16(&aux, q3kScale(sc, j)-32, (*[16]int8)(vals[16*j:]), (*[16]byte)(q8[16*j:]))
		}
		d := f16(x[108:]) * f32(y)
		for l, v := range aux {
			sums[l] += float32(d * float32(v))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// dotQ45K is the shared body of the Q4_K and Q5_K dots (withHigh for Q5_K's
// fifth bits). Sub-block j (elements 32j..32j+31) takes nibble j%2 of
// qs[32*(j/2)+l], plus 16 when bit j of qh[l] is set.
func dotQ45K(nb, bx int, w, a []byte, withHigh bool) float32 {
	const by = quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sums [8]float32
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		sc := x[4:16]
		var qh *[32]byte
		qs := x[16:]
		if withHigh {
			qh, qs = (*[32]byte)(x[16:48]), x[48:]
		}
		var aux [8]int32
		var sumi int32
		for j := 0; j < 8; j++ {
			s, m := quant.ScaleMinK4(j, sc)
			sumi += (q8kBsum(y, 2*j) + q8kBsum(y, 2*j+1)) * int32(m)
			q := (*[32]byte)(qs[32*(j/2):])
			q8 := (*[32]byte)(y[4+32*j:])
			shift := uint(4 * (j & 1))
			var lane [8]int32
			if withHigh {
				hb := uint(j)
				for l := 0; l < 8; l++ {
					for c := l; c < 32; c += 8 {
						v := int32((q[c]>>shift)&0xf) | int32((qh[c]>>hb)&1)<<4
						lane[l] += v * int32(int8(q8[c]))
					}
				}
			} else {
				for l := 0; l < 8; l++ {
					lane[l] = int32((q[l]>>shift)&0xf)*int32(int8(q8[l])) +
						int32((q[l+8]>>shift)&0xf)*int32(int8(q8[l+8])) +
						int32((q[l+16]>>shift)&0xf)*int32(int8(q8[l+16])) +
						int32((q[l+24]>>shift)&0xf)*int32(int8(q8[l+24]))
				}
			}
			for l := range lane {
				aux[l] += int32(s) * lane[l]
			}
		}
		dy := f32(y)
		d := f16(x) * dy
		for l, v := range aux {
			sums[l] += float32(d * float32(v))
		}
		dmin := f16(x[2:]) * dy
		sumf -= float32(dmin * float32(sumi))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

func dotQ6_KQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockQ6_K, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sums [8]float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		var aux [8]int32
		// Each 128-element half: for l < 32, elements l, l+32, l+64, l+96 take the
		// low/high nibbles of ql[l], ql[l+32] and bit pairs 0..3 of qh[l]; their
		// sub-blocks (scales) are l/16 + 0, 2, 4, 6. All four share lane l%8.
		for half := 0; half < 2; half++ {
			ql := (*[64]byte)(x[64*half:])
			qh := (*[32]byte)(x[128+32*half:])
			q8 := (*[128]byte)(y[4+128*half:])
			sc := (*[8]byte)(x[192+8*half:])
			for g := 0; g < 2; g++ {
				s0, s1 := int32(int8(sc[g])), int32(int8(sc[g+2]))
				s2, s3 := int32(int8(sc[g+4])), int32(int8(sc[g+6]))
				for l := 16 * g; l < 16*g+16; l++ {
					h := qh[l]
					v0 := int32(ql[l]&0xf|(h&3)<<4) - 32
					v1 := int32(ql[l+32]&0xf|(h>>2&3)<<4) - 32
					v2 := int32(ql[l]>>4|(h>>4&3)<<4) - 32
					v3 := int32(ql[l+32]>>4|(h>>6&3)<<4) - 32
					aux[l&7] += s0*v0*int32(int8(q8[l])) + s1*v1*int32(int8(q8[l+32])) +
						s2*v2*int32(int8(q8[l+64])) + s3*v3*int32(int8(q8[l+96]))
				}
			}
		}
		d := f16(x[208:]) * f32(y)
		for l, v := range aux {
			sums[l] += float32(d * float32(v))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// dotQ8_KQ8_KGeneric has no ggml counterpart (ggml never uses Q8_K weights);
// it is here so every supported type has a dot: per block sumi * (dx*dy).
func dotQ8_KQ8_KGeneric(nb int, w, a []byte) float32 {
	const bs = quant.BlockQ8_K
	w, a = row(w, nb*bs), row(a, nb*bs)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bs:(i+1)*bs], a[i*bs:(i+1)*bs]
		qx, qy := x[4:260], y[4:260]
		var s int32
		for j, q := range qx {
			s += int32(int8(q)) * int32(int8(qy[j]))
		}
		sumf += float32(float32(s) * (f32(x) * f32(y)))
	}
	return sumf
}

func dotQ4_KQ8_KGeneric(nb int, w, a []byte) float32 {
	return dotQ45K(nb, quant.BlockQ4_K, w, a, false)
}

func dotQ5_KQ8_KGeneric(nb int, w, a []byte) float32 {
	return dotQ45K(nb, quant.BlockQ5_K, w, a, true)
}

// dotIQ4_XSQ8_KGeneric follows ggml_vec_dot_iq4_xs_q8_K_generic: per
// sub-block of 32 the integer dot of the levels with the quants, times
// d_x·d_y·(scale-32), added to the sum sub-block by sub-block.
func dotIQ4_XSQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ4_XS, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		d4d8 := f16(x) * f32(y)
		for ib := 0; ib < quant.QKK/32; ib++ {
			dl := d4d8 * float32(quant.IQ4XSScale(x, ib)-32)
			s0, s1 := iq4Sums((*[16]byte)(x[8+16*ib:]), (*[32]byte)(y[4+32*ib:]))
			sumf += float32(dl * float32(s0+s1))
		}
	}
	return sumf
}

// dotIQ2_XSQ8_KGeneric follows ggml_vec_dot_iq2_xs_q8_K_generic: per group
// of 8 the integer dot of the signed codebook magnitudes with the quants,
// per 16 weights times the odd multiplier 2s+1, added in int32 over the
// super-block; the sum of d_x·d_y·isum over the blocks, times 1/8 at the
// end (the multiplier is (0.5+s)/4 = (2s+1)/8).
func dotIQ2_XSQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ2_XS, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		d := f16(x) * f32(y)
		var bsum int32
		for h := 0; h < quant.QKK/16; h++ {
			ls := int32(x[66+h/2]>>(4*(h%2))&0xf)*2 + 1
			var sumi int32
			for g := 2 * h; g < 2*h+2; g++ {
				q := binary.LittleEndian.Uint16(x[2+2*g:])
				sumi += iq2Sum(&quant.IQ2XSGrid[q&511], quant.IQ2Signs[q>>9], (*[8]byte)(y[4+8*g:]))
			}
			bsum += sumi * ls
		}
		sumf += d * float32(bsum)
	}
	return 0.125 * sumf
}

// iq2Sum is the integer dot of one IQ2 group (codebook point pt, 8 sign
// bits) with 8 quants.
func iq2Sum(pt *[8]uint8, signs uint8, q8 *[8]byte) int32 {
	var s int32
	for j, m := range pt {
		p := int32(m) * int32(int8(q8[j]))
		if signs>>j&1 != 0 {
			p = -p
		}
		s += p
	}
	return s
}

// dotIQ2_XXSQ8_KGeneric follows ggml_vec_dot_iq2_xxs_q8_K_generic: as
// dotIQ2_XSQ8_KGeneric with one multiplier per 32 weights.
func dotIQ2_XXSQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ2_XXS, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		d := f16(x) * f32(y)
		var bsum int32
		for ib := 0; ib < quant.QKK/32; ib++ {
			c := x[2+8*ib : 2+8*ib+8]
			aux := binary.LittleEndian.Uint32(c[4:])
			var sumi int32
			for l := 0; l < 4; l++ {
				sumi += iq2Sum(&quant.IQ2XXSGrid[c[l]], quant.IQ2Signs[aux>>(7*l)&127], (*[8]byte)(y[4+32*ib+8*l:]))
			}
			bsum += sumi * int32(2*(aux>>28)+1)
		}
		sumf += d * float32(bsum)
	}
	return 0.125 * sumf
}

// dotIQ2_SQ8_KGeneric follows ggml_vec_dot_iq2_s_q8_K_generic: as
// dotIQ2_XSQ8_KGeneric with 10-bit grid indices and 8 stored signs.
func dotIQ2_SQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ2_S, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		d := f16(x) * f32(y)
		var bsum int32
		for h := 0; h < quant.QKK/16; h++ {
			ls := int32(x[74+h/2]>>(4*(h%2))&0xf)*2 + 1
			var sumi int32
			for g := 2 * h; g < 2*h+2; g++ {
				idx := int(x[2+g]) | int(x[66+g/4]>>(2*(g%4))&3)<<8
				sumi += iq2Sum(&quant.IQ2SGrid[idx], x[34+g], (*[8]byte)(y[4+8*g:]))
			}
			bsum += sumi * ls
		}
		sumf += d * float32(bsum)
	}
	return 0.125 * sumf
}

// dotIQ3_XXSQ8_KGeneric follows ggml_vec_dot_iq3_xxs_q8_K_generic: per
// group of 8 the integer dot of the two signed points' magnitudes with the
// quants, per 32 weights times 2s+1, added in int32 over the super-block;
// times 1/4 at the end (the multiplier is (0.5+s)/2 = (2s+1)/4).
func dotIQ3_XXSQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ3_XXS, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		d := f16(x) * f32(y)
		var bsum int32
		for ib := 0; ib < quant.QKK/32; ib++ {
			q := x[2+8*ib : 2+8*ib+8]
			aux := binary.LittleEndian.Uint32(x[66+4*ib:])
			var sumi int32
			for l := 0; l < 4; l++ {
				sumi += iq3Sum(&quant.IQ3XXSGrid[q[2*l]], &quant.IQ3XXSGrid[q[2*l+1]], quant.IQ2Signs[aux>>(7*l)&127], (*[8]byte)(y[4+32*ib+8*l:]))
			}
			bsum += sumi * int32(2*(aux>>28)+1)
		}
		sumf += d * float32(bsum)
	}
	return 0.25 * sumf
}

// dotIQ3_SQ8_KGeneric follows ggml_vec_dot_iq3_s_q8_K_generic: as
// dotIQ3_XXSQ8_KGeneric with 9-bit point indices, 8 stored signs and the
// multiplier 2s+1 itself.
func dotIQ3_SQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ3_S, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		d := f16(x) * f32(y)
		var bsum int32
		for ib := 0; ib < quant.QKK/32; ib++ {
			q, qh := x[2+8*ib:2+8*ib+8], int(x[66+ib])
			var sumi int32
			for l := 0; l < 4; l++ {
				i0 := int(q[2*l]) | (qh>>(2*l)&1)<<8
				i1 := int(q[2*l+1]) | (qh>>(2*l+1)&1)<<8
				sumi += iq3Sum(&quant.IQ3SGrid[i0], &quant.IQ3SGrid[i1], x[74+4*ib+l], (*[8]byte)(y[4+32*ib+8*l:]))
			}
			bsum += sumi * int32(2*(x[106+ib/2]>>(4*(ib%2))&0xf)+1)
		}
		sumf += d * float32(bsum)
	}
	return sumf
}

// iq3Sum is the integer dot of one IQ3 group (points p0 and p1, 8 sign
// bits) with 8 quants.
func iq3Sum(p0, p1 *[4]uint8, signs uint8, q8 *[8]byte) int32 {
	var s int32
	for j := 0; j < 8; j++ {
		m := p0[j%4]
		if j >= 4 {
			m = p1[j%4]
		}
		p := int32(m) * int32(int8(q8[j]))
		if signs>>j&1 != 0 {
			p = -p
		}
		s += p
	}
	return s
}

// dotIQ1_SQ8_KGeneric follows ggml_vec_dot_iq1_s_q8_K_generic: per 32
// weights the integer dot of the codebook values (-1, 0, 1) with the
// quants times the odd multiplier 2s+1, and the delta's part, ±(2s+1)
// times the quants' sum (from the Q8_K bsums), in a second int32; the sum
// of d_x·d_y·(isum + isum1/8) over the blocks.
func dotIQ1_SQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ1_S, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		var sumi, sumi1 int32
		for ib := 0; ib < quant.QKK/32; ib++ {
			qh := binary.LittleEndian.Uint16(x[34+2*ib:])
			ls := int32(2*(qh>>12&7) + 1)
			delta := int32(1)
			if qh&0x8000 != 0 {
				delta = -1
			}
			var lsum int32
			for l := 0; l < 4; l++ {
				idx := int(x[2+4*ib+l]) | int(qh>>(3*l)&7)<<8
				lsum += iq1Sum(&quant.IQ1Grid[idx], (*[8]byte)(y[4+32*ib+8*l:]))
			}
			sumi += ls * lsum
			sumi1 += ls * delta * (q8kBsum(y, 2*ib) + q8kBsum(y, 2*ib+1))
		}
		sumf += f16(x) * f32(y) * (float32(sumi) + quant.IQ1Delta*float32(sumi1))
	}
	return sumf
}

// dotIQ1_MQ8_KGeneric follows ggml_vec_dot_iq1_m_q8_K_generic: as
// dotIQ1_SQ8_KGeneric with a multiplier per 16 weights and a delta per 8,
// whose part is the quants' sum of the group times ±1 (no bsums); d is
// the f16 spread over the top bits of the scale words.
func dotIQ1_MQ8_KGeneric(nb int, w, a []byte) float32 {
	const bx, by = quant.BlockIQ1_M, quant.BlockQ8_K
	w, a = row(w, nb*bx), row(a, nb*by)
	var sumf float32
	for i := 0; i < nb; i++ {
		x, y := w[i*bx:(i+1)*bx], a[i*by:(i+1)*by]
		var sumi1, sumi2 int32
		for ib := 0; ib < quant.QKK/32; ib++ {
			var sum1, sum2 [2]int32
			for l := 0; l < 4; l++ {
				n := x[32+2*ib+l/2] >> (4 * (l % 2))
				idx := int(x[4*ib+l]) | int(n&7)<<8
				q8 := (*[8]byte)(y[4+32*ib+8*l:])
				var qsum int32
				for _, q := range q8 {
					qsum += int32(int8(q))
				}
				if n&8 != 0 {
					qsum = -qsum
				}
				sum1[l/2] += iq1Sum(&quant.IQ1Grid[idx], q8)
				sum2[l/2] += qsum
			}
			sc := binary.LittleEndian.Uint16(x[48+2*(ib/2):]) >> (6 * (ib % 2))
			ls1, ls2 := int32(2*(sc&7)+1), int32(2*(sc>>3&7)+1)
			sumi1 += sum1[0]*ls1 + sum1[1]*ls2
			sumi2 += sum2[0]*ls1 + sum2[1]*ls2
		}
		d := quant.FP16ToFP32(quant.IQ1MScale(x))
		sumf += d * f32(y) * (float32(sumi1) + quant.IQ1Delta*float32(sumi2))
	}
	return sumf
}

// iq1Sum is the integer dot of one IQ1 group (codebook point pt) with 8
// quants.
func iq1Sum(pt *[8]int8, q8 *[8]byte) int32 {
	var s int32
	for j, v := range pt {
		s += int32(v) * int32(int8(q8[j]))
	}
	return s
}
