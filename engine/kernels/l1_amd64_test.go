//go:build amd64 && !noasm && gc

package kernels

import (
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/cpu"

	"shoal/engine/quant"
)

// BenchmarkL1 runs the raw decode kernels on 4 rows x 2048 that stay in L1.
func BenchmarkL1(b *testing.B) {
	k, x := tileKernel, rowsXKernel
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		t quant.Type
		f dotFn
	}{{quant.Q4_K, k("dotQ4_KR4C1")}, {quant.Q6_K, k("dotQ6_KR4C1")}, {quant.F16, k("dotF16R4C1")}, {quant.Q5_K, k("dotQ5_KR4C1")}} {
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
	}{{quant.Q4_0, x("dotQ4_0X4"), auxPairs(8)}, {quant.Q8_0, x("dotQ8_0X4"), auxQ8_0}, {quant.Q5_0, x("dotQ5_0X4"), auxPairs(16)}} {
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

// The decode kernels' variants (prefetch to L2, prefetch to L1, no software
// prefetch: the dispatch picks one by CPU vendor) compute the same sums, bit
// for bit, so the ones this machine does not run are checked too.
func TestDecodePrefetchVariants(t *testing.T) {
	if cpuid1ECX()&(1<<29) == 0 {
		t.Skip("no F16C")
	}
	avx512 := cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI
	k, x := tileKernel, rowsXKernel
	r := rand.New(rand.NewPCG(7, 8))
	same := func(name string, cols int, a, b [8]float32) {
		t.Helper()
		if a != b || a == [8]float32{} {
			t.Errorf("%s cols %d: variants give %v and %v", name, cols, a, b)
		}
	}
	// rows kernels on the type's own activations
	for _, c := range []struct {
		t    quant.Type
		v512 bool
		blk  int
		fn   []dotFn
		name string
	}{
		{quant.F16, false, 16, []dotFn{k("dotF16R4C1"), k("dotF16R4C1NP")}, "F16"},
		{quant.BF16, false, 16, []dotFn{k("dotBF16R4C1"), k("dotBF16R4C1NP")}, "BF16"},
		{quant.F32, false, 16, []dotFn{k("dotF32R4C1"), k("dotF32R4C1NP")}, "F32"},
		{quant.Q4_K, false, 256, []dotFn{k("dotQ4_KR4C1"), k("dotQ4_KR4C1T0")}, "Q4_K"},
		{quant.Q5_K, false, 256, []dotFn{k("dotQ5_KR4C1"), k("dotQ5_KR4C1T0")}, "Q5_K"},
		{quant.Q6_K, false, 256, []dotFn{k("dotQ6_KR4C1"), k("dotQ6_KR4C1T0")}, "Q6_K"},
		{quant.Q4_K, true, 256, []dotFn{k("dotQ4_KV4C1"), k("dotQ4_KV4C1T0")}, "Q4_K V4"},
		{quant.Q5_K, true, 256, []dotFn{k("dotQ5_KV4C1"), k("dotQ5_KV4C1T0")}, "Q5_K V4"},
		{quant.Q6_K, true, 256, []dotFn{k("dotQ6_KV4C1"), k("dotQ6_KV4C1T0")}, "Q6_K V4"},
	} {
		if c.v512 && !avx512 {
			continue
		}
		for _, cols := range []int{256, 2048} {
			m := randMatrix(r, c.t, 8, cols)
			_, xq := randActs(r, c.t, 1, cols)
			var want [8]float32
			c.fn[0](&m.Data[0], m.RowSize, &xq[0], 0, cols/c.blk, &want[0], 0)
			for _, f := range c.fn[1:] {
				var got [8]float32
				f(&m.Data[0], m.RowSize, &xq[0], 0, cols/c.blk, &got[0], 0)
				same(c.name, cols, want, got)
			}
		}
	}
	// kernels with activation data from auxPrep
	for _, c := range []struct {
		t      quant.Type
		v512   bool
		prep   func(a []byte, nb int, aux []byte)
		t1, t0 rowsXFn
		name   string
	}{
		{quant.Q4_0, false, auxPairs(8), x("dotQ4_0X4"), x("dotQ4_0X4T0"), "Q4_0 X4"},
		{quant.Q8_0, false, auxQ8_0, x("dotQ8_0X4"), x("dotQ8_0X4T0"), "Q8_0 X4"},
		{quant.Q5_0, false, auxPairs(16), x("dotQ5_0X4"), x("dotQ5_0X4T0"), "Q5_0 X4"},
		{quant.Q4_0, true, auxQ4_0S, x("dotQ4_0SV4C1"), x("dotQ4_0SV4C1T0"), "Q4_0 SV4"},
	} {
		if c.v512 && !avx512 {
			continue
		}
		for _, cols := range []int{64, 2048} {
			m := randMatrix(r, c.t, 8, cols)
			_, xq := randActs(r, c.t, 1, cols)
			nb := cols / quant.QK
			aux := make([]byte, max(auxSize(nb), 32*nb))
			c.prep(xq, nb, aux)
			var a, b [8]float32
			c.t1(&m.Data[0], m.RowSize, &xq[0], &aux[0], nb, &a[0])
			c.t0(&m.Data[0], m.RowSize, &xq[0], &aux[0], nb, &b[0])
			same(c.name, cols, a, b)
		}
	}
	// the 8-row Q8_0 kernel (Intel only) against the 4-row one twice
	x8, x4 := x("dotQ8_0X8"), x("dotQ8_0X4")
	for _, cols := range []int{64, 2048} {
		m := randMatrix(r, quant.Q8_0, 8, cols)
		_, xq := randActs(r, quant.Q8_0, 1, cols)
		nb := cols / quant.QK
		aux := make([]byte, max(auxSize(nb), 32*nb))
		auxQ8_0(xq, nb, aux)
		var a, b [8]float32
		x8(&m.Data[0], m.RowSize, &xq[0], &aux[0], nb, &a[0])
		x4(&m.Data[0], m.RowSize, &xq[0], &aux[0], nb, &b[0])
		x4(&m.Data[4*m.RowSize], m.RowSize, &xq[0], &aux[0], nb, &b[4])
		same("Q8_0 X8", cols, a, b)
	}
	// the u8 decode kernels, on activations laid out by prepU8
	if avx512 {
		for _, c := range []struct {
			t      quant.Type
			t1, t0 dotFn
		}{{quant.Q8_0, k("dotQ8_0V4C1"), k("dotQ8_0V4C1T0")}, {quant.Q5_0, k("dotQ5_0V4C1"), k("dotQ5_0V4C1T0")}} {
			const cols = 2048
			m := randMatrix(r, c.t, 4, cols)
			_, xq := randActs(r, c.t, 1, cols)
			j := &mmJob{xq: xq, n: 1, ars: len(xq)}
			j.prepU8(cols/quant.QK, nil)
			var a, b [8]float32
			c.t1(&m.Data[0], m.RowSize, &j.ta[0], 0, cols/quant.QK, &a[0], 0)
			c.t0(&m.Data[0], m.RowSize, &j.ta[0], 0, cols/quant.QK, &b[0], 0)
			same(c.t.String()+" V4", cols, a, b)
		}
	}
}
