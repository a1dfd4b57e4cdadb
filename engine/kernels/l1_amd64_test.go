//go:build amd64 && !noasm && gc

package kernels

import (
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

// BenchmarkL1 runs the raw decode kernels on 4 rows x 2048 that stay in L1.
func BenchmarkL1(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		t quant.Type
		f dotFn
	}{{quant.Q4_K, dotQ4_KR4C1}, {quant.Q6_K, dotQ6_KR4C1}, {quant.F16, dotF16R4C1}, {quant.Q5_K, dotQ5_KR4C1}} {
		const cols = 2048
		m := randMatrix(r, c.t, 4, cols)
		_, xq := randActs(r, c.t, 1, cols)
		nb := cols / c.t.BlockLen()
		if c.t.BlockLen() == 1 {
			nb = cols / 16
		}
		var out [4]float32
		b.Run(c.t.String(), func(b *testing.B) {
			cpuBench(b, len(m.Data), func() { c.f(&m.Data[0], m.RowSize, &xq[0], 0, nb, &out[0], 0) })
		})
	}
	for _, c := range []struct {
		t    quant.Type
		f    func(w *byte, ws int, a *byte, aux *byte, nb int, out *float32)
		prep func(a []byte, nb int, aux []byte)
	}{{quant.Q4_0, dotQ4_0X4, auxPairs(8)}, {quant.Q8_0, dotQ8_0X4, auxQ8_0}, {quant.Q5_0, dotQ5_0X4, auxPairs(16)}} {
		const cols = 2048
		m := randMatrix(r, c.t, 4, cols)
		_, xq := randActs(r, c.t, 1, cols)
		nb := cols / 32
		aux := make([]byte, auxSize(nb))
		c.prep(xq, nb, aux)
		var out [4]float32
		b.Run(c.t.String()+"X", func(b *testing.B) {
			cpuBench(b, len(m.Data), func() { c.f(&m.Data[0], m.RowSize, &xq[0], &aux[0], nb, &out[0]) })
		})
	}
}
