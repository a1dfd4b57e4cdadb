package vulkan

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// randMatrix quantizes random values to a rows×cols matrix of type t.
func randMatrix(r *rand.Rand, t quant.Type, rows, cols int) *kernels.Matrix {
	rs := t.RowSize(cols)
	data := make([]byte, rows*rs)
	row := make([]float32, cols)
	for i := range rows {
		for j := range row {
			row[j] = float32(r.NormFloat64())
		}
		quant.QuantizeRow(t, row, data[i*rs:(i+1)*rs])
	}
	m, err := kernels.NewMatrix(t, rows, cols, data)
	if err != nil {
		panic(err)
	}
	return m
}

// refMatVec is the reference: the rows dequantized by engine/quant and
// the products summed in float64. It also returns Σ|w·x| per output, the
// scale the tolerance is taken against.
func refMatVec(m *kernels.Matrix, x []float32, n int) (y, mag []float64) {
	y, mag = make([]float64, n*m.Rows), make([]float64, n*m.Rows)
	w := make([]float32, m.Cols)
	row := make([]byte, m.RowSize)
	for r := range m.Rows {
		m.CopyRows(r, r+1, row)
		quant.DequantizeRow(m.Type, row, w)
		for j := range n {
			var s, a float64
			for i, v := range w {
				p := float64(v) * float64(x[j*m.Cols+i])
				s += p
				a += math.Abs(p)
			}
			y[j*m.Rows+r], mag[j*m.Rows+r] = s, a
		}
	}
	return y, mag
}

// floats makes a mapped or staged buffer holding x.
func floats(t testing.TB, g *GPU, x []float32) *vk.Buf {
	t.Helper()
	b, err := g.ctx.NewBuffer(uint64(4*max(len(x), 1)), true)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
	}
	if err := b.Write(0, buf); err != nil {
		t.Fatal(err)
	}
	return b
}

func readFloats(t testing.TB, b *vk.Buf, n int) []float32 {
	t.Helper()
	buf := make([]byte, 4*n)
	if err := b.Read(0, buf); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out
}

// checkMatVec runs W·x for n vectors on the device and compares each
// output with the reference within 1e-5 of Σ|w·x| (float32 sums in a
// different order).
func checkMatVec(t *testing.T, g *GPU, m *kernels.Matrix, n int, r *rand.Rand) {
	t.Helper()
	x := make([]float32, n*m.Cols)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	d, err := g.Upload(m)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	xb, yb := floats(t, g, x), floats(t, g, make([]float32, n*m.Rows))
	defer xb.Free()
	defer yb.Free()
	cmd := g.ctx.Begin()
	d.MatVec(cmd, Vec{B: xb, Stride: m.Cols}, n, Vec{B: yb, Stride: m.Rows})
	if err := cmd.Submit(); err != nil {
		t.Fatal(err)
	}
	got := readFloats(t, yb, n*m.Rows)
	want, mag := refMatVec(m, x, n)
	bad := 0
	for i := range got {
		if e := math.Abs(float64(got[i]) - want[i]); e > 1e-5*mag[i]+1e-6 || math.IsNaN(float64(got[i])) {
			if bad++; bad <= 3 {
				t.Errorf("%v %d×%d n=%d: y[%d][%d] = %g, want %g (Σ|w·x| %g)", m.Type, m.Rows, m.Cols, n, i/m.Rows, i%m.Rows, got[i], want[i], mag[i])
			}
		}
	}
}

// TestMatVec: every format's mat-vec kernel against the reference at
// several shapes (odd row counts, odd columns where the format allows,
// 1 to 11 vectors), and with the rows split over several buffers.
func TestMatVec(t *testing.T) {
	g := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(7, 36))
	for _, typ := range matvecFormats {
		cols := []int{256, 1024, 2816}
		if typ.BlockLen() == 1 {
			cols = append(cols, 33, 100)
		} else if typ.BlockLen() == 32 {
			cols = append(cols, 96)
		}
		for _, c := range cols {
			for _, rows := range []int{1, 37} {
				for _, n := range []int{1, 3, 8, 11, 16, 45} {
					t.Run(fmt.Sprintf("%v/%dx%d/n%d", typ, rows, c, n), func(t *testing.T) {
						checkMatVec(t, g, randMatrix(r, typ, rows, c), n, r)
					})
				}
			}
		}
	}
	t.Run("split", func(t *testing.T) {
		keep := g.maxBinding
		g.maxBinding = 4096 + 4
		defer func() { g.maxBinding = keep }()
		for _, typ := range matvecFormats {
			m := randMatrix(r, typ, 61, 512)
			if d, err := g.Upload(m); err != nil {
				t.Fatal(err)
			} else if len(d.parts) < 3 {
				t.Errorf("%v: %d parts for %d bytes in bindings of %d", typ, len(d.parts), len(m.Data), g.maxBinding)
			} else {
				d.Free()
			}
			checkMatVec(t, g, m, 2, r)
			checkMatVec(t, g, m, 33, r)
		}
	})
}

// TestMatVecPastBindingLimit multiplies a Q8_0 matrix larger than the
// device's storage-buffer limit (128 MiB on lavapipe).
func TestMatVecPastBindingLimit(t *testing.T) {
	g := gpuOrSkip(t)
	if testing.Short() || raceEnabled {
		t.Skip("-short or -race: the matrix is over 128 MiB")
	}
	lim := g.Info().MaxStorageBuffer
	if lim > 1<<30 {
		t.Skipf("the device binds %d MiB: too large a matrix to make here", lim>>20)
	}
	const cols = 16384
	rs := quant.Q8_0.RowSize(cols)
	rows := int(lim/uint64(rs)) + 61
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, rows*rs)
	for b := 0; b < len(data); b += 34 {
		binary.LittleEndian.PutUint16(data[b:], quant.FP32ToFP16(float32(r.Float64()*0.02)))
		for i := 2; i < 34; i += 8 {
			binary.LittleEndian.PutUint64(data[b+i:], r.Uint64())
		}
	}
	m, err := kernels.NewMatrix(quant.Q8_0, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d×%d Q8_0: %d MiB against a binding limit of %d MiB", rows, cols, len(data)>>20, lim>>20)
	checkMatVec(t, g, m, 1, r)
}
