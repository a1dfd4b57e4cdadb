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

// The float decode kernels with and without the next-rows prefetch (the
// dispatch picks one by CPU vendor) compute the same sums, bit for bit.
func TestFloatDecodePrefetchVariants(t *testing.T) {
	if cpuid1ECX()&(1<<29) == 0 {
		t.Skip("no F16C")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct {
		t      quant.Type
		pf, np dotFn
	}{{quant.F16, dotF16R4C1, dotF16R4C1NP}, {quant.BF16, dotBF16R4C1, dotBF16R4C1NP}, {quant.F32, dotF32R4C1, dotF32R4C1NP}} {
		for _, cols := range []int{16, 48, 2048} {
			m := randMatrix(r, c.t, 8, cols)
			_, xq := randActs(r, c.t, 1, cols)
			var a, b [4]float32
			c.pf(&m.Data[0], m.RowSize, &xq[0], 0, cols/16, &a[0], 0)
			c.np(&m.Data[0], m.RowSize, &xq[0], 0, cols/16, &b[0], 0)
			if a != b || a == [4]float32{} {
				t.Errorf("%v cols %d: prefetching kernel %v, hardware-prefetch kernel %v", c.t, cols, a, b)
			}
		}
	}
}
