package kernels

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"shoal/engine/quant"
)

// PackRows is the number of rows in a group of a packed matrix.
const PackRows = 4

// The packed layout holds a Q4_0 or Q8_0 matrix in groups of PackRows rows,
// each group in the same 4·RowSize bytes the rows take one after another:
//
//   - first the quants of block 0 of the 4 rows, then of block 1, and so on:
//     per block, one 64-byte vector per 16 quant bytes of a row (Q4_0 has
//     one, Q8_0 two), row r's bytes 16v..16v+15 in bytes 16r..16r+15 of
//     vector v;
//   - then the half-float scales: per block, rows 0..3 (8 bytes).
//
// So a kernel reads each vector of 4 rows' quants with one aligned load
// (the data starts on a 64-byte boundary, and groups stay aligned when
// 4·RowSize is a multiple of 64), and the 4 scales with one 8-byte load,
// where the row-by-row layout takes four 16-byte loads and inserts per
// vector and four 2-byte loads per block.

// packQuant reports the quant bytes per block of a type that has a packed
// layout (0: none).
func packQuant(t quant.Type) int {
	switch t {
	case quant.Q4_0:
		return quant.QK / 2
	case quant.Q8_0:
		return quant.QK
	}
	return 0
}

// Pack returns m in the packed layout, in newly allocated memory, when the
// active kernel set has kernels that read it for m's type and m's rows
// divide into groups; else m itself. A packed matrix gives the same
// products as m on every kernel set (those without packed kernels unpack
// rows as they go), but its rows cannot be read with Row.
func Pack(m *Matrix) *Matrix {
	ks := kernelsFor(m.Type)
	if m.Packed || ks == nil || ks.packed == nil || m.Rows%PackRows != 0 || m.Rows == 0 {
		return m
	}
	return PackMatrix(m)
}

// Resident returns m as the engine keeps a loaded matrix: in the packed
// layout where the active kernels read one (Pack), else its bytes copied to
// newly allocated, 64-byte aligned memory (in transparent huge pages where
// Linux gives them on request: residentBytes). Decoding streams every weight
// from DRAM once per token, and one core streams the process's own memory
// faster than a file's pages mapped from the page cache (AMD EPYC, Zen 4,
// one thread, all of a TinyLlama-shaped model's matrices in turn, 4 KB
// pages: F16 18.7 -> 23.6 GB/s, Q4_K_M 16.8-18.8 -> 21.9; llama.cpp copies
// the weights of its repacked formats too). The loader then drops the
// original's file pages (gguf.File.Release), so the weights take the same
// memory.
func Resident(m *Matrix) *Matrix {
	if p := Pack(m); p != m {
		return p
	}
	c := *m
	c.Data = residentBytes(len(m.Data))
	parallelCopy(c.Data, m.Data)
	return &c
}

// parallelCopy copies src to dst on every core: copying a model's weights
// is bound by the page faults of the new memory, which cores take at the
// same time.
func parallelCopy(dst, src []byte) {
	const chunk = 4 << 20
	n := min(runtime.NumCPU(), (len(src)+chunk-1)/chunk)
	if n <= 1 {
		copy(dst, src)
		return
	}
	per := (len(src)/n + chunk - 1) / chunk * chunk
	var wg sync.WaitGroup
	for lo := 0; lo < len(src); lo += per {
		hi := min(lo+per, len(src))
		wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
	}
	wg.Wait()
}

// PackMatrix returns m in the packed layout whatever the kernel set (for
// tests and benchmarks; the engine uses Pack). m's type must have a packed
// layout (Q4_0, Q8_0) and its rows must be a multiple of PackRows.
func PackMatrix(m *Matrix) *Matrix {
	qb := packQuant(m.Type)
	if qb == 0 || m.Rows%PackRows != 0 || m.Packed || m.RowSize != m.Type.RowSize(m.Cols) {
		panic(fmt.Sprintf("kernels.PackMatrix: %v %dx%d (packed %v) has no packed layout", m.Type, m.Rows, m.Cols, m.Packed))
	}
	gs := PackRows * m.RowSize
	data := residentBytes(m.Rows * m.RowSize)
	for g := 0; g < m.Rows/PackRows; g++ {
		packGroup(qb, m.Cols/quant.QK, m.Data[g*gs:(g+1)*gs], data[g*gs:(g+1)*gs], false)
	}
	return &Matrix{Type: m.Type, Rows: m.Rows, Cols: m.Cols, RowSize: m.RowSize, Data: data, Packed: true}
}

// alignedBytes returns n zeroed bytes starting on a 64-byte boundary.
func alignedBytes(n int) []byte {
	b := make([]byte, n+63)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 63)
	return b[off : off+n : off+n]
}

// packGroup lays out 4 rows of nb blocks (rows, one after another; blocks
// of a 2-byte scale and qb quant bytes) in the packed layout (packed), or
// with unpack the other way round.
func packGroup(qb, nb int, rows, packed []byte, unpack bool) {
	bs := 2 + qb
	rs := nb * bs
	scales := packed[nb*PackRows*qb:]
	move := func(row, pk []byte) {
		if unpack {
			copy(row, pk)
		} else {
			copy(pk, row)
		}
	}
	for r := 0; r < PackRows; r++ {
		for b := 0; b < nb; b++ {
			blk := rows[r*rs+b*bs : r*rs+(b+1)*bs]
			move(blk[:2], scales[8*b+2*r:8*b+2*r+2])
			q := packed[b*PackRows*qb:]
			for v := 0; v < qb/16; v++ {
				move(blk[2+16*v:2+16*v+16], q[64*v+16*r:64*v+16*r+16])
			}
		}
	}
}

// unpackMatrixRows writes rows [r0,r1) of the packed matrix m (r0 and r1
// multiples of PackRows) to dst row after row.
func unpackMatrixRows(m *Matrix, r0, r1 int, dst []byte) {
	qb, nb, gs := packQuant(m.Type), m.Cols/quant.QK, PackRows*m.RowSize
	for g := r0 / PackRows; g < r1/PackRows; g++ {
		o := (g - r0/PackRows) * gs
		packGroup(qb, nb, dst[o:o+gs], m.Data[g*gs:(g+1)*gs], true)
	}
}
