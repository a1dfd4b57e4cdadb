package kernels

import (
	"encoding/binary"
	"math"
	"unsafe"

	"shoal/engine/quant"
)

// Panels: the AVX2 prefill path for Q4_0, Q8_0 and float weights.
//
// Without VNNI a row-by-row tile spends most of its instructions on
// horizontal sums, scales and activation handling per block. So for a batch
// of activations MatMul copies each 8 weight rows (floats: 16, as float32)
// into a panel, where one ymm holds the same columns of 8 rows, and the
// panel kernels multiply it by activation words broadcast to all lanes: the
// row sums build up in the lanes of one register. Packing costs one pass
// over the rows, repaid over every activation of the batch.

// panelSet describes the panel kernels of one weight type.
type panelSet struct {
	R        int      // rows per panel: 8 (quants) or 16 (floats)
	group    int      // rows a worker packs before it runs them against the activations slab by slab
	blockLen int      // elements per kernel block
	C        int      // activations per full tile
	tiles    [7]dotFn // by activation count, 1..C
	// blockBytes is the panel bytes per block.
	blockBytes int
	// pack writes R rows of nb blocks (rs bytes apart) as a panel.
	pack func(rows []byte, rs, nb int, dst []byte)
	// prep, for the quant formats, writes one Q8_0 activation row of nb
	// blocks as the kernels take it, actBytes per block. Float kernels take
	// float32 activation rows.
	prep     func(a []byte, nb int, dst []byte)
	actBytes int
	// minN is the smallest batch that takes the panel path. Packing reads
	// the rows once, repaid over the activations; against the decode
	// kernels the Q4_0 panels win from 4 activations on, the Q8_0 and float
	// ones (twice the panel bytes, or slower per product) only from about
	// 12 (8: level; 16: 1.1-1.4x, BenchmarkMatMul/*/stream).
	minN int
}

// quantPanel returns the pack function of the Q4_0 and Q8_0 panels from
// the kernel that writes them (see packQ4_0Panel and packQ8_0Panel in the
// tests for the layouts). The rows' blocks take bs bytes, the panel's pbs.
func quantPanel(f func(w *byte, ws int, nb int, dst *byte), bs, pbs int) func(rows []byte, rs, nb int, dst []byte) {
	return func(rows []byte, rs, nb int, dst []byte) {
		_ = rows[7*rs+nb*bs-1] // the kernel reads and writes within the slices
		_ = dst[nb*pbs-1]
		f(&rows[0], rs, nb, &dst[0])
	}
}

// floatPanel returns the pack function of the float panels (16 rows, per
// column the rows' 16 float32 values) from a kernel that writes 8 rows.
// The rows' elements take es bytes.
func floatPanel(f func(w *byte, ws int, nk int, dst *float32, ds int), es int) func(rows []byte, rs, nb int, dst []byte) {
	return func(rows []byte, rs, nb int, dst []byte) {
		_ = rows[15*rs+16*nb*es-1] // the kernel reads and writes within the slices
		_ = dst[1024*nb-1]
		f(&rows[0], rs, 16*nb, (*float32)(unsafe.Pointer(&dst[0])), 64)
		f(&rows[8*rs], rs, 16*nb, (*float32)(unsafe.Pointer(&dst[32])), 64)
	}
}

// prepS8 lays out a Q8_0 activation row for the Q4_0 panel kernels: per
// block 40 bytes, the scale as float32, 8 times the sum of the quants as
// int32, then the 32 quants.
func prepS8(a []byte, nb int, dst []byte) {
	for b := 0; b < nb; b++ {
		s, d := a[b*34:b*34+34], dst[b*40:b*40+40]
		binary.LittleEndian.PutUint32(d, math.Float32bits(quant.FP16ToFP32(binary.LittleEndian.Uint16(s))))
		sum := int32(0)
		for _, q := range s[2:] {
			sum += int32(int8(q))
		}
		binary.LittleEndian.PutUint32(d[4:], uint32(8*sum))
		copy(d[8:], s[2:])
	}
}

// prepI16 lays out a Q8_0 activation row for the Q8_0 panel kernels: per
// block 68 bytes, the scale as float32, then the 32 quants as int16.
func prepI16(a []byte, nb int, dst []byte) {
	for b := 0; b < nb; b++ {
		s, d := a[b*34:b*34+34], dst[b*68:b*68+68]
		binary.LittleEndian.PutUint32(d, math.Float32bits(quant.FP16ToFP32(binary.LittleEndian.Uint16(s))))
		q := (*[32]int16)(unsafe.Pointer(&d[4])) // little-endian, as the kernels read it
		for k, v := range s[2:] {
			q[k] = int16(int8(v))
		}
	}
}

// doPanel is the worker function of the panel path: units of ps.group
// rows; rows past the last whole panel go the row-by-row way.
func (j *mmJob) doPanel(w, lo, hi int) {
	m, ps := j.m, j.ks.panel
	nb := m.Cols / ps.blockLen
	r0, r1 := lo*ps.group, min(hi*ps.group, m.Rows)
	pb := nb * ps.blockBytes
	if need := ps.group / ps.R * pb; cap(j.scr[w]) < need {
		j.scr[w] = make([]byte, need)
	}
	scr := j.scr[w]
	// Activations go in slabs of about 128 KiB, so that a slab and the
	// group's panels both stay in L2 while every panel meets every column.
	C, as := ps.C, j.tas
	slab := max(C, (128<<10)/as/C*C)
	full := r0 + (r1-r0)/ps.R*ps.R
	for g := r0; g < full; g += ps.group {
		np := min(ps.group, full-g) / ps.R
		for p := 0; p < np; p++ {
			r := g + p*ps.R
			ps.pack(m.Data[r*m.RowSize:], m.RowSize, nb, scr[p*pb:(p+1)*pb])
		}
		for c0 := 0; c0 < j.n; c0 += slab {
			c1 := min(c0+slab, j.n)
			for p := 0; p < np; p++ {
				r := g + p*ps.R
				c := c0
				for ; c+C <= c1; c += C {
					ps.tiles[C](&scr[p*pb], 0, &j.ta[c*as], as, nb, &j.out[c*j.ldo+r], j.ldo)
				}
				if c < c1 {
					ps.tiles[c1-c](&scr[p*pb], 0, &j.ta[c*as], as, nb, &j.out[c*j.ldo+r], j.ldo)
				}
			}
		}
		j.tails(m.Data, 0, g, g+np*ps.R, nb*ps.blockLen)
	}
	if full < r1 {
		j.rows(m.Data, 0, full, r1)
	}
}

// prepPanel lays out the activations for the panel kernels, spread over
// the pool: prepared in j.u8 for the quant formats, as float32 for the float
// formats.
func (j *mmJob) prepPanel(p *Pool) {
	ps := j.ks.panel
	if ps.prep == nil {
		j.widen(p)
		return
	}
	n, rs := j.n, j.m.Cols/ps.blockLen*ps.actBytes
	if cap(j.u8) < n*rs {
		j.u8 = make([]byte, n*rs)
	}
	j.ta, j.tas = j.u8[:n*rs], rs
	p.Run(n, 4, j.fnpp)
}

// prepRows prepares activations [lo,hi) (see prepPanel).
func (j *mmJob) prepRows(lo, hi int) {
	ps := j.ks.panel
	nb := j.m.Cols / ps.blockLen
	for i := lo; i < hi; i++ {
		ps.prep(j.xq[i*j.ars:], nb, j.ta[i*j.tas:])
	}
}
