package quant

import (
	"encoding/binary"
	"math/bits"
	"sync"
)

// The quantizer of the codebook formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S): shoal's own, made to write test models (ggml's needs an
// importance matrix and gives other bytes). A group of 8 weights is one or
// two codebook points (of 8 or 4 magnitudes) and 8 signs; a sub-block of
// groups shares a 4-bit scale l whose multiplier is d·(2l+1)/den.

// iqBook is a codebook with what its quantizer needs: for each pattern of
// levels (digit j, base len(levels), is the level of magnitude j) the
// indices of the iqNear nearest points (squared distance of the
// magnitudes), computed on first use.
type iqBook struct {
	levels []uint8
	pl     int     // magnitudes per point: 8 or 4
	grid   []uint8 // point i is grid[pl*i : pl*i+pl]
	cut    []float32

	once    sync.Once
	nearest [][iqNear]uint16
}

// iqNear is the number of points iqBook.fit weighs for a group.
const iqNear = 8

func newBook(levels []uint8, pl int, grid []uint8) *iqBook {
	bk := &iqBook{levels: levels, pl: pl, grid: grid}
	for i := 1; i < len(levels); i++ {
		bk.cut = append(bk.cut, (float32(levels[i-1])+float32(levels[i]))/2)
	}
	return bk
}

func flat8(g [][8]uint8) []uint8 {
	var f []uint8
	for _, p := range g {
		f = append(f, p[:]...)
	}
	return f
}

func flat4(g [][4]uint8) []uint8 {
	var f []uint8
	for _, p := range g {
		f = append(f, p[:]...)
	}
	return f
}

func (bk *iqBook) point(i uint16) []uint8 { return bk.grid[bk.pl*int(i) : bk.pl*int(i)+bk.pl] }

func (bk *iqBook) near() [][iqNear]uint16 {
	bk.once.Do(func() {
		nl, np := len(bk.levels), len(bk.grid)/bk.pl
		n := 1
		for range bk.pl {
			n *= nl
		}
		bk.nearest = make([][iqNear]uint16, n)
		v := make([]int, bk.pl)
		var best, bestE [iqNear]int
		for p := range bk.nearest {
			for j, r := 0, p; j < bk.pl; j, r = j+1, r/nl {
				v[j] = int(bk.levels[r%nl])
			}
			for k := range bestE {
				bestE[k], best[k] = 1<<30, 0
			}
			for i := 0; i < np; i++ {
				e := 0
				for j, m := range bk.point(uint16(i)) {
					e += (v[j] - int(m)) * (v[j] - int(m))
				}
				// insert into the sorted list of the nearest
				for k := range bestE {
					if e < bestE[k] {
						copy(bestE[k+1:], bestE[k:iqNear-1])
						copy(best[k+1:], best[k:iqNear-1])
						bestE[k], best[k] = e, i
						break
					}
				}
			}
			for k := range best {
				bk.nearest[p][k] = uint16(best[k])
			}
		}
	})
	return bk.nearest
}

// level is the index of the level nearest to v (0 for NaN).
func (bk *iqBook) level(v float32) int {
	l := 0
	for l < len(bk.cut) && v >= bk.cut[l] {
		l++
	}
	return l
}

// fit picks the codebook points of one group of 8 weights x at scale s
// (> 0): each magnitude is rounded to its nearest level, and of each
// pattern's iqNear nearest points the one closest to the magnitudes taken.
// It returns the points (one, idx[0], for points of 8), the 8 sign bits
// (with parity, even parity: when the weights have an odd number of
// negatives, the one whose flip costs least, the smallest |x_j|·m_j, is
// made positive), and the sums Σ x_j·w_j and Σ w_j² over the signed
// magnitudes w_j.
func (bk *iqBook) fit(x []float32, s float32, parity bool) (idx [2]uint16, signs uint8, dot, m2 float32) {
	is := 1 / s
	var a [8]float32
	for j := range a {
		a[j] = abs32(x[j]) * is
		if x[j] < 0 {
			signs |= 1 << j
		}
	}
	near, nl := bk.near(), len(bk.levels)
	var mags [8]uint8
	for p := 0; p < 8/bk.pl; p++ {
		ap := a[p*bk.pl : (p+1)*bk.pl]
		pat := 0
		for j := bk.pl - 1; j >= 0; j-- {
			pat = nl*pat + bk.level(ap[j])
		}
		bestE := float32(-1)
		for _, i := range near[pat] {
			var e float32
			for j, m := range bk.point(i) {
				d := ap[j] - float32(m)
				e += d * d
			}
			if bestE < 0 || e < bestE {
				idx[p], bestE = i, e
			}
		}
		copy(mags[p*bk.pl:], bk.point(idx[p]))
	}
	minK, minC := 0, float32(-1)
	for j, m := range mags {
		fm := float32(m)
		c := abs32(x[j]) * fm
		dot += c
		m2 += fm * fm
		if minC < 0 || c < minC {
			minK, minC = j, c
		}
	}
	if parity && bits.OnesCount8(signs)%2 != 0 {
		signs ^= 1 << minK
		dot -= 2 * minC
	}
	return idx, signs, dot, m2
}

// err is the squared error of a group x stored as the points idx with
// signs at multiplier db, computed as the decoders compute the weights.
func (bk *iqBook) err(x []float32, db float32, idx [2]uint16, signs uint8) float32 {
	var e float32
	for j := range 8 {
		v := db * float32(bk.point(idx[j/bk.pl])[j%bk.pl])
		if signs>>j&1 != 0 {
			v = -v
		}
		d := x[j] - v
		e += d * d
	}
	return e
}

// subScale returns the least-squares scale of a sub-block x (one scale's
// groups) over a range of trial scales: each maps the largest magnitude to
// a value from 0.37 to 1.3 times the top level, or to one of the two
// lowest levels; the groups are fitted and the scale that fits their
// points best is kept. It returns 0 for a
// sub-block of zeros.
func (bk *iqBook) subScale(x []float32, parity bool) float32 {
	_, amax := absMax(x)
	if !(amax >= groupMaxEps) || amax > 3e38 {
		return 0
	}
	top := float32(bk.levels[len(bk.levels)-1])
	var bestS, best float32
	for k := -2; k <= 20; k++ {
		// (and the two lowest levels: a constant sub-block of IQ3_S
		// fits only the point of all 1s)
		v := top * float32(16+2*k) / 43
		if k < 0 {
			v = float32(bk.levels[k+2])
		}
		s := amax / v
		var d, m2 float32
		for g := 0; g < len(x); g += 8 {
			_, _, gd, gm := bk.fit(x[g:g+8], s, parity)
			d, m2 = d+gd, m2+gm
		}
		if d > 0 && d*d > best*m2 {
			bestS, best = d/m2, d*d/m2
		}
	}
	return bestS
}

// iqFormat is what quantIQ needs to know of one codebook format.
type iqFormat struct {
	size   int // block bytes
	book   *iqBook
	sub    int  // weights per scale
	parity bool // 7 sign bits stored, the eighth for even parity
	// mul is the multiplier of scale l for d, as the decoder computes it:
	// d·(2l+1)/den.
	mul func(d float32, l uint8) float32
	den int
	// put stores group g's points and sign bits, and putScale sub-block
	// h's scale, into a block of zeros (or-ing their bits in).
	put      func(b []byte, g int, idx [2]uint16, signs uint8)
	putScale func(b []byte, h int, s uint8)
}

var (
	iq2xxsFormat = &iqFormat{size: BlockIQ2_XXS, book: newBook(iq2Levels[:], 8, flat8(IQ2XXSGrid[:])), sub: 32, parity: true,
		mul: iq2Mul, den: 8,
		put: func(b []byte, g int, idx [2]uint16, signs uint8) {
			q := b[2+8*(g/4):]
			q[g%4] = uint8(idx[0])
			aux := binary.LittleEndian.Uint32(q[4:]) | uint32(signs&127)<<(7*(g%4))
			binary.LittleEndian.PutUint32(q[4:], aux)
		},
		putScale: func(b []byte, h int, s uint8) { b[2+8*h+7] |= s << 4 }}
	iq2xsFormat = &iqFormat{size: BlockIQ2_XS, book: newBook(iq2Levels[:], 8, flat8(IQ2XSGrid[:])), sub: 16, parity: true,
		mul: iq2Mul, den: 8,
		put: func(b []byte, g int, idx [2]uint16, signs uint8) {
			binary.LittleEndian.PutUint16(b[2+2*g:], idx[0]|uint16(signs&127)<<9)
		},
		putScale: func(b []byte, h int, s uint8) { b[66+h/2] |= s << (4 * (h % 2)) }}
	iq2sFormat = &iqFormat{size: BlockIQ2_S, book: newBook(iq2Levels[:], 8, flat8(IQ2SGrid[:])), sub: 16,
		mul: iq2Mul, den: 8,
		put: func(b []byte, g int, idx [2]uint16, signs uint8) {
			b[2+g] = uint8(idx[0])
			b[34+g] = signs
			b[66+g/4] |= uint8(idx[0]>>8) << (2 * (g % 4))
		},
		putScale: func(b []byte, h int, s uint8) { b[74+h/2] |= s << (4 * (h % 2)) }}
)

func quantIQ2_XXS(x []float32, b []byte) { quantIQ(iq2xxsFormat, x, b) }
func quantIQ2_XS(x []float32, b []byte)  { quantIQ(iq2xsFormat, x, b) }
func quantIQ2_S(x []float32, b []byte)   { quantIQ(iq2sFormat, x, b) }

// quantIQ fits each sub-block (subScale), sets d so that the largest
// sub-block scale is the largest multiplier (31/den), and gives each
// sub-block the 4-bit scale (one of the nearest three to its fit) whose
// points, picked again for that scale, leave the smallest squared error.
// On Gaussian data the rms error is 24% (IQ2_S) to 33% (IQ2_XXS) of the
// rms (see rmseBound).
func quantIQ(f *iqFormat, x []float32, b []byte) {
	nsub := QKK / f.sub
	var sc [QKK / 16]float32
	var maxS float32
	for h := 0; h < nsub; h++ {
		sc[h] = f.book.subScale(x[f.sub*h:f.sub*(h+1)], f.parity)
		maxS = max(maxS, sc[h])
	}
	clear(b[:f.size])
	putF16(b, 0, maxS*float32(f.den)/31)
	d := f16(b, 0)
	if !(d > 0) || d > 65504 {
		clear(b[:f.size])
		return
	}
	type fitted struct {
		idx   [2]uint16
		signs uint8
	}
	var best, cur [4]fitted
	ng := f.sub / 8
	for h := 0; h < nsub; h++ {
		xs := x[f.sub*h : f.sub*(h+1)]
		l0 := clampInt(nearestInt((float32(f.den)*sc[h]/d-1)/2), 0, 15)
		bestL, bestE := 0, float32(-1)
		for l := max(0, l0-1); l <= min(15, l0+1); l++ {
			db := f.mul(d, uint8(l))
			var e float32
			for g := 0; g < ng; g++ {
				xg := xs[8*g : 8*g+8]
				idx, signs, _, _ := f.book.fit(xg, db, f.parity)
				e += f.book.err(xg, db, idx, signs)
				cur[g] = fitted{idx, signs}
			}
			if bestE < 0 || e < bestE {
				bestL, bestE, best = l, e, cur
			}
		}
		for g := 0; g < ng; g++ {
			f.put(b, h*ng+g, best[g].idx, best[g].signs)
		}
		f.putScale(b, h, uint8(bestL))
	}
}
