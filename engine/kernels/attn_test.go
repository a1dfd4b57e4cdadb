package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// TestAttnF16 compares ScoresF16 and AccumF16 on every kernel level with a
// float64 evaluation, over head sizes with and without a platform kernel
// (multiples of 8 or not), run lengths around the 4-key step, and strided
// rows (the other heads' columns between them must not be read as ours).
func TestAttnF16(t *testing.T) {
	defer SetLevel(Path())
	rng := rand.New(rand.NewPCG(3, 4))
	for _, lv := range Levels() {
		if err := SetLevel(lv); err != nil {
			t.Fatal(err)
		}
		for _, d := range []int{8, 12, 16, 24, 40, 64, 72, 128, 136} {
			for _, T := range []int{0, 1, 3, 4, 5, 8, 15, 16, 17} {
				stride := 3*d + 8
				rows := make([]uint16, max(T*stride, 1))
				for i := range rows {
					rows[i] = quant.FP32ToFP16(float32(rng.NormFloat64()))
				}
				q := make([]float32, d)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				p := make([]float32, T)
				for i := range p {
					p[i] = float32(rng.Float64())
				}
				out := make([]float32, T)
				ScoresF16(out, q, rows, stride)
				acc := make([]float32, d)
				for i := range acc {
					acc[i] = float32(rng.NormFloat64())
				}
				want := make([]float64, d)
				for i := range want {
					want[i] = float64(acc[i])
				}
				AccumF16(acc, p, rows, stride)
				for tk := 0; tk < T; tk++ {
					var s, mag float64
					for i := 0; i < d; i++ {
						x := float64(quant.FP16ToFP32(rows[tk*stride+i]))
						s += float64(q[i]) * x
						mag += math.Abs(float64(q[i]) * x)
						want[i] += float64(p[tk]) * x
					}
					if e := math.Abs(float64(out[tk]) - s); e > 1e-5*mag+1e-30 {
						t.Fatalf("%s d=%d T=%d: score[%d] = %v, want %v", lv, d, T, tk, out[tk], s)
					}
				}
				for i := range acc {
					if e := math.Abs(float64(acc[i]) - want[i]); e > 1e-5*(math.Abs(want[i])+float64(T)) {
						t.Fatalf("%s d=%d T=%d: acc[%d] = %v, want %v", lv, d, T, i, acc[i], want[i])
					}
				}
			}
		}
	}
}

// TestAttnQuantized compares ScoresQ and AccumQ over Q8_0 and Q4_0 rows
// (a quantized KV cache's) on every kernel level with a float64 evaluation
// of the dequantized rows, for head sizes of 1 to 5 blocks, run lengths
// around a cache block, and strided rows.
func TestAttnQuantized(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	eachLevel(t, func(lv string) {
		for _, kt := range []quant.Type{quant.Q8_0, quant.Q4_0} {
			for _, d := range []int{32, 64, 96, 128, 160} {
				for _, T := range []int{0, 1, 3, 16, 17} {
					n := kt.RowSize(d)
					stride := n/2*3 + 5 // words: two other heads and a gap between rows
					rows := make([]uint16, max(T*stride, 1))
					b := WordBytes(rows)
					x := make([]float32, d)
					for tk := 0; tk < T; tk++ {
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						quant.QuantizeRow(kt, x, b[2*tk*stride:2*tk*stride+n])
					}
					q := make([]float32, d)
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					qq := make([]byte, quant.VecDotType(kt).RowSize(d))
					quant.QuantizeRow(quant.VecDotType(kt), q, qq)
					qd := make([]float32, d)
					quant.DequantizeRow(quant.VecDotType(kt), qq, qd)
					p := make([]float32, T)
					for i := range p {
						p[i] = float32(rng.Float64())
					}
					out := make([]float32, T)
					ScoresQ(out, kt, d, qq, rows, stride)
					acc := make([]float32, d)
					want := make([]float64, d)
					for i := range acc {
						acc[i] = float32(rng.NormFloat64())
						want[i] = float64(acc[i])
					}
					AccumQ(acc, p, kt, rows, stride, make([]float32, d))
					row := make([]float32, d)
					for tk := 0; tk < T; tk++ {
						quant.DequantizeRow(kt, b[2*tk*stride:2*tk*stride+n], row)
						var s, mag float64
						for i := range row {
							s += float64(qd[i]) * float64(row[i])
							mag += math.Abs(float64(qd[i]) * float64(row[i]))
							want[i] += float64(p[tk]) * float64(row[i])
						}
						if e := math.Abs(float64(out[tk]) - s); e > 1e-4*mag+1e-30 {
							t.Fatalf("%s %s d=%d T=%d: score[%d] = %v, want %v", lv, kt, d, T, tk, out[tk], s)
						}
					}
					for i := range acc {
						if e := math.Abs(float64(acc[i]) - want[i]); e > 1e-5*(math.Abs(want[i])+float64(T)) {
							t.Fatalf("%s %s d=%d T=%d: acc[%d] = %v, want %v", lv, kt, d, T, i, acc[i], want[i])
						}
					}
				}
			}
		}
	})
}
