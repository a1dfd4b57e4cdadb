package quant

import (
	"encoding/binary"
	"math"
)

// The 1-bit i-quants (ggml's IQ1_S and IQ1_M). A group of 8 weights is one
// point of a fixed codebook of 8 values in {-1, 0, +1} (IQ1Grid; see
// iq1grid.go), shifted by delta = ±1/8 (IQ1Delta) and multiplied by
// d·(2s+1) for a 3-bit scale s.
//
//	block_iq1_s (256 weights): f16 d | qs[32] | uint16 qh[8]
//	    32 weights ib (groups 4ib..4ib+3): group 4ib+l is point
//	    qs[4ib+l] | ((qh[ib] >> 3l) & 7) << 8; s is bits 12-14 of qh[ib],
//	    and bit 15 set makes delta -1/8.
//	block_iq1_m (256 weights): qs[32] | qh[16] | uint16 scales[4]
//	    group g (weights 8g..8g+7) is point qs[g] | (n & 7) << 8 where n is
//	    the low nibble of qh[g/2] for even g and the high one for odd g;
//	    bit 3 of n set makes its delta -1/8. The scale s of weights
//	    16h..16h+15 is bits 3(h%4)..3(h%4)+2 of scales[h/4]; the top 4 bits
//	    of scales[0..3] are bits 0-3, 4-7, 8-11, 12-15 of the f16 d.
//
//	weight 8g+j = d·(2s+1) · (Grid[point][j] + delta)
//
// The dequantizers round as ggml's dequantize_row_iq1_s and _m do (two
// float32 products, both exact but for the last rounding). The quantizers
// are shoal's own (see quantIQ1).

// Block sizes in bytes.
const (
	// block_iq1_s: f16 d | qs[32] | uint16 qh[8]
	BlockIQ1_S = 50
	// block_iq1_m: qs[32] | qh[16] | uint16 scales[4] (d in their top bits)
	BlockIQ1_M = 56
)

// IQ1Delta is the shift of the IQ1 codebook values (ggml's IQ1S_DELTA and
// IQ1M_DELTA).
const IQ1Delta = 0.125

func iq1DeltaOf(neg bool) float32 {
	if neg {
		return -IQ1Delta
	}
	return IQ1Delta
}

// iq1Group writes the 8 weights of one group: dl times the point's values
// shifted by delta.
func iq1Group(y []float32, dl float32, pt *[8]int8, delta float32) {
	for j, v := range pt {
		y[j] = dl * (float32(v) + delta)
	}
}

func dequantIQ1_S(b []byte, y []float32) {
	d := f16(b, 0)
	for ib := 0; ib < QKK/32; ib++ {
		qh := binary.LittleEndian.Uint16(b[34+2*ib:])
		dl := d * float32(2*(qh>>12&7)+1)
		delta := iq1DeltaOf(qh&0x8000 != 0)
		for l := 0; l < 4; l++ {
			idx := int(b[2+4*ib+l]) | int(qh>>(3*l)&7)<<8
			iq1Group(y[32*ib+8*l:], dl, &IQ1Grid[idx], delta)
		}
	}
}

// IQ1MScale returns the f16 bits of d of the IQ1_M block b (spread over
// the top 4 bits of its 4 scale words).
func IQ1MScale(b []byte) uint16 {
	var h uint16
	for k := 0; k < 4; k++ {
		h |= binary.LittleEndian.Uint16(b[48+2*k:]) >> 12 << (4 * k)
	}
	return h
}

func dequantIQ1_M(b []byte, y []float32) {
	d := FP16ToFP32(IQ1MScale(b))
	for h := 0; h < QKK/16; h++ {
		s := binary.LittleEndian.Uint16(b[48+2*(h/4):]) >> (3 * (h % 4)) & 7
		dl := d * float32(2*s+1)
		for g := 2 * h; g < 2*h+2; g++ {
			n := b[32+g/2] >> (4 * (g % 2))
			idx := int(b[g]) | int(n&7)<<8
			iq1Group(y[8*g:], dl, &IQ1Grid[idx], iq1DeltaOf(n&8 != 0))
		}
	}
}

// ---- the quantizer (shoal's own; ggml's needs an importance matrix)

// iq1Book is the codebook as an iqBook of digits (value+1: levels 0, 1,
// 2), for its table of the nearest points per rounded pattern.
var iq1Book = func() *iqBook {
	g := make([]uint8, 0, 8*len(IQ1Grid))
	for _, pt := range IQ1Grid {
		for _, v := range pt {
			g = append(g, uint8(v+1))
		}
	}
	return newBook([]uint8{0, 1, 2}, 8, g)
}()

// iq1Fmt is what quantIQ1 needs to know of one IQ1 format.
type iq1Fmt struct {
	size int // block bytes
	sub  int // weights per scale: 32 (IQ1_S), 16 (IQ1_M)
	unit int // weights per delta: 32 (IQ1_S), 8 (IQ1_M)
	// put stores the points and deltas of sub-block h (idx: its groups'
	// points; neg: its units' delta signs) and its scale s into a block of
	// zeros; putD stores d (as f16 bits).
	put  func(b []byte, h int, idx []uint16, neg []bool, s uint8)
	putD func(b []byte, d uint16)
}

var (
	iq1sFmt = &iq1Fmt{size: BlockIQ1_S, sub: 32, unit: 32,
		put: func(b []byte, h int, idx []uint16, neg []bool, s uint8) {
			qh := uint16(s) << 12
			if neg[0] {
				qh |= 0x8000
			}
			for l, i := range idx {
				b[2+4*h+l] = uint8(i)
				qh |= i >> 8 << (3 * l)
			}
			binary.LittleEndian.PutUint16(b[34+2*h:], qh)
		},
		putD: func(b []byte, d uint16) { binary.LittleEndian.PutUint16(b, d) }}
	iq1mFmt = &iq1Fmt{size: BlockIQ1_M, sub: 16, unit: 8,
		put: func(b []byte, h int, idx []uint16, neg []bool, s uint8) {
			for l, i := range idx {
				g := 2*h + l
				n := uint8(i >> 8)
				if neg[l] {
					n |= 8
				}
				b[g] = uint8(i)
				b[32+g/2] |= n << (4 * (g % 2))
			}
			w := binary.LittleEndian.Uint16(b[48+2*(h/4):]) | uint16(s)<<(3*(h%4))
			binary.LittleEndian.PutUint16(b[48+2*(h/4):], w)
		},
		putD: func(b []byte, d uint16) {
			for k := 0; k < 4; k++ {
				w := binary.LittleEndian.Uint16(b[48+2*k:]) | (d>>(4*k)&0xf)<<12
				binary.LittleEndian.PutUint16(b[48+2*k:], w)
			}
		}}
)

func quantIQ1_S(x []float32, b []byte) { quantIQ1(iq1sFmt, x, b) }
func quantIQ1_M(x []float32, b []byte) { quantIQ1(iq1mFmt, x, b) }

// iq1Fit picks the point of one group of 8 weights x at multiplier dl (>
// 0) and shift delta: the values x/dl - delta rounded to -1, 0, +1 give a
// pattern, and of its iqNear nearest points the one closest to the values
// is taken. It returns the point, the error Σ (x/dl - delta - v_j)², and
// the sums Σ x_j·w_j and Σ w_j² over the shifted values w_j = v_j + delta.
func iq1Fit(x []float32, dl, delta float32) (idx uint16, e, dot, m2 float32) {
	is := 1 / dl
	var a [8]float32
	pat := 0
	for j := 7; j >= 0; j-- {
		a[j] = x[j]*is - delta + 1
		pat = 3*pat + iq1Book.level(a[j])
	}
	e = -1
	for _, i := range iq1Book.near()[pat] {
		var ei float32
		for j, m := range iq1Book.point(i) {
			d := a[j] - float32(m)
			ei += d * d
		}
		if e < 0 || ei < e {
			idx, e = i, ei
		}
	}
	for j, m := range iq1Book.point(idx) {
		w := float32(m) - 1 + delta
		dot += x[j] * w
		m2 += w * w
	}
	return idx, e, dot, m2
}

// fitSub fits the groups of one sub-block x at multiplier dl: each unit
// (the weights of one delta) takes the delta, of ±1/8, whose points fit
// it best. It returns the points, the deltas' signs and Σ x·w, Σ w².
func (f *iq1Fmt) fitSub(x []float32, dl float32, idx []uint16, neg []bool) (dot, m2 float32) {
	for u := 0; u < len(x)/f.unit; u++ {
		xu := x[f.unit*u : f.unit*(u+1)]
		var bestE, bestDot, bestM2 float32
		for k, delta := range [2]float32{IQ1Delta, -IQ1Delta} {
			var e, ud, um float32
			var ui [4]uint16
			for g := 0; g < len(xu)/8; g++ {
				i, ge, gd, gm := iq1Fit(xu[8*g:8*g+8], dl, delta)
				ui[g], e, ud, um = i, e+ge, ud+gd, um+gm
			}
			if k == 0 || e < bestE {
				bestE, bestDot, bestM2 = e, ud, um
				copy(idx[f.unit/8*u:], ui[:f.unit/8])
				neg[u] = k == 1
			}
		}
		dot, m2 = dot+bestDot, m2+bestM2
	}
	return dot, m2
}

// subScale returns the least-squares multiplier of a sub-block x over a
// range of trial multipliers (the largest magnitude at 0.6 to 3 times the
// multiplier): the groups are fitted at each and the one whose points fit
// best is kept. It returns 0 for a sub-block of zeros (or one that is not
// finite).
func (f *iq1Fmt) subScale(x []float32) float32 {
	_, amax := absMax(x)
	if !(amax >= groupMaxEps) || amax > 3e38 {
		return 0
	}
	var idx [4]uint16
	var neg [4]bool
	var bestS, best float32
	for k := 0; k <= 12; k++ {
		dl := amax / (0.6 + 0.2*float32(k))
		d, m2 := f.fitSub(x, dl, idx[:], neg[:])
		if d > 0 && d*d > best*m2 {
			bestS, best = d/m2, d*d/m2
		}
	}
	if math.IsInf(float64(bestS), 0) || bestS != bestS {
		return 0
	}
	return bestS
}

// quantIQ1 fits each sub-block (subScale), sets d so that the largest
// sub-block multiplier is d·15, and gives each sub-block the 3-bit scale
// (one of the nearest three to its fit) whose points, picked again for
// that multiplier, leave the smallest squared error. On Gaussian data the
// rms error is about 45% (IQ1_S) and 42% (IQ1_M) of the rms (see
// rmseBound).
func quantIQ1(f *iq1Fmt, x []float32, b []byte) {
	nsub := QKK / f.sub
	var sc [QKK / 16]float32
	var maxS float32
	for h := 0; h < nsub; h++ {
		sc[h] = f.subScale(x[f.sub*h : f.sub*(h+1)])
		maxS = max(maxS, sc[h])
	}
	clear(b[:f.size])
	dh := FP32ToFP16(maxS / 15)
	d := FP16ToFP32(dh)
	if !(d > 0) || d > 65504 {
		return
	}
	f.putD(b, dh)
	var idx, bestIdx [4]uint16
	var neg, bestNeg [4]bool
	ng, nu := f.sub/8, f.sub/f.unit
	for h := 0; h < nsub; h++ {
		xs := x[f.sub*h : f.sub*(h+1)]
		l0 := clampInt(nearestInt((sc[h]/d-1)/2), 0, 7)
		bestL, bestE := 0, float32(-1)
		for l := max(0, l0-1); l <= min(7, l0+1); l++ {
			dl := d * float32(2*l+1)
			f.fitSub(xs, dl, idx[:ng], neg[:nu])
			var e float32
			for g := 0; g < ng; g++ {
				delta := iq1DeltaOf(neg[8*g/f.unit])
				for j, v := range IQ1Grid[idx[g]] {
					r := xs[8*g+j] - dl*(float32(v)+delta)
					e += r * r
				}
			}
			if bestE < 0 || e < bestE {
				bestL, bestE, bestIdx, bestNeg = l, e, idx, neg
			}
		}
		f.put(b, h, bestIdx[:ng], bestNeg[:nu], uint8(bestL))
	}
}
