package vulkan

import (
	"fmt"
	"strings"

	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// Matrix is a weight matrix in device memory, in its GGUF block format:
// rows one after another, in as many buffers as the device's largest
// storage binding needs.
type Matrix struct {
	Type          quant.Type
	Rows, Cols    int
	RowSize       int
	parts         []matPart
	kernel        *vk.Kernel
	tiled         *vk.Kernel // the 32×32-tile product, for more than 8 vectors
	rowsPerGroup  int
	bytesUploaded uint64
}

type matPart struct {
	buf    *vk.Buf
	r0, r1 int
}

// Upload copies m to the device.
func (g *GPU) Upload(m *kernels.Matrix) (*Matrix, error) {
	if !Supports(m.Type) {
		return nil, fmt.Errorf("%s: no %v kernel on the GPU", g.ctx.GPU.Name, m.Type)
	}
	// threads per row: a power of two, each taking at least 8 of the row's
	// 32-value chunks, up to the workgroup; the workgroup's other threads
	// take more rows (a workgroup per row of a short row costs more than
	// its arithmetic: 10x on lavapipe's output head)
	tpr := 1
	for tpr < wg && 8*tpr <= (m.Cols+31)/32 {
		tpr *= 2
	}
	k, err := g.kernel(matvecKernel(m.Type), 3, 40, wg)
	if err != nil {
		return nil, err
	}
	mm, err := g.kernel("matmul_"+strings.ToLower(m.Type.String()), 3, 36)
	if err != nil {
		return nil, err
	}
	d := &Matrix{Type: m.Type, Rows: m.Rows, Cols: m.Cols, RowSize: m.RowSize, kernel: k, tiled: mm, rowsPerGroup: wg / tpr}
	// rows per buffer: what one binding reaches, less a word of slack for
	// the kernels' unaligned reads past a block
	per := int((g.maxBinding - 4) / uint64(m.RowSize))
	if per < 1 {
		return nil, fmt.Errorf("a row of %d bytes exceeds the device's storage binding of %d", m.RowSize, g.maxBinding)
	}
	var tmp []byte
	for r0 := 0; r0 < m.Rows; r0 += per {
		r1 := min(r0+per, m.Rows)
		size := uint64((r1-r0)*m.RowSize+7) &^ 3
		b, err := g.ctx.NewBuffer(size, false)
		if err != nil {
			d.Free()
			return nil, fmt.Errorf("uploading a %v matrix of %d×%d: %w", m.Type, m.Rows, m.Cols, err)
		}
		d.parts = append(d.parts, matPart{buf: b, r0: r0, r1: r1})
		n := (r1 - r0) * m.RowSize
		if dst := b.Mapped(); dst != nil {
			m.CopyRows(r0, r1, dst[:n])
		} else {
			tmp = append(tmp[:0], make([]byte, n)...)
			m.CopyRows(r0, r1, tmp)
			if err := b.Write(0, tmp); err != nil {
				d.Free()
				return nil, err
			}
		}
		d.bytesUploaded += size
	}
	return d, nil
}

// Bytes is the device memory the matrix takes.
func (m *Matrix) Bytes() uint64 { return m.bytesUploaded }

// Free releases the matrix's device memory.
func (m *Matrix) Free() {
	for _, p := range m.parts {
		p.buf.Free()
	}
	m.parts = nil
}

// Vec is n vectors of float32 in a device buffer: vector j at float
// Off + j·Stride.
type Vec struct {
	B           *vk.Buf
	Off, Stride int
}

// tiledFrom is the number of vectors from which a product takes the tiled
// kernel (below it, the mat-vec kernel, eight vectors per dispatch).
const tiledFrom = 16

// MatVec records y[j] = W·x[j] for n vectors.
func (m *Matrix) MatVec(cmd *vk.Cmd, x Vec, n int, y Vec) {
	if n >= tiledFrom {
		for _, p := range m.parts {
			rows := p.r1 - p.r0
			push := []uint32{uint32(rows), uint32(m.Cols), uint32(n), uint32(m.RowSize), 0,
				uint32(x.Off), uint32(x.Stride), uint32(y.Off + p.r0), uint32(y.Stride)}
			cmd.Dispatch(m.tiled, uint32((rows+31)/32), uint32((n+31)/32), 1, push, vk.Whole(p.buf), vk.Whole(x.B), vk.Whole(y.B))
		}
		return
	}
	for j0 := 0; j0 < n; j0 += 8 {
		nj := min(8, n-j0)
		for _, p := range m.parts {
			rows := p.r1 - p.r0
			gx, gy := groups2((rows + m.rowsPerGroup - 1) / m.rowsPerGroup)
			push := []uint32{uint32(rows), uint32(m.Cols), uint32(nj), uint32(m.RowSize), 0,
				uint32(x.Off + j0*x.Stride), uint32(x.Stride), uint32(y.Off + j0*y.Stride + p.r0), uint32(y.Stride), uint32(wg / m.rowsPerGroup)}
			cmd.Dispatch(m.kernel, uint32(gx), uint32(gy), 1, push, vk.Whole(p.buf), vk.Whole(x.B), vk.Whole(y.B))
		}
	}
}
