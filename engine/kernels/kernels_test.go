package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"

	"shoal/engine/quant"
)

// fastTypes are the weight types with platform kernels.
var fastTypes = []quant.Type{
	quant.F32, quant.F16, quant.BF16, quant.Q4_0, quant.Q5_0, quant.Q8_0,
	quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_NL, quant.IQ4_XS,
	quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S,
	quant.IQ1_S, quant.IQ1_M,
}

// eachLevel runs f under every kernel set this CPU and build can run, after
// checking that selecting it took effect.
func eachLevel(t testing.TB, f func(level string)) {
	defer SetLevel(Path()) // restore the level the run was started with
	for _, l := range Levels() {
		if err := SetLevel(l); err != nil {
			t.Fatal(err)
		}
		if Path() != l {
			t.Fatalf("SetLevel(%q): Path() = %q", l, Path())
		}
		f(l)
	}
}

func TestLevels(t *testing.T) {
	ls := Levels()
	if ls[len(ls)-1] != "generic" {
		t.Errorf("Levels() = %v, want generic last", ls)
	}
	if want := expectedLevel(); want != "" && ls[0] != want {
		t.Errorf("Levels() = %v, want %s first on this CPU", ls, want)
	}
	if env := os.Getenv("SHOAL_KERNELS"); env != "" && Path() != env {
		t.Errorf("SHOAL_KERNELS=%s but Path() = %s", env, Path())
	}
	t.Logf("kernel sets: %v, active %s", ls, Path())
	if err := SetLevel("no-such"); err == nil {
		t.Error("SetLevel(no-such) succeeded")
	}
}

// magnitude is sum |w_i a_i| over the dequantized rows.
func magnitude(typ quant.Type, n int, w, a []byte) float64 {
	wf, af := make([]float32, n), make([]float32, n)
	quant.DequantizeRow(typ, w[:typ.RowSize(n)], wf)
	quant.DequantizeRow(quant.VecDotType(typ), a[:quant.VecDotType(typ).RowSize(n)], af)
	var mag float64
	for i := range wf {
		mag += math.Abs(float64(wf[i]) * float64(af[i]))
	}
	return mag
}

func lengths(typ quant.Type) []int {
	bl := typ.BlockLen()
	var ns []int
	if bl == 1 {
		ns = []int{1, 3, 15, 16, 17, 31, 33, 100}
		bl = 32
	}
	for _, nb := range []int{1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 63, 64} {
		ns = append(ns, nb*bl)
	}
	return ns
}

// Every kernel set's VecDot equals the generic one within 1e-5 of sum|w a|.
func TestVecDotLevels(t *testing.T) {
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(21, 22))
		for _, typ := range weightTypes {
			for _, n := range lengths(typ) {
				w, a, _, _ := rows(r, typ, n)
				want := vecDotGeneric(typ, n, w, a)
				got := VecDot(typ, n, w, a)
				tol := 1e-5*magnitude(typ, n, w, a) + 1e-30
				if d := math.Abs(float64(got) - float64(want)); d > tol {
					t.Errorf("%s %v n=%d: %g, generic %g (diff %g > %g)", level, typ, n, got, want, d, tol)
				}
			}
		}
	})
}

// Extreme weights: Q8_0 -128 and 127, all nibbles 0 or 15, largest scales.
func TestVecDotExtremes(t *testing.T) {
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(23, 24))
		for _, typ := range fastTypes {
			if typ.BlockLen() == 1 {
				continue
			}
			n := 8 * typ.BlockLen()
			for _, fill := range []byte{0x00, 0xff, 0x80, 0x7f} {
				w, a, _, _ := rows(r, typ, n)
				bs := typ.BlockSize()
				for b := 0; b < n/typ.BlockLen(); b++ {
					blk := w[b*bs : (b+1)*bs]
					for i := range blk {
						if !isScaleByte(typ, i) || fill != 0x80 {
							blk[i] = fill
						}
					}
					fixScales(typ, blk)
				}
				want := vecDotGeneric(typ, n, w, a)
				got := VecDot(typ, n, w, a)
				tol := 1e-5*magnitude(typ, n, w, a) + 1e-30
				if d := math.Abs(float64(got) - float64(want)); d > tol || math.IsNaN(float64(got)) {
					t.Errorf("%s %v fill %#x: %g, generic %g", level, typ, fill, got, want)
				}
			}
		}
	})
}

func isScaleByte(typ quant.Type, i int) bool {
	switch typ {
	case quant.Q4_0, quant.Q5_0, quant.Q8_0, quant.Q4_K, quant.Q5_K, quant.IQ4_NL, quant.IQ4_XS,
		quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S, quant.IQ1_S:
		return i < 2
	case quant.Q6_K:
		return i >= 208
	}
	return false
}

// fixScales sets the float scales of a block to finite values.
func fixScales(typ quant.Type, blk []byte) {
	switch typ {
	case quant.Q4_0, quant.Q5_0, quant.Q8_0, quant.IQ4_NL, quant.IQ4_XS,
		quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S, quant.IQ1_S:
		blk[0], blk[1] = 0x00, 0x2c // 1/16
	case quant.IQ1_M:
		// 1/16 (0x2c00) in the top nibbles of the scale words
		for k, nib := range []byte{0x0, 0x0, 0xc, 0x2} {
			blk[49+2*k] = blk[49+2*k]&0x0f | nib<<4
		}
	case quant.Q4_K, quant.Q5_K:
		blk[0], blk[1], blk[2], blk[3] = 0x00, 0x2c, 0x00, 0x28
	case quant.Q6_K:
		blk[208], blk[209] = 0x00, 0x2c
	}
}

// matmulWant is the generic product, element by element.
func matmulWant(m *Matrix, xq []byte, n int, ldo int) []float32 {
	ars := m.ActRowSize()
	out := make([]float32, (n-1)*ldo+m.Rows)
	for i := 0; i < n; i++ {
		for r := 0; r < m.Rows; r++ {
			out[i*ldo+r] = vecDotGeneric(m.Type, m.Cols, m.Row(r), xq[i*ars:(i+1)*ars])
		}
	}
	return out
}

func randMatrix(r *rand.Rand, typ quant.Type, rows, cols int) *Matrix {
	rs := typ.RowSize(cols)
	data := make([]byte, rows*rs)
	for i := 0; i < rows; i++ {
		quant.QuantizeRow(typ, randRow(r, cols, 0.05), data[i*rs:(i+1)*rs])
	}
	m, err := NewMatrix(typ, rows, cols, data)
	if err != nil {
		panic(err)
	}
	return m
}

func randActs(r *rand.Rand, typ quant.Type, n, cols int) ([]float32, []byte) {
	x := randRow(r, n*cols, 1)
	at := quant.VecDotType(typ)
	xq := make([]byte, n*at.RowSize(cols))
	QuantizeActs(NewPool(1), at, x, n, cols, xq)
	return x, xq
}

// sweepShort reports whether the shape sweeps take their short lists: under
// -short, and under the race detector (see raceEnabled).
func sweepShort() bool { return testing.Short() || raceEnabled }

// MatMul under every kernel set, for decode (n <= 3) and tile (n >= 4) paths,
// row counts that leave remainders, and a stride ldo > Rows.
func TestMatMulLevels(t *testing.T) {
	pools := []*Pool{NewPool(1), NewPool(3)}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(25, 26))
		for _, typ := range weightTypes {
			bl := max(typ.BlockLen(), 32)
			colsList := []int{bl, 3 * bl}
			if typ.BlockLen() == 1 {
				colsList = append(colsList, 40, 7)
			}
			rowsList, nList := []int{1, 2, 3, 5, 8, 13, 70}, []int{1, 2, 3, 4, 5, 7, 9, 12, 16, 17}
			if sweepShort() {
				rowsList, nList = []int{3, 13}, []int{1, 3, 5, 8, 9}
			}
			for _, cols := range colsList {
				for _, rowsN := range rowsList {
					m := randMatrix(r, typ, rowsN, cols)
					for _, n := range nList {
						_, xq := randActs(r, typ, n, cols)
						ldo := rowsN + 3
						want := matmulWant(m, xq, n, ldo)
						for pi, p := range pools {
							out := make([]float32, len(want))
							MatMul(p, m, xq, n, out, ldo)
							checkMatMul(t, fmt.Sprintf("%s %v %dx%d n=%d pool %d", level, typ, rowsN, cols, n, pi), m, xq, n, ldo, out, want)
						}
					}
				}
			}
		}
	})
}

// checkMatMul compares MatMul's out with want (n activation rows of xq
// against the rows of m, unpacked, ldo apart) within the error of float32
// sums, and checks that nothing was written between the rows.
func checkMatMul(t *testing.T, what string, m *Matrix, xq []byte, n, ldo int, out, want []float32) {
	t.Helper()
	ars := m.ActRowSize()
	for i := 0; i < n; i++ {
		for row := 0; row < m.Rows; row++ {
			g, w := out[i*ldo+row], want[i*ldo+row]
			tol := 1e-5*magnitude(m.Type, m.Cols, m.Row(row), xq[i*ars:]) + 1e-30
			if d := math.Abs(float64(g - w)); d > tol || math.IsNaN(float64(g)) {
				t.Fatalf("%s: out[%d][%d] = %g, want %g", what, i, row, g, w)
			}
		}
		for row := m.Rows; row < ldo && i < n-1; row++ {
			if out[i*ldo+row] != 0 {
				t.Fatalf("%s: wrote outside the rows (act %d, %d)", what, i, row)
			}
		}
	}
}

// The tile paths for batch sizes around the tile widths: whole tiles, tile4
// for the batch or for four activations left over, and the decode kernel for
// the rest; odd and even block counts and, for the float formats, a tail.
func TestMatMulTiles(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(37, 38))
		for _, typ := range fastTypes {
			bl := typ.BlockLen()
			colsList := []int{3 * bl, 4 * bl}
			if bl == 1 {
				colsList = []int{16, 48, 64, 200, 2048} // 16-element blocks: 1, 3, 4, 12 (+8), 128
			}
			nList := []int{4, 6, 8, 12, 13, 14, 16, 20, 24, 28, 45, 46, 47, 64, 70}
			if sweepShort() {
				nList = []int{4, 13, 16, 47, 70}
				if bl == 1 {
					colsList = []int{48, 200} // odd, and even with a tail
				}
			}
			for _, cols := range colsList {
				const rowsN = 13
				m := randMatrix(r, typ, rowsN, cols)
				ars := m.ActRowSize()
				for _, n := range nList {
					_, xq := randActs(r, typ, n, cols)
					ldo := rowsN + 2
					want := matmulWant(m, xq, n, ldo)
					out := make([]float32, len(want))
					MatMul(p, m, xq, n, out, ldo)
					for i := 0; i < n; i++ {
						for row := 0; row < ldo && (row < rowsN || i < n-1); row++ {
							g, w := out[i*ldo+row], want[i*ldo+row]
							tol := 1e-30
							if row < rowsN {
								tol += 1e-5 * magnitude(typ, cols, m.Row(row), xq[i*ars:])
							}
							if d := math.Abs(float64(g - w)); d > tol || math.IsNaN(float64(g)) {
								t.Fatalf("%s %v %dx%d n=%d: out[%d][%d] = %g, want %g", level, typ, rowsN, cols, n, i, row, g, w)
							}
						}
					}
				}
			}
		}
	})
}

func TestMatMulNoAlloc(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	r := rand.New(rand.NewPCG(27, 28))
	eachLevel(t, func(level string) {
		for _, typ := range fastTypes {
			m := randMatrix(r, typ, 64, 512)
			for _, n := range []int{1, 8} {
				_, xq := randActs(r, typ, n, 512)
				out := make([]float32, n*64)
				MatMul(p, m, xq, n, out, 64) // warm the job pool and scratch
				if a := testing.AllocsPerRun(20, func() { MatMul(p, m, xq, n, out, 64) }); a != 0 && !raceEnabled {
					t.Errorf("%s %v n=%d: %v allocations per MatMul", level, typ, n, a)
				}
			}
			x := randRow(r, 2*512, 1)
			at := quant.VecDotType(typ)
			xq := make([]byte, 2*at.RowSize(512))
			QuantizeActs(p, at, x, 2, 512, xq)
			if a := testing.AllocsPerRun(20, func() { QuantizeActs(p, at, x, 2, 512, xq) }); a != 0 && !raceEnabled {
				t.Errorf("%s %v: %v allocations per QuantizeActs", level, at, a)
			}
		}
	})
}

// quantRows are activation rows that stress the quantizers: ties at .5
// after scaling, zero blocks, equal positive and negative maxima, tiny and
// huge values.
func quantRows(r *rand.Rand, cols int) [][]float32 {
	var rs [][]float32
	rs = append(rs, randRow(r, cols, 1), randRow(r, cols, 1e-3), randRow(r, cols, 1e4))
	ties := make([]float32, cols)
	for i := range ties {
		ties[i] = float32(r.IntN(255)-127) + 0.5*float32(r.IntN(2))
		if i%32 == 0 {
			ties[i] = 127
		}
	}
	rs = append(rs, ties)
	zero := randRow(r, cols, 1)
	clear(zero[:min(cols, 256)])
	rs = append(rs, zero)
	pm := randRow(r, cols, 0.1)
	for i := 0; i < cols; i += 16 {
		pm[i] = 3 * float32(1-2*(i/16%2))
	}
	rs = append(rs, pm)
	sub := randRow(r, cols, 1e-40)
	rs = append(rs, sub)
	return rs
}

func TestQuantizeActsExact(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	eachLevel(t, func(level string) {
		r := rand.New(rand.NewPCG(29, 30))
		for _, at := range []quant.Type{quant.Q8_0, quant.Q8_K, quant.F16, quant.BF16, quant.F32} {
			for _, cols := range []int{256, 512, 2048} {
				rs := quantRows(r, cols)
				x := make([]float32, 0, len(rs)*cols)
				for _, row := range rs {
					x = append(x, row...)
				}
				n := len(rs)
				rsz := at.RowSize(cols)
				got := make([]byte, n*rsz)
				QuantizeActs(p, at, x, n, cols, got)
				want := make([]byte, rsz)
				for i := 0; i < n; i++ {
					quant.QuantizeRow(at, x[i*cols:(i+1)*cols], want)
					g := got[i*rsz : (i+1)*rsz]
					for k := range want {
						if g[k] != want[k] {
							t.Fatalf("%s %v cols=%d row %d: byte %d = %#x, want %#x", level, at, cols, i, k, g[k], want[k])
						}
					}
				}
			}
		}
	})
}

// The half-away-from-zero rounding used by the Q8_0 quantizer,
// trunc(v + copysign(0.5-2^-25, v)), equals roundf for every float32 of
// magnitude below 2^23 sampled densely, and every float near the halves
// and integers up to 300.
func TestRoundAwayTrick(t *testing.T) {
	const c = float32(0.49999997)
	check := func(v float32) {
		want := float32(math.Round(float64(v)))
		s := c
		if v < 0 {
			s = -c
		}
		got := float32(math.Trunc(float64(v + s)))
		if got != want {
			t.Fatalf("v=%g (%#x): trick %g, roundf %g", v, math.Float32bits(v), got, want)
		}
	}
	for k := 0; k <= 600; k++ {
		c := math.Float32bits(float32(k) / 2)
		for b := c - min(c, 1<<12); b <= c+1<<12; b++ {
			check(math.Float32frombits(b))
			check(-math.Float32frombits(b))
		}
	}
	for b := uint32(0); b < math.Float32bits(2); b += 101 {
		check(math.Float32frombits(b))
	}
	for b := math.Float32bits(2); b < math.Float32bits(1<<23); b += 97 {
		check(math.Float32frombits(b))
	}
}

// ---- benchmarks

func benchLevels(b *testing.B, f func(b *testing.B)) {
	defer SetLevel(Path()) // restore the level the run was started with
	for _, l := range Levels() {
		SetLevel(l)
		b.Run(l, f)
	}
}

func gbps(b *testing.B, bytes int) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(bytes)*float64(b.N)/s/1e9, "GB/s")
	}
}

// BenchmarkVecDot/<type>/<path> times one 4096-element row; the throughput is
// in weight bytes.
func BenchmarkVecDot(b *testing.B) {
	const n = 4096
	r := rand.New(rand.NewPCG(17, 18))
	for _, typ := range weightTypes {
		w, a, _, _ := rows(r, typ, n)
		b.Run(typ.String(), func(b *testing.B) {
			benchLevels(b, func(b *testing.B) {
				b.SetBytes(int64(len(w)))
				var sink float32
				for b.Loop() {
					sink += VecDot(typ, n, w, a)
				}
				_ = sink
				gbps(b, len(w))
			})
		})
	}
}

// BenchmarkMatMul/<type>/<rows>x<cols>/n=<acts>/<path> times MatMul on a pool
// of NumCPU threads; SetBytes is the weight bytes read per call. The
// "stream" shape rotates through matrices of 5632x2048 totalling more than
// the last-level cache, so that weights come from DRAM as in decoding.
func BenchmarkMatMul(b *testing.B) {
	threads, _ := strconv.Atoi(os.Getenv("SHOAL_BENCH_THREADS"))
	p := NewPool(threads)
	defer p.Close()
	r := rand.New(rand.NewPCG(31, 32))
	for _, typ := range []quant.Type{quant.Q4_0, quant.Q8_0, quant.Q4_K, quant.Q6_K, quant.Q5_0, quant.Q5_K, quant.F16, quant.BF16, quant.F32} {
		for _, shape := range []struct {
			name       string
			rows, cols int
		}{{"2048x2048", 2048, 2048}, {"5632x2048", 5632, 2048}, {"stream", 5632, 2048}} {
			for _, packed := range []bool{false, true} {
				if packed && packQuant(typ) == 0 {
					continue
				}
				tname := typ.String()
				m0 := randMatrix(r, typ, shape.rows, shape.cols)
				if packed {
					tname += "p"
					m0 = PackMatrix(m0)
				}
				ms := []*Matrix{m0}
				if shape.name == "stream" {
					for total := len(ms[0].Data); total < 160<<20; total += len(ms[0].Data) {
						c := *m0
						c.Data = alignedBytes(len(m0.Data))
						copy(c.Data, m0.Data)
						ms = append(ms, &c)
					}
				}
				for _, n := range []int{1, 4, 8, 16, 64} {
					if shape.name == "stream" && n == 64 {
						continue
					}
					_, xq := randActs(r, typ, n, shape.cols)
					out := make([]float32, n*shape.rows)
					b.Run(fmt.Sprintf("%s/%s/n=%d", tname, shape.name, n), func(b *testing.B) {
						benchLevels(b, func(b *testing.B) {
							if Path() == "generic" && n > 1 {
								b.Skip("slow")
							}
							b.SetBytes(int64(len(ms[0].Data)))
							i := 0
							for b.Loop() {
								MatMul(p, ms[i%len(ms)], xq, n, out, shape.rows)
								i++
							}
							gbps(b, len(ms[0].Data))
							if n > 1 {
								b.ReportMetric(float64(2*shape.rows*shape.cols*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
							}
						})
					})
				}
			}
			runtime.GC()
		}
	}
}

func BenchmarkQuantizeActs(b *testing.B) {
	p := NewPool(1)
	defer p.Close()
	r := rand.New(rand.NewPCG(33, 34))
	x := randRow(r, 4096, 1)
	for _, at := range []quant.Type{quant.Q8_0, quant.Q8_K} {
		dst := make([]byte, at.RowSize(4096))
		b.Run(at.String(), func(b *testing.B) {
			benchLevels(b, func(b *testing.B) {
				b.SetBytes(4 * 4096)
				for b.Loop() {
					QuantizeActs(p, at, x, 1, 4096, dst)
				}
			})
		})
	}
}

// BenchmarkKernel/<type>/<path> runs single-threaded MatMul (n=1) on about
// 1 MiB of rows x 4096 (in L2 where a core has 1 MiB or more, as Zen 4; in
// L3 on Zen 3's 512 KiB): the decode kernel's speed apart from DRAM,
// with the per-call activation preparation spread over as many rows as a
// model's matrices have.
func BenchmarkKernel(b *testing.B) {
	p := NewPool(1)
	defer p.Close()
	r := rand.New(rand.NewPCG(35, 36))
	for i, typ := range append(fastTypes, packTypes...) {
		rows := max(64, (1<<20)/typ.RowSize(4096)/8*8)
		m := randMatrix(r, typ, rows, 4096)
		name := typ.String()
		if i >= len(fastTypes) { // the packed layout (name suffix p)
			m, name = PackMatrix(m), name+"p"
		}
		_, xq := randActs(r, typ, 1, 4096)
		out := make([]float32, rows)
		b.Run(name, func(b *testing.B) {
			benchLevels(b, func(b *testing.B) {
				b.SetBytes(int64(len(m.Data)))
				cpuBench(b, len(m.Data), func() { MatMul(p, m, xq, 1, out, rows) })
			})
		})
	}
}

// Every level lays out Q8_0 activations for the u8 kernels byte for byte as
// the Go version does, for block scales that are normal, subnormal or zero.
func TestPrepU8Levels(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, nb := range []int{1, 2, 3, 7, 28, 64, 152} {
		x := randRow(r, nb*quant.QK, 1)
		src := make([]byte, quant.Q8_0.RowSize(len(x)))
		quant.QuantizeRow(quant.Q8_0, x, src)
		// block 0: a subnormal half scale; block 1 (when there): zero
		src[0], src[1] = 0x01, 0x00
		if nb > 1 {
			src[34], src[35] = 0, 0
		}
		want := make([]byte, nb*u8Block)
		defer SetLevel(Path())
		if err := SetLevel("generic"); err != nil {
			t.Fatal(err)
		}
		prepU8Row(src, want, nb)
		if got, w := math.Float32frombits(uint32(want[0])|uint32(want[1])<<8|uint32(want[2])<<16|uint32(want[3])<<24), float32(math.Ldexp(1, -24)); got != w {
			t.Fatalf("generic: subnormal scale widened to %g, want %g", got, w)
		}
		eachLevel(t, func(level string) {
			got := make([]byte, nb*u8Block+8)
			prepU8Row(src, got, nb)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s nb=%d: byte %d (block %d) = %#x, want %#x", level, nb, i, i/u8Block, got[i], want[i])
				}
			}
			for i := len(want); i < len(got); i++ {
				if got[i] != 0 {
					t.Fatalf("%s nb=%d: wrote past the end at byte %d", level, nb, i)
				}
			}
		})
	}
}
