package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"shoal/engine/quant"
)

// Matrix is a weight matrix stored row by row in one of ggml's formats: Rows
// output features, each a row of Cols elements (Cols is ggml's ne0).
type Matrix struct {
	Type    quant.Type
	Rows    int
	Cols    int
	RowSize int // bytes per row
	Data    []byte
	// Packed: Data holds the rows in groups of 4 in the packed layout (see
	// Pack), not one after another; each group takes 4·RowSize bytes.
	Packed bool
}

// NewMatrix checks that data holds rows×cols elements of type t.
func NewMatrix(t quant.Type, rows, cols int, data []byte) (*Matrix, error) {
	if err := t.CheckRow(cols); err != nil {
		return nil, err
	}
	rs := t.RowSize(cols)
	if len(data) != rows*rs {
		return nil, fmt.Errorf("matrix %s %dx%d needs %d bytes, have %d", t, rows, cols, rows*rs, len(data))
	}
	return &Matrix{Type: t, Rows: rows, Cols: cols, RowSize: rs, Data: data}, nil
}

// Slice returns rows [lo,hi) as a matrix sharing m's data. In a packed
// matrix lo and hi must be multiples of 4 (whole groups).
func (m *Matrix) Slice(lo, hi int) *Matrix {
	if m.Packed && (lo%PackRows != 0 || hi%PackRows != 0) {
		panic(fmt.Sprintf("kernels.Matrix.Slice: rows [%d,%d) split a packed group", lo, hi))
	}
	return &Matrix{Type: m.Type, Rows: hi - lo, Cols: m.Cols, RowSize: m.RowSize, Data: m.Data[lo*m.RowSize : hi*m.RowSize], Packed: m.Packed}
}

// Row returns the bytes of row r of a matrix that is not packed.
func (m *Matrix) Row(r int) []byte {
	if m.Packed {
		panic("kernels.Matrix.Row: the matrix is packed")
	}
	return m.Data[r*m.RowSize : (r+1)*m.RowSize]
}

// CopyRows writes rows [r0,r1) of m to dst one after another, in the
// file's layout (unpacking a packed matrix).
func (m *Matrix) CopyRows(r0, r1 int, dst []byte) {
	if !m.Packed {
		copy(dst, m.Data[r0*m.RowSize:r1*m.RowSize])
		return
	}
	g0, g1 := r0/PackRows*PackRows, (r1+PackRows-1)/PackRows*PackRows
	if g0 == r0 && g1 == r1 {
		unpackMatrixRows(m, r0, r1, dst)
		return
	}
	tmp := make([]byte, (g1-g0)*m.RowSize)
	unpackMatrixRows(m, g0, g1, tmp)
	copy(dst, tmp[(r0-g0)*m.RowSize:(r1-g0)*m.RowSize])
}

// ActType is the format activations take in a product with m.
func (m *Matrix) ActType() quant.Type { return quant.VecDotType(m.Type) }

// ActRowSize is the bytes one quantized activation row takes.
func (m *Matrix) ActRowSize() int { return m.ActType().RowSize(m.Cols) }

// ---- activation quantization

type quantJob struct {
	t    quant.Type
	x    []float32
	cols int
	dst  []byte
	rs   int
	asm  func(x *float32, dst *byte, nb int)
	bl   int
	fn   func(lo, hi int)
}

var quantJobs = sync.Pool{New: func() any {
	j := new(quantJob)
	j.fn = j.do
	return j
}}

func (j *quantJob) do(lo, hi int) {
	for i := lo; i < hi; i++ {
		x, dst := j.x[i*j.cols:(i+1)*j.cols], j.dst[i*j.rs:(i+1)*j.rs]
		if j.t == quant.F16 {
			F32ToF16(unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), j.cols), x)
			continue
		}
		if j.asm != nil {
			if nb := j.cols / j.bl; nb > 0 {
				j.asm(&x[0], &dst[0], nb)
			}
			continue
		}
		quant.QuantizeRow(j.t, x, dst)
	}
}

// QuantizeActs converts n activation rows of cols floats each (x, row-major)
// to the format t, writing n rows of t.RowSize(cols) bytes to dst. The bytes
// are those of quant.QuantizeRow (Q8_0 and Q8_K have platform versions).
func QuantizeActs(p *Pool, t quant.Type, x []float32, n, cols int, dst []byte) {
	if n <= 0 {
		return
	}
	if err := t.CheckRow(cols); err != nil {
		panic("kernels.QuantizeActs: " + err.Error())
	}
	rs := t.RowSize(cols)
	if len(x) < n*cols || len(dst) < n*rs {
		panic(fmt.Sprintf("kernels.QuantizeActs: %d rows of %d need %d floats and %d bytes, have %d and %d", n, cols, n*cols, n*rs, len(x), len(dst)))
	}
	j := quantJobs.Get().(*quantJob)
	j.t, j.x, j.cols, j.dst, j.rs, j.asm = t, x, cols, dst, rs, nil
	switch t {
	case quant.Q8_0:
		j.asm, j.bl = cur.q8_0, quant.QK
	case quant.Q8_K:
		j.asm, j.bl = cur.q8_K, quant.QKK
	}
	p.Run(n, 1, j.fn)
	j.x, j.dst = nil, nil
	quantJobs.Put(j)
}

// ---- matrix product

// mmJob holds one MatMul's parameters, so that the pool runs a method value
// made once instead of a fresh closure.
type mmJob struct {
	m     *Matrix
	ks    *kset
	xq    []byte
	ars   int
	n     int
	out   []float32
	ldo   int
	group int // rows per work unit

	tile   bool
	tileFn dotFn  // the tile kernel for this call (ks.tile or ks.tile4)
	tileC  int    // its activation count
	nt     int    // activations done by tiles: tileC-tiles, then maybe one tile4
	nr     int    // activations after those done by a rest tile (kset.rest)
	ta     []byte // tile activations (xq, or xq widened to float32)
	tas    int
	f32    []float32 // scratch for the widened activations
	u8     []byte    // scratch for the prepared activations of tileU8 kernels
	u8nb   int       // blocks per row prepared by prepU8 into ta (0: none)

	aux   []byte // per-activation data of the rowsX kernels
	auxRS int

	// unpack: m is packed and the kernel set has no packed kernels; each
	// worker unpacks unpackRows rows at a time into its scr.
	unpack bool
	scr    [][]byte

	// panel: the batch runs on the panel kernels (ks.panel); each worker
	// packs rows into its scr.
	panel bool

	fnp func(w, lo, hi int)
	// fnwd and fnpp widen or prepare activations [lo,hi) (widenRows,
	// prepRows), spread over the pool.
	fnwd, fnpp func(lo, hi int)

	fn  func(lo, hi int)
	fnw func(w, lo, hi int)
}

// unpackRows is how many rows of a packed matrix a worker unpacks at a time
// when the kernels cannot read the packed layout (a multiple of every
// work-unit size).
const unpackRows = 64

var mmJobs = sync.Pool{New: func() any {
	j := new(mmJob)
	j.fn = j.do
	j.fnw = j.doUnpacked
	j.fnp = j.doPanel
	j.fnwd = j.widenRows
	j.fnpp = j.prepRows
	return j
}}

// MatMul computes out[i*ldo + r] = dot(row r of m, activation row i) for the
// n activation rows in xq (already in m.ActType(), m.ActRowSize() bytes each).
//
// The rows are split between the pool's threads in groups. With platform
// kernels, n <= 3 (decode) runs a kernel that streams several weight rows
// against one activation row; larger n runs a tile kernel that uses each
// loaded weight block for several activation rows. It does not allocate.
func MatMul(p *Pool, m *Matrix, xq []byte, n int, out []float32, ldo int) {
	if n <= 0 || m.Rows <= 0 {
		return
	}
	j := newMMJob(p, m, xq, n, out, ldo, nil)
	j.run(p)
	j.release()
}

// maxFused is how many products MatMuls runs as one pool job.
const maxFused = 4

// fusedJob runs the row groups of several products as one pool job.
type fusedJob struct {
	js  [maxFused]*mmJob
	off [maxFused + 1]int // job k's units are [off[k], off[k+1])
	k   int
	fn  func(lo, hi int)
}

var fusedJobs = sync.Pool{New: func() any {
	f := new(fusedJob)
	f.fn = f.do
	return f
}}

func (f *fusedJob) do(lo, hi int) {
	for k := 0; k < f.k; k++ {
		a, b := max(lo, f.off[k]), min(hi, f.off[k+1])
		if a < b {
			f.js[k].do(a-f.off[k], b-f.off[k])
		}
	}
}

// MatMuls computes the products of up to four matrices with the same n
// activation rows xq (in the matrices' common activation format), ms[k]'s
// into outs[k] with rows ms[k].Rows apart; a nil matrix is skipped. In
// decode their row groups go to the pool as one job, so the threads meet
// once instead of once per matrix (a layer's q, k and v projections; its
// gate and up). Otherwise, or when a product takes the panel or unpacking
// path, they run one after another as MatMul would. It does not allocate.
func MatMuls(p *Pool, xq []byte, n int, ms []*Matrix, outs [][]float32) {
	if len(ms) > maxFused || len(outs) < len(ms) {
		panic(fmt.Sprintf("kernels.MatMuls: %d matrices (at most %d) and %d outputs", len(ms), maxFused, len(outs)))
	}
	if n <= 0 {
		return
	}
	f := fusedJobs.Get().(*fusedJob)
	f.k = 0
	plain := true
	grain := 1
	var u8src *mmJob
	for i, m := range ms {
		if m == nil || m.Rows <= 0 {
			continue
		}
		if f.k > 0 && m.ActType() != f.js[0].m.ActType() {
			panic(fmt.Sprintf("kernels.MatMuls: activation formats %v and %v differ", f.js[0].m.ActType(), m.ActType()))
		}
		j := newMMJob(p, m, xq, n, outs[i], m.Rows, u8src)
		if u8src == nil && j.u8nb > 0 {
			u8src = j // the others reuse its prepared activations
		}
		f.js[f.k] = j
		f.off[f.k+1] = f.off[f.k] + j.units()
		f.k++
		plain = plain && !j.panel && !j.unpack
		grain = max(grain, 32/j.group)
	}
	if plain && f.k > 1 {
		p.Run(f.off[f.k], grain, f.fn)
	} else {
		for _, j := range f.js[:f.k] {
			j.run(p)
		}
	}
	for k := range f.js[:f.k] {
		f.js[k].release()
		f.js[k] = nil
	}
	fusedJobs.Put(f)
}

// newMMJob checks a product's arguments and prepares its job (kernels,
// prepared activations); run runs it, release returns it.
//
// share, when not nil, is an earlier job of the same call on the same
// activations: its u8 layout is reused instead of prepared again.
func newMMJob(p *Pool, m *Matrix, xq []byte, n int, out []float32, ldo int, share *mmJob) *mmJob {
	ars := m.ActRowSize()
	if len(xq) < n*ars {
		panic(fmt.Sprintf("kernels.MatMul: %d activation rows need %d bytes, have %d", n, n*ars, len(xq)))
	}
	if len(out) < (n-1)*ldo+m.Rows || (n > 1 && ldo < m.Rows) {
		panic(fmt.Sprintf("kernels.MatMul: output of %d floats too short for %d rows x %d (ldo %d)", len(out), n, m.Rows, ldo))
	}
	if len(m.Data) < m.Rows*m.RowSize || m.RowSize < m.Type.RowSize(m.Cols) {
		panic(fmt.Sprintf("kernels.MatMul: matrix %v %dx%d data too short", m.Type, m.Rows, m.Cols))
	}
	j := mmJobs.Get().(*mmJob)
	j.m, j.xq, j.ars, j.n, j.out, j.ldo = m, xq, ars, n, out, ldo
	j.ks = kernelsFor(m.Type)
	j.unpack = false
	j.u8nb = 0
	if m.Packed {
		if m.Rows%PackRows != 0 {
			panic(fmt.Sprintf("kernels.MatMul: packed matrix of %d rows", m.Rows))
		}
		if j.ks != nil && j.ks.packed != nil {
			j.ks = j.ks.packed
		} else {
			j.unpack = true
		}
	}
	j.group, j.tile, j.panel = 16, false, false
	if ks := j.ks; ks != nil && ks.panel != nil && !batchInvariant && !m.Packed && n >= ks.panel.minN && m.Cols >= ks.panel.blockLen {
		j.panel = true
		j.prepPanel(p)
	}
	if ks := j.ks; ks != nil && !j.panel {
		j.group = ks.rowsR
		j.tileFn, j.tileC = ks.tile, ks.tileC
		// tileC-tiles are followed by one tile4 when 4 or more activations
		// are left (see do). A small batch runs tile4 throughout when it is
		// below tileC, or a multiple of 4 that tileC-tiles and one tile4
		// would not cover (with tileC 6: 8 = 4+4, not 6+2; 16 = 6+6+4).
		if ks.tile4 != nil && n >= 4 && (n < ks.tileC || n%4 == 0 && n%ks.tileC%4 != 0 && n < 64) {
			j.tileFn, j.tileC = ks.tile4, 4
		}
		if ks.tile != nil && n >= j.tileC && m.Cols >= ks.blockLen && (!batchInvariant || ks.tileExact) {
			j.tile = true
			j.nt = n / j.tileC * j.tileC
			if ks.tile4 != nil && n-j.nt >= 4 {
				j.nt += 4
			}
			j.nr = 0
			if k := n - j.nt; k < len(ks.rest) && ks.rest[k] != nil {
				j.nr = k
			}
			j.group = max(ks.rowsR, ks.tileR)
			j.ta, j.tas = xq, ars
			if ks.tileF32 && m.Type != quant.F32 {
				j.widen(p)
			}
			if ks.tileU8 {
				j.prepU8(m.Cols/quant.QK, share)
			}
			if ks.tileK8 {
				j.pairK8(m.Cols / quant.QKK)
			}
		}
	}
	if ks := j.ks; ks != nil && ks.rowsU8 != nil && !j.tile && !j.panel {
		j.prepU8(m.Cols/quant.QK, share)
	}
	if ks := j.ks; ks != nil && ks.rowsX != nil && ks.rowsU8 == nil && (j.panel && m.Rows%j.ks.panel.R != 0 || !j.panel && (!j.tile || j.nt+j.nr < n)) {
		nb := m.Cols / ks.blockLen
		j.auxRS = auxSize(nb)
		if cap(j.aux) < n*j.auxRS {
			j.aux = make([]byte, n*j.auxRS)
		}
		j.aux = j.aux[:n*j.auxRS]
		for c := 0; c < n; c++ {
			ks.auxPrep(xq[c*ars:(c+1)*ars], nb, j.aux[c*j.auxRS:(c+1)*j.auxRS])
		}
	}
	for (j.panel || j.unpack) && len(j.scr) < p.Threads() {
		j.scr = append(j.scr, nil) // per-worker scratch
	}
	return j
}

// units is the number of row groups of the product (j.group rows each).
func (j *mmJob) units() int { return (j.m.Rows + j.group - 1) / j.group }

func (j *mmJob) run(p *Pool) {
	m := j.m
	if j.panel {
		p.RunWorker((m.Rows+j.ks.panel.group-1)/j.ks.panel.group, 1, j.fnp)
	} else if j.unpack {
		p.RunWorker(j.units(), max(1, 32/j.group), j.fnw)
	} else {
		p.Run(j.units(), max(1, 32/j.group), j.fn)
	}
}

func (j *mmJob) release() {
	j.m, j.xq, j.out, j.ta = nil, nil, nil, nil
	mmJobs.Put(j)
}

// u8Block is the size of a prepared 32-element activation block: a float32
// scale, then the quants plus 128 as unsigned bytes.
const u8Block = 36

// prepU8 lays out the Q8_0 activations for the tileU8 kernels (nb blocks per
// row), which multiply unsigned activation bytes by signed weight bytes.
func (j *mmJob) prepU8(nb int, share *mmJob) {
	n, rs := j.n, nb*u8Block
	if share != nil && share.u8nb == nb && share.n == n {
		j.ta, j.tas, j.u8nb = share.ta, share.tas, nb
		return
	}
	if cap(j.u8) < n*rs {
		j.u8 = make([]byte, n*rs)
	}
	u := j.u8[:n*rs]
	for i := 0; i < n; i++ {
		prepU8Row(j.xq[i*j.ars:], u[i*rs:], nb)
	}
	j.ta, j.tas, j.u8nb = u, rs, nb
}

// prepU8Row lays out nb Q8_0 blocks of src in dst as prepU8 does, with the
// level's platform routine when it has one. It runs on the calling thread
// before the workers start, at each of a layer's seven products: in
// Qwen-shaped Q8_0 decode on 2 threads the Go loop took 2.4% of all CPU
// samples (half of the caller's serial time, with the worker waiting),
// the AVX2 routine too little to show in the profile.
func prepU8Row(src, dst []byte, nb int) {
	if nb <= 0 {
		return
	}
	if cur.prepU8 != nil {
		cur.prepU8(&src[0], &dst[0], nb)
		return
	}
	for b := 0; b < nb; b++ {
		s, d := src[b*quant.Q8_0.BlockSize():], dst[b*u8Block:]
		binary.LittleEndian.PutUint32(d, math.Float32bits(quant.FP16ToFP32(binary.LittleEndian.Uint16(s))))
		for k := 0; k < quant.QK; k += 8 {
			binary.LittleEndian.PutUint64(d[4+k:], binary.LittleEndian.Uint64(s[2+k:])^0x8080808080808080)
		}
	}
}

// k8Pairs is the order of the 32-byte sub-blocks in a paired Q8_K block:
// the AVX-512 K-quant tiles hold sub-blocks (0,2), (1,3), (4,6), (5,7) of a
// weight block in the halves of one vector.
var k8Pairs = [8]int{0, 2, 1, 3, 4, 6, 5, 7}

// pairK8 lays out the Q8_K activations (nb blocks per row) for the tileK8
// kernels: each block as it is, but its sub-blocks in k8Pairs order.
func (j *mmJob) pairK8(nb int) {
	n, rs := j.n, nb*quant.BlockQ8_K
	if cap(j.u8) < n*rs {
		j.u8 = make([]byte, n*rs)
	}
	u := j.u8[:n*rs]
	for i := 0; i < n; i++ {
		src, dst := j.xq[i*j.ars:i*j.ars+rs], u[i*rs:(i+1)*rs]
		for b := 0; b < nb; b++ {
			s, d := src[b*quant.BlockQ8_K:(b+1)*quant.BlockQ8_K], dst[b*quant.BlockQ8_K:(b+1)*quant.BlockQ8_K]
			copy(d[:4], s[:4])
			for k, sb := range k8Pairs {
				copy(d[4+32*k:4+32*k+32], s[4+32*sb:4+32*sb+32])
			}
			copy(d[260:], s[260:])
		}
	}
	j.ta, j.tas = u, rs
}

// widen converts F16/BF16 activations to float32 for the float tile and
// panel kernels (exactly: both widen without rounding), and copies F32 ones.
// Rows are 16 floats longer than cols: a tile reads several rows at the
// same column, and rows a power of two bytes apart would all fall in the
// same L1 sets (the 16x6 float panel kernel ran at 30 GFLOP/s with rows
// 4 KiB apart and at 85 with them padded).
func (j *mmJob) widen(p *Pool) {
	cols, n := j.m.Cols, j.n
	st := cols + 16
	if cap(j.f32) < n*st {
		j.f32 = make([]float32, n*st)
	}
	f := j.f32[:n*st]
	j.ta = unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
	j.tas = 4 * st
	p.Run(n, 4, j.fnwd)
}

// widenRows widens activations [lo,hi) into j.ta (see widen).
func (j *mmJob) widenRows(lo, hi int) {
	cols := j.m.Cols
	f := unsafe.Slice((*float32)(unsafe.Pointer(&j.ta[0])), len(j.ta)/4)
	for i := lo; i < hi; i++ {
		d := f[i*j.tas/4 : i*j.tas/4+cols]
		switch j.m.Type {
		case quant.F32:
			for k := range d {
				d[k] = math.Float32frombits(binary.LittleEndian.Uint32(j.xq[i*j.ars+4*k:]))
			}
		case quant.BF16:
			for k, v := range halves(j.xq[i*j.ars:], cols) {
				d[k] = quant.BF16ToFP32(v)
			}
		default:
			for k, v := range halves(j.xq[i*j.ars:], cols) {
				d[k] = quant.FP16ToFP32(v)
			}
		}
	}
}

func (j *mmJob) do(lo, hi int) {
	j.rows(j.m.Data, 0, lo*j.group, min(hi*j.group, j.m.Rows))
}

// doUnpacked is do for a packed matrix whose kernels read rows: worker w
// unpacks the rows in pieces into its scratch space.
func (j *mmJob) doUnpacked(w, lo, hi int) {
	m := j.m
	r0, r1 := lo*j.group, min(hi*j.group, m.Rows)
	if need := unpackRows * m.RowSize; cap(j.scr[w]) < need {
		j.scr[w] = make([]byte, need)
	}
	for r := r0; r < r1; r += unpackRows {
		e := min(r+unpackRows, r1)
		buf := j.scr[w][:(e-r)*m.RowSize]
		unpackMatrixRows(m, r, e, buf)
		j.rows(buf, r, r, e)
	}
}

// rows computes output rows [r0,r1); row r's bytes are at (r-base)·RowSize
// in wd.
func (j *mmJob) rows(wd []byte, base, r0, r1 int) {
	m := j.m
	ks := j.ks
	if ks == nil {
		j.generic(wd, base, r0, r1)
		return
	}
	nb := m.Cols / ks.blockLen
	if nb > 0 {
		if j.tile {
			R, C := ks.tileR, j.tileC
			nc, nt := j.n/C*C, j.nt
			rt := r0 + (r1-r0)/R*R
			w, ws := wd, m.RowSize
			// Activations go in slabs of about 128 KiB, so that a slab and the
			// chunk's rows both stay in L2 while every row meets every column.
			slab := max(C, (128<<10)/j.tas/C*C)
			late := R >= ks.rowsR
			for c0 := 0; c0 < nc; c0 += slab {
				c1 := min(c0+slab, nc)
				for r := r0; r < rt; r += R {
					for c := c0; c < c1; c += C {
						j.tileFn(&w[(r-base)*ws], ws, &j.ta[c*j.tas], j.tas, nb, &j.out[c*j.ldo+r], j.ldo)
					}
					// four activations left over: with the last slab,
					// while the rows are in L1
					if c1 == nc && nt > nc {
						ks.tile4(&w[(r-base)*ws], ws, &j.ta[nc*j.tas], j.tas, nb, &j.out[nc*j.ldo+r], j.ldo)
					}
					if c1 == nc && j.nr > 0 {
						ks.rest[j.nr](&w[(r-base)*ws], ws, &j.ta[nt*j.tas], j.tas, nb, &j.out[nt*j.ldo+r], j.ldo)
					}
					// the activations no tile takes (a ninth decoding
					// sequence), by the decode kernels while the rows are
					// in L1: a pass of their own after the tiles read the
					// weights from memory again, and a decode step of 9
					// sequences cost 1.5 of 8 (TinyLlama Q4_0, one core)
					if c1 == nc && late {
						j.decode(wd, base, r, r+R, nt+j.nr, j.n, nb)
					}
				}
			}
			if late {
				j.decode(wd, base, rt, r1, 0, j.n, nb)
			} else {
				// tiles of one row (K-quants): the decode kernels' rows
				// go four at a time, in a pass of their own
				j.decode(wd, base, rt, r1, 0, nt+j.nr, nb)
				j.decode(wd, base, r0, r1, nt+j.nr, j.n, nb)
			}
		} else {
			j.decode(wd, base, r0, r1, 0, j.n, nb)
		}
	} else {
		for c := 0; c < j.n; c++ {
			clear(j.out[c*j.ldo+r0 : c*j.ldo+r1])
		}
	}
	if ks.tail {
		j.tails(wd, base, r0, r1, nb*ks.blockLen)
	}
}

// tails adds the products of the columns from k0 on, which the float
// kernels leave out (not a whole block), for rows [r0,r1).
func (j *mmJob) tails(wd []byte, base, r0, r1, k0 int) {
	m := j.m
	if k0 >= m.Cols {
		return
	}
	for c := 0; c < j.n; c++ {
		a := j.xq[c*j.ars : (c+1)*j.ars]
		for r := r0; r < r1; r++ {
			j.out[c*j.ldo+r] += floatTail(m.Type, wd[(r-base)*m.RowSize:(r-base+1)*m.RowSize], a, k0, m.Cols)
		}
	}
}

// decode runs the multi-row kernel on rows [r0,r1) x activations [c0,c1),
// and the one-row kernel on the rows left over (row r at (r-base)·RowSize in
// w).
func (j *mmJob) decode(w []byte, base, r0, r1, c0, c1, nb int) {
	if r0 >= r1 || c0 >= c1 {
		return
	}
	ks, ws := j.ks, j.m.RowSize
	R := ks.rowsR
	r := r0
	if ks.rowsU8 != nil {
		for ; r+4 <= r1; r += 4 {
			for c := c0; c < c1; c++ {
				ks.rowsU8(&w[(r-base)*ws], ws, &j.ta[c*j.tas], 0, nb, &j.out[c*j.ldo+r], 0)
			}
		}
	}
	if ks.rowsU8 == nil && ks.rowsX8 != nil {
		for ; r+8 <= r1; r += 8 {
			for c := c0; c < c1; c++ {
				ks.rowsX8(&w[(r-base)*ws], ws, &j.xq[c*j.ars], &j.aux[c*j.auxRS], nb, &j.out[c*j.ldo+r])
			}
		}
	}
	if ks.rowsU8 == nil && ks.rowsX != nil {
		for ; r+4 <= r1; r += 4 {
			for c := c0; c < c1; c++ {
				ks.rowsX(&w[(r-base)*ws], ws, &j.xq[c*j.ars], &j.aux[c*j.auxRS], nb, &j.out[c*j.ldo+r])
			}
		}
	}
	for ; r+R <= r1; r += R {
		for c := c0; c < c1; c++ {
			ks.rows(&w[(r-base)*ws], ws, &j.xq[c*j.ars], 0, nb, &j.out[c*j.ldo+r], 0)
		}
	}
	for ; r < r1; r++ {
		for c := c0; c < c1; c++ {
			j.out[c*j.ldo+r] = ks.one(&w[(r-base)*ws], &j.xq[c*j.ars], nb)
		}
	}
}

func (j *mmJob) generic(wd []byte, base, r0, r1 int) {
	m := j.m
	const rowBlock = 16
	for b := r0; b < r1; b += rowBlock {
		e := min(b+rowBlock, r1)
		for i := 0; i < j.n; i++ {
			a := j.xq[i*j.ars : (i+1)*j.ars]
			o := j.out[i*j.ldo:]
			for r := b; r < e; r++ {
				o[r] = vecDotGeneric(m.Type, m.Cols, wd[(r-base)*m.RowSize:(r-base+1)*m.RowSize], a)
			}
		}
	}
}
