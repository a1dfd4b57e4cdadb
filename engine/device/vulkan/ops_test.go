package vulkan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/engine/kv"
	"shoal/engine/quant"
)

func randFloats(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// closeTo fails when got and want differ by more than tol relative to
// want's largest magnitude.
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	big := 1e-6
	for _, v := range want {
		big = max(big, math.Abs(float64(v)))
	}
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*big || math.IsNaN(float64(got[i])) {
			if bad++; bad <= 3 {
				t.Errorf("%s: [%d] = %g, want %g", what, i, got[i], want[i])
			}
		}
	}
}

// opsRange is a Range with only its op kernels and a vector buffer, for
// testing the kernels one by one.
func opsRange(t *testing.T, g *GPU, sp *device.Spec, n int, vecs []float32) *Range {
	t.Helper()
	r := &Range{g: g, sp: sp, n: n}
	if err := r.loadKernels(); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.vecs, err = g.floats(vecs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.vecs.Free() })
	return r
}

func submit(t *testing.T, g *GPU, rec func(cmd *vk.Cmd)) {
	t.Helper()
	cmd := g.ctx.Begin()
	rec(cmd)
	if err := cmd.Submit(); err != nil {
		t.Fatal(err)
	}
}

// TestOps checks RMSNorm (whole rows and per head, in place), the add
// kernel (rows, bias, scale), RoPE (normal and NeoX, full and partial
// rotary) and SiLU·mul against the CPU device's functions at odd sizes.
func TestOps(t *testing.T) {
	g := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(3, 36))
	for _, width := range []int{1, 7, 64, 100, 4096} {
		for _, rows := range []int{1, 5} {
			t.Run(fmt.Sprintf("rmsnorm/%dx%d", rows, width), func(t *testing.T) {
				sp := &device.Spec{NEmbd: width, RMSEps: 1e-5}
				w := randFloats(r, width, 1)
				x := randFloats(r, rows*width, 2)
				rg := opsRange(t, g, sp, rows, append(randFloats(r, 3, 1), w...))
				xb, yb := floats(t, g, x), floats(t, g, make([]float32, rows*width))
				defer xb.Free()
				defer yb.Free()
				submit(t, g, func(cmd *vk.Cmd) { rg.norm(cmd, xb, rows, width, vec{off: 3, n: width}, yb) })
				want := make([]float32, rows*width)
				for i := range rows {
					cpu.RMSNorm(want[i*width:(i+1)*width], x[i*width:(i+1)*width], w, 1e-5)
				}
				closeTo(t, "rmsnorm", readFloats(t, yb, rows*width), want, 1e-5)
				// in place, as the per-head norms run
				submit(t, g, func(cmd *vk.Cmd) { rg.norm(cmd, xb, rows, width, vec{off: 3, n: width}, xb) })
				closeTo(t, "rmsnorm in place", readFloats(t, xb, rows*width), want, 1e-5)
			})
		}
	}
	t.Run("add", func(t *testing.T) {
		const rows, width = 3, 37
		sp := &device.Spec{NEmbd: width}
		b := randFloats(r, width, 1)
		rg := opsRange(t, g, sp, rows, append(make([]float32, 5), b...))
		y, a := randFloats(r, rows*width, 1), randFloats(r, rows*width, 1)
		yb, ab := floats(t, g, y), floats(t, g, a)
		defer yb.Free()
		defer ab.Free()
		submit(t, g, func(cmd *vk.Cmd) {
			rg.addRows(cmd, yb, rows, width, width, ab, vec{off: 5, n: width}, 3, 0.5)
		})
		want := make([]float32, rows*width)
		for i := range want {
			want[i] = y[i] + 0.5*a[i] + b[i%width]
		}
		closeTo(t, "add", readFloats(t, yb, rows*width), want, 1e-6)
	})
	for _, c := range []struct {
		mode          device.RopeMode
		heads, d, dim int
	}{{device.RopeNormal, 4, 64, 64}, {device.RopeNeoX, 3, 128, 128}, {device.RopeNeoX, 2, 64, 32}, {device.RopeNormal, 5, 80, 40}} {
		t.Run(fmt.Sprintf("rope/%d/%dx%d/%d", c.mode, c.heads, c.d, c.dim), func(t *testing.T) {
			sp := &device.Spec{HeadDim: c.d, RopeDim: c.dim, Rope: c.mode, RopeTheta: 10000, RopeScale: 1}
			const n = 6
			rg := opsRange(t, g, sp, n, []float32{0})
			half := c.dim / 2
			cs := make([]float32, 2*n*half)
			pos := []int{0, 1, 7, 100, 4095, 31}
			for i, p := range pos {
				cpu.RopeTable(cs[i*half:(i+1)*half], cs[n*half+i*half:n*half+(i+1)*half], p, sp)
			}
			x := randFloats(r, n*c.heads*c.d, 1)
			var err error
			if rg.cs, err = g.floats(cs); err != nil {
				t.Fatal(err)
			}
			defer rg.cs.Free()
			xb := floats(t, g, x)
			defer xb.Free()
			submit(t, g, func(cmd *vk.Cmd) { rg.rope(cmd, xb, c.heads) })
			want := append([]float32(nil), x...)
			for i := range n {
				row := want[i*c.heads*c.d : (i+1)*c.heads*c.d]
				cpu.Rope(row, c.heads, c.d, c.dim, c.mode, cs[i*half:(i+1)*half], cs[n*half+i*half:n*half+(i+1)*half])
			}
			closeTo(t, "rope", readFloats(t, xb, len(x)), want, 1e-6)
		})
	}
	t.Run("silumul", func(t *testing.T) {
		rg := opsRange(t, g, &device.Spec{}, 1, []float32{0})
		var err error
		if rg.kernels.silu, err = g.kernel("silumul", 2, 4); err != nil {
			t.Fatal(err)
		}
		const n = 70001
		gv, uv := randFloats(r, n, 3), randFloats(r, n, 1)
		gb, ub := floats(t, g, gv), floats(t, g, uv)
		defer gb.Free()
		defer ub.Free()
		gx, gy := groups2((n + 63) / 64)
		submit(t, g, func(cmd *vk.Cmd) {
			cmd.Dispatch(rg.kernels.silu, gx, gy, 1, []uint32{n}, vk.Whole(gb), vk.Whole(ub))
		})
		want := append([]float32(nil), gv...)
		kernels.SiLUMul(want, uv)
		closeTo(t, "silu·mul", readFloats(t, gb, n), want, 1e-6)
	})
}

// f32Matrix is a random F32 matrix.
func f32Matrix(r *rand.Rand, rows, cols int, scale float64) *kernels.Matrix {
	x := randFloats(r, rows*cols, scale)
	data := make([]byte, 4*len(x))
	for i, v := range x {
		putF32(data[4*i:], v)
	}
	m, err := kernels.NewMatrix(quant.F32, rows, cols, data)
	if err != nil {
		panic(err)
	}
	return m
}

func putF32(b []byte, v float32) {
	u := math.Float32bits(v)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
}

// TestHalves runs a layer's attention half (biases, per-head norms, RoPE,
// GQA, the paged F16 cache across several blocks in a shuffled order) and
// its FFN half on the GPU and on the CPU device, with F32 weights (where
// the CPU does not quantize activations), over three batches: a prompt,
// then a decode token of it beside a second sequence's prompt, then both
// decoding. The outputs agree to float32 rounding.
func TestHalves(t *testing.T) {
	g := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(5, 36))
	for _, c := range []struct {
		name string
		neox bool
		bias bool
		norm bool
		d    int
	}{{"llama", false, false, false, 32}, {"qwen2", true, true, false, 64}, {"qwen3", true, false, true, 128}} {
		t.Run(c.name, func(t *testing.T) {
			const E, H, HKV, F, bs = 256, 4, 2, 320, 16
			sp := device.Spec{NEmbd: E, NVocab: 50, NHead: H, NHeadKV: HKV, HeadDim: c.d, NFF: F, RopeDim: c.d, RopeTheta: 10000, RopeScale: 1, RMSEps: 1e-5}
			if c.neox {
				sp.Rope = device.RopeNeoX
			}
			ly := device.Layer{AttnNorm: randFloats(r, E, 1), FFNNorm: randFloats(r, E, 1),
				Wq: f32Matrix(r, H*c.d, E, 0.05), Wk: f32Matrix(r, HKV*c.d, E, 0.05), Wv: f32Matrix(r, HKV*c.d, E, 0.05), Wo: f32Matrix(r, E, H*c.d, 0.05),
				Gate: f32Matrix(r, F, E, 0.05), Up: f32Matrix(r, F, E, 0.05), Down: f32Matrix(r, E, F, 0.05)}
			if c.bias {
				ly.Bq, ly.Bk, ly.Bv = randFloats(r, H*c.d, 0.3), randFloats(r, HKV*c.d, 0.3), randFloats(r, HKV*c.d, 0.3)
			}
			if c.norm {
				ly.QNorm, ly.KNorm = randFloats(r, c.d, 1), randFloats(r, c.d, 1)
			}
			ld := device.Load{Spec: sp, Layers: []device.Layer{ly}, Lo: 0, Hi: 1, OutputNorm: randFloats(r, E, 1), Output: f32Matrix(r, 50, E, 0.05),
				Part: device.Part{HeadHi: H, KVHi: HKV}, KV: kv.Config{Layers: 1, KVDim: HKV * c.d, BlockSize: bs, NumBlocks: 12}, Threads: 2}
			gr, err := g.Load(ld)
			if err != nil {
				t.Fatal(err)
			}
			defer gr.Close()
			cr, err := cpu.Load(ld)
			if err != nil {
				t.Fatal(err)
			}
			defer cr.Close()
			a, b := []int32{7, 2, 9, 4}, []int32{11, 0, 5}
			batches := []device.Batch{
				{Chunks: []device.Chunk{{Pos: 0, N: 37, Blocks: a}}},
				{Chunks: []device.Chunk{{Pos: 37, N: 1, Blocks: a}, {Pos: 0, N: 5, Blocks: b}}},
				{Chunks: []device.Chunk{{Pos: 5, N: 1, Blocks: b}, {Pos: 38, N: 1, Blocks: a}}},
			}
			for bi, bt := range batches {
				n := 0
				for _, ch := range bt.Chunks {
					n += ch.N
				}
				x := randFloats(r, n*E, 1)
				for _, dr := range []device.Range{gr, cr} {
					if err := dr.Begin(&bt); err != nil {
						t.Fatal(err)
					}
				}
				for h, half := range []string{"attention", "ffn"} {
					og, oc := make([]float32, n*E), make([]float32, n*E)
					if h == 0 {
						_, err = gr.Attention(0, x, og)
						if err == nil {
							_, err = cr.Attention(0, x, oc)
						}
					} else {
						_, err = gr.FFN(0, x, og)
						if err == nil {
							_, err = cr.FFN(0, x, oc)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					closeTo(t, fmt.Sprintf("batch %d %s", bi, half), og, oc, 2e-4)
				}
				lg, lc := make([]float32, 2*50), make([]float32, 2*50)
				if err := gr.Logits(x, []int{0, n - 1}, lg); err != nil {
					t.Fatal(err)
				}
				if err := cr.Logits(x, []int{0, n - 1}, lc); err != nil {
					t.Fatal(err)
				}
				closeTo(t, fmt.Sprintf("batch %d logits", bi), lg, lc, 1e-4)
			}
			// the KV rows the GPU stored read back as the CPU's
			kg, vg := make([]uint16, 5*HKV*c.d), make([]uint16, 5*HKV*c.d)
			kc, vc := make([]uint16, 5*HKV*c.d), make([]uint16, 5*HKV*c.d)
			gr.KV().ReadRows(0, b[0], 0, 5, 0, HKV*c.d, kg, vg)
			cr.KV().ReadRows(0, b[0], 0, 5, 0, HKV*c.d, kc, vc)
			diff := 0
			for i := range kg {
				if d := math.Abs(float64(quant.FP16ToFP32(kg[i]) - quant.FP16ToFP32(kc[i]))); d > 2e-3*(1+math.Abs(float64(quant.FP16ToFP32(kc[i])))) {
					diff++
				}
			}
			if diff > 0 {
				t.Errorf("%d of %d stored K values differ from the CPU's beyond rounding", diff, len(kg))
			}
		})
	}
}

// TestQuantAct: the activations the device feeds a product are the values
// the CPU's quantized activations stand for (quant.QuantizeRow of the
// weight format's vec_dot type, then DequantizeRow), for every mode.
func TestQuantAct(t *testing.T) {
	g := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(8, 36))
	for _, wt := range []quant.Type{quant.F16, quant.BF16, quant.Q4_0, quant.Q4_1, quant.Q4_K} {
		at := quant.VecDotType(wt)
		t.Run(wt.String(), func(t *testing.T) {
			const n, cols = 3, 512
			rg := opsRange(t, g, &device.Spec{}, n, []float32{0})
			x := randFloats(r, n*cols, 2)
			x[5] = 0 // a zero, and a block of zeros
			for i := 2 * 256; i < 3*256; i++ {
				x[i] = 0
			}
			xb := floats(t, g, x)
			defer xb.Free()
			var err error
			if rg.xq, err = g.ctx.NewBuffer(4*n*cols, false); err != nil {
				t.Fatal(err)
			}
			defer rg.xq.Free()
			w := &Matrix{Type: wt, Cols: cols}
			// a product's input rounding alone: a matrix with no rows
			submit(t, g, func(cmd *vk.Cmd) { rg.mv(cmd, w, Vec{B: xb, Stride: cols}, n, Vec{B: xb, Stride: cols}) })
			got := readFloats(t, rg.xq, n*cols)
			want := make([]float32, n*cols)
			row := make([]byte, at.RowSize(cols))
			for j := range n {
				quant.QuantizeRow(at, x[j*cols:(j+1)*cols], row)
				quant.DequantizeRow(at, row, want[j*cols:(j+1)*cols])
			}
			closeTo(t, at.String(), got, want, 1e-6)
		})
	}
}
