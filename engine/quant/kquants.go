package quant

import (
	"encoding/binary"
	"math"
)

// The K-quants: 256-element super-blocks split into sub-blocks of 16 or 32
// elements, each with its own quantized scale (and min). The quantizers follow
// ggml's quantize_row_*_ref step by step, in float32 arithmetic without fused
// multiply-adds (hence the explicit float32 conversions around products that
// are then added: Go may otherwise fuse them on some platforms).

const groupMaxEps = 1e-15

// nearestInt rounds to the nearest integer, ties to even, with the same
// add-1.5*2^23 trick as ggml's nearest_int (exact for |f| <= 4194303; outside
// that range it returns the same garbage as ggml does).
func nearestInt(f float32) int {
	v := float32(f) + 12582912
	return int(int32(math.Float32bits(v)&0x007fffff) - 0x00400000)
}

func clampInt(v, lo, hi int) int { return max(lo, min(hi, v)) }

func sqrt32(v float32) float32 { return float32(math.Sqrt(float64(v))) }

// makeQXQuants picks a symmetric scale for x with levels -nmax..nmax-1,
// minimizing the x²-weighted squared error over 19 candidate scales; L gets
// the levels offset by +nmax. As ggml's make_qx_quants(rmse_type=1, qw=NULL).
func makeQXQuants(nmax int, x []float32, L []int8) float32 {
	max, amax := absMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	iscale := float32(-nmax) / max
	var sumlx, suml2 float32
	for i, xi := range x {
		l := clampInt(nearestInt(iscale*xi), -nmax, nmax-1)
		L[i] = int8(l + nmax)
		w, fl := xi*xi, float32(l)
		sumlx += float32(w * xi * fl)
		suml2 += float32(w * fl * fl)
	}
	var scale float32
	if suml2 != 0 {
		scale = sumlx / suml2
	}
	best := scale * sumlx
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + float32(0.1*float32(is))) / max
		sumlx, suml2 = 0, 0
		for _, xi := range x {
			l := clampInt(nearestInt(iscale*xi), -nmax, nmax-1)
			w, fl := xi*xi, float32(l)
			sumlx += float32(w * xi * fl)
			suml2 += float32(w * fl * fl)
		}
		if suml2 > 0 && sumlx*sumlx > best*suml2 {
			for i, xi := range x {
				L[i] = int8(nmax + clampInt(nearestInt(iscale*xi), -nmax, nmax-1))
			}
			scale = sumlx / suml2
			best = scale * sumlx
		}
	}
	return scale
}

// makeQ3Quants is ggml's make_q3_quants with do_rmse: a symmetric scale
// refined by moving single elements to better levels; L gets levels + nmax.
func makeQ3Quants(nmax int, x []float32, L []int8) float32 {
	max, amax := absMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	iscale := float32(-nmax) / max
	var sumlx, suml2 float32
	for i, xi := range x {
		l := clampInt(nearestInt(iscale*xi), -nmax, nmax-1)
		L[i] = int8(l)
		w, fl := xi*xi, float32(l)
		sumlx += float32(w * xi * fl)
		suml2 += float32(w * fl * fl)
	}
	for itry := 0; itry < 5; itry++ {
		changed := 0
		for i, xi := range x {
			w, li := xi*xi, float32(L[i])
			slx := sumlx - float32(w*xi*li)
			if slx > 0 {
				sl2 := suml2 - float32(w*li*li)
				nl := clampInt(nearestInt(xi*sl2/slx), -nmax, nmax-1)
				if nl != int(L[i]) {
					fn := float32(nl)
					slx += float32(w * xi * fn)
					sl2 += float32(w * fn * fn)
					if sl2 > 0 && slx*slx*suml2 > sumlx*sumlx*sl2 {
						L[i] = int8(nl)
						sumlx, suml2 = slx, sl2
						changed++
					}
				}
			}
		}
		if changed == 0 {
			break
		}
	}
	for i := range x {
		L[i] += int8(nmax)
	}
	if suml2 > 0 {
		return sumlx / suml2
	}
	return 0
}

// makeQKX2Quants fits x ≈ scale*L - theMin with L in 0..nmax (theMin >= 0),
// searching nstep+1 candidate scales for the smallest weighted error (absolute
// when useMad, else squared). As ggml's make_qkx2_quants.
func makeQKX2Quants(nmax int, x, weights []float32, L, Laux []uint8, rmin, rdelta float32, nstep int, useMad bool) (scale, theMin float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := weights[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		if x[i] < lo {
			lo = x[i]
		}
		if x[i] > hi {
			hi = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		clear(L[:n])
		return 0, -lo
	}
	errOf := func(diff float32) float32 {
		if useMad {
			return abs32(diff)
		}
		return diff * diff
	}
	iscale := float32(nmax) / (hi - lo)
	scale = 1 / iscale
	var bestError float32
	for i := 0; i < n; i++ {
		L[i] = uint8(clampInt(nearestInt(iscale*(x[i]-lo)), 0, nmax))
		diff := float32(scale*float32(L[i])) + lo - x[i]
		bestError += float32(weights[i] * errOf(diff))
	}
	if nstep < 1 {
		return scale, -lo
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := 0; i < n; i++ {
			l := clampInt(nearestInt(iscale*(x[i]-lo)), 0, nmax)
			Laux[i] = uint8(l)
			w, fl := weights[i], float32(l)
			sumL += float32(w * fl)
			sumL2 += float32(w * fl * fl)
			sumXL += float32(w * fl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := 0; i < n; i++ {
				diff := float32(thisScale*float32(Laux[i])) + thisMin - x[i]
				curError += float32(weights[i] * errOf(diff))
			}
			if curError < bestError {
				copy(L[:n], Laux[:n])
				bestError = curError
				scale, lo = thisScale, thisMin
			}
		}
	}
	return scale, -lo
}

// packQ2 stores 256 two-bit values: byte l of each 32-byte group holds
// elements l, l+32, l+64, l+96 of the 128-element half in bits 0-1, 2-3, 4-5, 6-7.
func packQ2(L *[256]uint8, qs []byte) {
	for j := 0; j < 256; j += 128 {
		for l := 0; l < 32; l++ {
			qs[j/4+l] = L[j+l] | L[j+l+32]<<2 | L[j+l+64]<<4 | L[j+l+96]<<6
		}
	}
}

// ---- Q2_K: x = d*(scales[k]&15)*q - dmin*(scales[k]>>4), 16 sub-blocks of 16.

func dequantQ2_K(b []byte, y []float32) {
	sc, q := b[0:16], b[16:80]
	d, dmin := f16(b, 80), f16(b, 82)
	is, yi := 0, 0
	for n := 0; n < 256; n += 128 {
		for shift := uint(0); shift < 8; shift += 2 {
			for half := 0; half < 32; half += 16 {
				s := sc[is]
				is++
				dl, ml := d*float32(s&0xf), dmin*float32(s>>4)
				for l := half; l < half+16; l++ {
					y[yi] = float32(dl*float32((q[l]>>shift)&3)) - ml
					yi++
				}
			}
		}
		q = q[32:]
	}
}

func quantQ2_K(x []float32, b []byte) {
	var (
		L              [256]uint8
		laux           [16]uint8
		weights        [16]float32
		mins, scales   [16]float32
		maxScale, maxM float32
	)
	const q4scale = 15
	for j := 0; j < 16; j++ {
		xs := x[16*j : 16*j+16]
		for l, v := range xs {
			weights[l] = abs32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(3, xs, weights[:], L[16*j:16*j+16], laux[:], -0.5, 0.1, 15, true)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxM {
			maxM = mins[j]
		}
	}
	sc := b[0:16]
	if maxScale > 0 {
		iscale := q4scale / maxScale
		for j := range sc {
			sc[j] = uint8(nearestInt(iscale * scales[j]))
		}
		putF16(b, 80, maxScale/q4scale)
	} else {
		clear(sc)
		putF16(b, 80, 0)
	}
	if maxM > 0 {
		iscale := q4scale / maxM
		for j := range sc {
			sc[j] |= uint8(nearestInt(iscale*mins[j]) << 4)
		}
		putF16(b, 82, maxM/q4scale)
	} else {
		putF16(b, 82, 0)
	}
	d, dmin := f16(b, 80), f16(b, 82)
	for j := 0; j < 16; j++ {
		dd := d * float32(sc[j]&0xf)
		if dd == 0 {
			continue
		}
		dm := dmin * float32(sc[j]>>4)
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = uint8(clampInt(nearestInt((x[16*j+ii]+dm)/dd), 0, 3))
		}
	}
	packQ2(&L, b[16:80])
}

// ---- Q3_K: x = d*(s6-32)*(q2 - (hbit ? 0 : 4)), 16 sub-blocks of 16.

// q3Scale unpacks the 6-bit scale j (0..63, biased by 32) of a Q3_K block:
// its low nibble is in sc[j] (j<8) or sc[j-8]>>4, its top two bits in
// sc[8+j%4] at bit 2*(j/4).
func q3Scale(sc []byte, j int) int {
	var lo byte
	if j < 8 {
		lo = sc[j] & 0xf
	} else {
		lo = sc[j-8] >> 4
	}
	return int(lo | (sc[8+j%4]>>(2*(j/4))&3)<<4)
}

func dequantQ3_K(b []byte, y []float32) {
	hm, q, sc := b[0:32], b[32:96], b[96:108]
	dAll := f16(b, 108)
	m := uint8(1)
	is, yi := 0, 0
	for n := 0; n < 256; n += 128 {
		for shift := uint(0); shift < 8; shift += 2 {
			for half := 0; half < 32; half += 16 {
				dl := dAll * float32(q3Scale(sc, is)-32)
				is++
				for l := half; l < half+16; l++ {
					v := int((q[l] >> shift) & 3)
					if hm[l]&m == 0 {
						v -= 4
					}
					y[yi] = dl * float32(v)
					yi++
				}
			}
			m <<= 1
		}
		q = q[32:]
	}
}

func quantQ3_K(x []float32, b []byte) {
	var (
		L      [256]int8
		scales [16]float32
	)
	var maxScale, amax float32
	for j := 0; j < 16; j++ {
		scales[j] = makeQ3Quants(4, x[16*j:16*j+16], L[16*j:16*j+16])
		if s := abs32(scales[j]); s > amax {
			amax, maxScale = s, scales[j]
		}
	}
	sc := b[96:108]
	clear(sc)
	if maxScale != 0 {
		iscale := -32 / maxScale
		for j := 0; j < 16; j++ {
			l := clampInt(int(int8(nearestInt(iscale*scales[j]))), -32, 31) + 32
			if j < 8 {
				sc[j] = uint8(l & 0xf)
			} else {
				sc[j-8] |= uint8(l&0xf) << 4
			}
			sc[8+j%4] |= uint8(l>>4) << (2 * (j / 4))
		}
		putF16(b, 108, 1/iscale)
	} else {
		putF16(b, 108, 0)
	}
	d0 := f16(b, 108)
	for j := 0; j < 16; j++ {
		d := d0 * float32(q3Scale(sc, j)-32)
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = int8(clampInt(nearestInt(x[16*j+ii]/d), -4, 3) + 4)
		}
	}
	hm := b[0:32]
	clear(hm)
	var U [256]uint8
	for j := range L {
		u := uint8(L[j])
		if u > 3 {
			hm[j%32] |= 1 << (j / 32)
			u -= 4
		}
		U[j] = u
	}
	packQ2(&U, b[32:96])
}

// ---- Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes.

// ScaleMinK4 unpacks the 6-bit scale and min of sub-block j (0..7) from the
// 12 packed bytes of a Q4_K or Q5_K block (ggml's get_scale_min_k4).
func ScaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

func dequantQ4_K(b []byte, y []float32) {
	d, dmin := f16(b, 0), f16(b, 2)
	sc, q := b[4:16], b[16:144]
	for j, is := 0, 0; j < 256; j, is = j+64, is+2 {
		s, m := ScaleMinK4(is, sc)
		d1, m1 := d*float32(s), dmin*float32(m)
		s, m = ScaleMinK4(is+1, sc)
		d2, m2 := d*float32(s), dmin*float32(m)
		for l := 0; l < 32; l++ {
			y[j+l] = float32(d1*float32(q[l]&0xf)) - m1
			y[j+32+l] = float32(d2*float32(q[l]>>4)) - m2
		}
		q = q[32:]
	}
}

func dequantQ5_K(b []byte, y []float32) {
	d, dmin := f16(b, 0), f16(b, 2)
	sc, qh, ql := b[4:16], b[16:48], b[48:176]
	u1, u2 := uint8(1), uint8(2)
	for j, is := 0, 0; j < 256; j, is = j+64, is+2 {
		s, m := ScaleMinK4(is, sc)
		d1, m1 := d*float32(s), dmin*float32(m)
		s, m = ScaleMinK4(is+1, sc)
		d2, m2 := d*float32(s), dmin*float32(m)
		for l := 0; l < 32; l++ {
			v1, v2 := ql[l]&0xf, ql[l]>>4
			if qh[l]&u1 != 0 {
				v1 += 16
			}
			if qh[l]&u2 != 0 {
				v2 += 16
			}
			y[j+l] = float32(d1*float32(v1)) - m1
			y[j+32+l] = float32(d2*float32(v2)) - m2
		}
		ql = ql[32:]
		u1 <<= 2
		u2 <<= 2
	}
}

// quantKx2 is the part quantize_row_q4_K_ref and quantize_row_q5_K_ref share:
// sub-block fits, 6-bit scales/mins into b[4:16], d/dmin into b[0:4], and the
// final levels (0..nmax) in L.
func quantKx2(x []float32, b []byte, nmax int, rmin, rdelta float32, nstep int, L *[256]uint8) {
	var (
		laux         [32]uint8
		weights      [32]float32
		mins, scales [8]float32
		maxScale     float32
		maxM         float32
	)
	for j := 0; j < 8; j++ {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		avX := sqrt32(sumX2 / 32)
		for l, v := range xs {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, rdelta, nstep, false)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxM {
			maxM = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxM > 0 {
		invMin = 63 / maxM
	}
	sc := b[4:16]
	for j := 0; j < 8; j++ {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			sc[j], sc[j+4] = ls, lm
		} else {
			sc[j+4] = ls&0xf | (lm&0xf)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	putF16(b, 0, maxScale/63)
	putF16(b, 2, maxM/63)
	d0, dmin0 := f16(b, 0), f16(b, 2)
	for j := 0; j < 8; j++ {
		s, m := ScaleMinK4(j, sc)
		d := d0 * float32(s)
		if d == 0 {
			continue
		}
		dm := dmin0 * float32(m)
		for ii := 0; ii < 32; ii++ {
			L[32*j+ii] = uint8(clampInt(nearestInt((x[32*j+ii]+dm)/d), 0, nmax))
		}
	}
}

func quantQ4_K(x []float32, b []byte) {
	var L [256]uint8
	quantKx2(x, b, 15, -1, 0.1, 20, &L)
	q := b[16:144]
	for j := 0; j < 256; j += 64 {
		for l := 0; l < 32; l++ {
			q[j/2+l] = L[j+l] | L[j+l+32]<<4
		}
	}
}

func quantQ5_K(x []float32, b []byte) {
	var L [256]uint8
	quantKx2(x, b, 31, -0.5, 0.1, 15, &L)
	qh, ql := b[16:48], b[48:176]
	clear(qh)
	m1, m2 := uint8(1), uint8(2)
	for n := 0; n < 256; n += 64 {
		for j := 0; j < 32; j++ {
			l1, l2 := L[n+j], L[n+j+32]
			if l1 > 15 {
				l1 -= 16
				qh[j] |= m1
			}
			if l2 > 15 {
				l2 -= 16
				qh[j] |= m2
			}
			ql[n/2+j] = l1 | l2<<4
		}
		m1 <<= 2
		m2 <<= 2
	}
}

// ---- Q6_K: x = d*scales[k]*(q6-32), 16 sub-blocks of 16, int8 scales.

func dequantQ6_K(b []byte, y []float32) {
	ql, qh, sc := b[0:128], b[128:192], b[192:208]
	d := f16(b, 208)
	for n := 0; n < 256; n += 128 {
		for l := 0; l < 32; l++ {
			is := l / 16
			h := qh[l]
			q1 := int(ql[l]&0xf|(h&3)<<4) - 32
			q2 := int(ql[l+32]&0xf|(h>>2&3)<<4) - 32
			q3 := int(ql[l]>>4|(h>>4&3)<<4) - 32
			q4 := int(ql[l+32]>>4|(h>>6&3)<<4) - 32
			y[n+l] = d * float32(int8(sc[is])) * float32(q1)
			y[n+l+32] = d * float32(int8(sc[is+2])) * float32(q2)
			y[n+l+64] = d * float32(int8(sc[is+4])) * float32(q3)
			y[n+l+96] = d * float32(int8(sc[is+6])) * float32(q4)
		}
		ql, qh, sc = ql[64:], qh[32:], sc[8:]
	}
}

func quantQ6_K(x []float32, b []byte) {
	var (
		L      [256]int8
		scales [16]float32
	)
	var maxScale, maxAbs float32
	for ib := 0; ib < 16; ib++ {
		s := makeQXQuants(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if a := abs32(s); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	if maxAbs < groupMaxEps {
		clear(b)
		return
	}
	iscale := -128 / maxScale
	putF16(b, 208, 1/iscale)
	sc := b[192:208]
	for ib := range sc {
		sc[ib] = uint8(int8(min(127, nearestInt(iscale*scales[ib]))))
	}
	d0 := f16(b, 208)
	for j := 0; j < 16; j++ {
		d := d0 * float32(int8(sc[j]))
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = int8(clampInt(nearestInt(x[16*j+ii]/d), -32, 31) + 32)
		}
	}
	ql, qh := b[0:128], b[128:192]
	for j := 0; j < 256; j += 128 {
		for l := 0; l < 32; l++ {
			l0, l1, l2, l3 := uint8(L[j+l]), uint8(L[j+l+32]), uint8(L[j+l+64]), uint8(L[j+l+96])
			ql[j/2+l] = l0&0xf | (l2&0xf)<<4
			ql[j/2+l+32] = l1&0xf | (l3&0xf)<<4
			qh[j/4+l] = l0>>4 | (l1>>4)<<2 | (l2>>4)<<4 | (l3>>4)<<6
		}
	}
}

// ---- Q8_K: x = d*q with a float32 d; bsums[k] = sum of q over elements 16k..16k+15.

func dequantQ8_K(b []byte, y []float32) {
	d := math.Float32frombits(binary.LittleEndian.Uint32(b))
	for j, q := range b[4 : 4+256] {
		y[j] = d * float32(int8(q))
	}
}

func quantQ8_K(x []float32, b []byte) {
	max, amax := absMax(x)
	if amax == 0 {
		clear(b)
		return
	}
	iscale := -127 / max
	qs := b[4 : 4+256]
	for j, v := range x {
		qs[j] = uint8(int8(min(127, nearestInt(iscale*v))))
	}
	for j := 0; j < 16; j++ {
		sum := 0
		for _, q := range qs[16*j : 16*j+16] {
			sum += int(int8(q))
		}
		binary.LittleEndian.PutUint16(b[260+2*j:], uint16(int16(sum)))
	}
	binary.LittleEndian.PutUint32(b, math.Float32bits(1/iscale))
}
