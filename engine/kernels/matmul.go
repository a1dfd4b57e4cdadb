package kernels

import (
	"fmt"

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

// Slice returns rows [lo,hi) as a matrix sharing m's data.
func (m *Matrix) Slice(lo, hi int) *Matrix {
	return &Matrix{Type: m.Type, Rows: hi - lo, Cols: m.Cols, RowSize: m.RowSize, Data: m.Data[lo*m.RowSize : hi*m.RowSize]}
}

// Row returns the bytes of row r.
func (m *Matrix) Row(r int) []byte { return m.Data[r*m.RowSize : (r+1)*m.RowSize] }

// ActType is the format activations take in a product with m.
func (m *Matrix) ActType() quant.Type { return quant.VecDotType(m.Type) }

// ActRowSize is the bytes one quantized activation row takes.
func (m *Matrix) ActRowSize() int { return m.ActType().RowSize(m.Cols) }

// QuantizeActs converts n activation rows of cols floats each (x, row-major)
// to the format t, writing n rows of t.RowSize(cols) bytes to dst.
func QuantizeActs(p *Pool, t quant.Type, x []float32, n, cols int, dst []byte) {
	rs := t.RowSize(cols)
	p.Run(n, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			quant.QuantizeRow(t, x[i*cols:(i+1)*cols], dst[i*rs:(i+1)*rs])
		}
	})
}

// MatMul computes out[i*ldo + r] = dot(row r of m, activation row i) for the
// n activation rows in xq (already in m.ActType(), m.ActRowSize() bytes each).
func MatMul(p *Pool, m *Matrix, xq []byte, n int, out []float32, ldo int) {
	ars := m.ActRowSize()
	const rowBlock = 16
	p.Run(m.Rows, rowBlock, func(lo, hi int) {
		for r0 := lo; r0 < hi; r0 += rowBlock {
			r1 := min(r0+rowBlock, hi)
			for i := 0; i < n; i++ {
				a := xq[i*ars : (i+1)*ars]
				o := out[i*ldo:]
				for r := r0; r < r1; r++ {
					o[r] = VecDot(m.Type, m.Cols, m.Data[r*m.RowSize:(r+1)*m.RowSize], a)
				}
			}
		}
	})
}
