//go:build amd64 && !noasm && gc

package kernels

import (
	"golang.org/x/sys/cpu"

	"shoal/engine/quant"
)

func archLevels() []*level {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA || cpuid1ECX()&(1<<29) == 0 {
		return nil
	}
	q8SumsAsm = q8SumsAVX2
	// The kernels by name (kernel_amd64.go). Decode kernels prefetch the
	// next rows to L2 on Intel cores and to L1 elsewhere (see prefetchStep in
	// _generate/main.go): pick and pickX return the variant for this CPU.
	k, x, one := tileKernel, rowsXKernel, oneKernel
	intel := cpuidVendorEBX() == vendorIntel
	pick := func(name string) dotFn { return k(forVendor(intel, name)) }
	pickX := func(name string) rowsXFn { return x(forVendor(intel, name)) }
	l := &level{name: "avx2", q8_0: quantQ8_0AVX2, q8_K: quantQ8_KAVX2, prepU8: prepU8AVX2, scoresF16: scoresF16AVX2, accumF16: accumF16AVX2,
		accumQ8_0: accumQ8_0AVX2, accumQ4_0: accumQ4_0AVX2,
		expSub: expSubAVX2, siluMul: siluMulAVX2, f32ToF16: f32ToF16AVX2, f16ToF32: f16ToF32AVX2, roundF16: roundF16AVX2,
		scaleRoundF16: scaleRoundF16AVX2, scaleMax: scaleMaxAVX2}
	l.k[quant.Q4_0] = &kset{blockLen: quant.QK,
		one: one("dotQ4_0R2C1"), rowsR: 4, rowsX: pickX("dotQ4_0X4"), auxPrep: auxPairs(8), tile: k("dotQ4_0R2C4"), tileR: 2, tileC: 4}
	l.k[quant.Q4_0].panel = &panelSet{R: 8, group: 64, blockLen: quant.QK, C: 4, tiles: [7]dotFn{nil, k("panelQ4_0C1"), k("panelQ4_0C2"), k("panelQ4_0C3"), k("panelQ4_0C4")},
		blockBytes: 144, pack: quantPanel(panelPackQ4_0, 18, 144), prep: prepS8, actBytes: 40, minN: 4}
	l.k[quant.Q8_0] = &kset{blockLen: quant.QK,
		one: one("dotQ8_0R1C1"), rowsR: 4, rowsX: pickX("dotQ8_0X4"), auxPrep: auxQ8_0}
	if intel {
		// Eight rows at once keep more memory streams busy on Intel cores;
		// on an AMD EPYC (AVX2 only) they streamed at 10 GB/s where four
		// rows stream at 17-19 (BenchmarkMatMul/Q8_0/stream/n=1).
		l.k[quant.Q8_0].rowsX8 = x("dotQ8_0X8")
	}
	l.k[quant.Q8_0].panel = &panelSet{R: 8, group: 64, blockLen: quant.QK, C: 4, tiles: [7]dotFn{nil, k("panelQ8_0C1"), k("panelQ8_0C2"), k("panelQ8_0C3"), k("panelQ8_0C4")},
		blockBytes: 528, pack: quantPanel(panelPackQ8_0, 34, 528), prep: prepI16, actBytes: 68, minN: 12}
	l.k[quant.Q5_0] = &kset{blockLen: quant.QK,
		one: one("dotQ5_0R1C1"), rowsR: 4, rowsX: pickX("dotQ5_0X4"), auxPrep: auxPairs(16), tile: k("dotQ5_0R2C2"), tileR: 2, tileC: 2}
	l.k[quant.Q4_K] = &kset{blockLen: quant.QKK,
		one: one("dotQ4_KR1C1"), rows: pick("dotQ4_KR4C1"), rowsR: 4, tile: k("dotQ4_KR1C4"), tileR: 1, tileC: 4}
	l.k[quant.Q5_K] = &kset{blockLen: quant.QKK,
		one: one("dotQ5_KR1C1"), rows: pick("dotQ5_KR4C1"), rowsR: 4, tile: k("dotQ5_KR1C4"), tileR: 1, tileC: 4}
	l.k[quant.Q6_K] = &kset{blockLen: quant.QKK,
		one: one("dotQ6_KR1C1"), rows: pick("dotQ6_KR4C1"), rowsR: 4, tile: k("dotQ6_KR1C4"), tileR: 1, tileC: 4}
	// Their 1x4 tiles sum each row's blocks as the 4-row decode kernels do.
	l.k[quant.Q4_K].tileExact, l.k[quant.Q5_K].tileExact, l.k[quant.Q6_K].tileExact = true, true, true
	// IQ4_NL and IQ4_XS: decode kernels only (a batch runs them once per
	// activation).
	l.k[quant.IQ4_NL] = &kset{blockLen: quant.QK,
		one: one("dotIQ4_NLR1C1"), rows: pick("dotIQ4_NLR4C1"), rowsR: 4}
	l.k[quant.IQ4_XS] = &kset{blockLen: quant.QKK,
		one: one("dotIQ4_XSR1C1"), rows: pick("dotIQ4_XSR4C1"), rowsR: 4}
	// MXFP4 (gpt-oss's experts): decode kernels only, as IQ4_NL's.
	l.k[quant.MXFP4] = &kset{blockLen: quant.QK,
		one: one("dotMXFP4R1C1"), rows: pick("dotMXFP4R4C1"), rowsR: 4}
	// The IQ2, IQ3 and IQ1 types: decode kernels only, likewise.
	l.k[quant.IQ2_XXS] = &kset{blockLen: quant.QKK,
		one: one("dotIQ2_XXSR1C1"), rows: pick("dotIQ2_XXSR4C1"), rowsR: 4}
	l.k[quant.IQ2_XS] = &kset{blockLen: quant.QKK,
		one: one("dotIQ2_XSR1C1"), rows: pick("dotIQ2_XSR4C1"), rowsR: 4}
	l.k[quant.IQ2_S] = &kset{blockLen: quant.QKK,
		one: one("dotIQ2_SR1C1"), rows: pick("dotIQ2_SR4C1"), rowsR: 4}
	l.k[quant.IQ3_XXS] = &kset{blockLen: quant.QKK,
		one: one("dotIQ3_XXSR1C1"), rows: pick("dotIQ3_XXSR4C1"), rowsR: 4}
	l.k[quant.IQ3_S] = &kset{blockLen: quant.QKK,
		one: one("dotIQ3_SR1C1"), rows: pick("dotIQ3_SR4C1"), rowsR: 4}
	l.k[quant.IQ1_S] = &kset{blockLen: quant.QKK,
		one: one("dotIQ1_SR1C1"), rows: pick("dotIQ1_SR4C1"), rowsR: 4}
	l.k[quant.IQ1_M] = &kset{blockLen: quant.QKK,
		one: one("dotIQ1_MR1C1"), rows: pick("dotIQ1_MR4C1"), rowsR: 4}
	// Float rows prefetch to L2: their groups of 4 rows (16-45 KB in
	// TinyLlama's F16 matrices) leave L1 before they are read (AMD EPYC,
	// Zen 4, one thread, every F16 matrix of TinyLlama in turn from
	// resident memory: 24.0-24.2 GB/s with T0, 25.0-25.5 with T1).
	l.k[quant.F16] = &kset{blockLen: 16, tail: true,
		one: one("dotF16R1C1"), rows: k("dotF16R4C1"), rowsR: 4, tile: k("dotF16F32R4C3"), tileR: 4, tileC: 3, tileF32: true}
	l.k[quant.BF16] = &kset{blockLen: 16, tail: true,
		one: one("dotBF16R1C1"), rows: k("dotBF16R4C1"), rowsR: 4, tile: k("dotBF16F32R4C3"), tileR: 4, tileC: 3, tileF32: true}
	l.k[quant.F32] = &kset{blockLen: 16, tail: true,
		one: one("dotF32R1C1"), rows: k("dotF32R4C1"), rowsR: 4, tile: k("dotF32F32R4C3"), tileR: 4, tileC: 3, tileF32: true}
	floatTiles := [7]dotFn{nil, k("panelF32C1"), k("panelF32C2"), k("panelF32C3"), k("panelF32C4"), k("panelF32C5"), k("panelF32C6")}
	for t, pack := range map[quant.Type]func(*byte, int, int, *float32, int){
		quant.F16: panelPackF16, quant.BF16: panelPackBF16, quant.F32: panelPackF32} {
		l.k[t].panel = &panelSet{R: 16, group: 16, blockLen: 16, C: 6, tiles: floatTiles, blockBytes: 1024,
			pack: floatPanel(pack, t.RowSize(16)/16), minN: 12}
	}
	if intel || !cpu.X86.HasAVX512F {
		// Float rows decode faster with the hardware prefetcher alone on
		// Intel cores (TinyLlama F16 tg on one thread of a Xeon with
		// AVX-512 BF16: 77% -> 89% of the bandwidth roofline) and on AMD
		// cores without AVX-512 (EPYC, Zen 3, one thread, every F16 matrix
		// of TinyLlama in turn from resident memory, five interleaved
		// runs: 1 row 16.3-17.1 GB/s, 4 rows with PREFETCHT1 18.5-19.3,
		// 4 rows without prefetch 20.8-23.0; BF16: 13.6-16.3, 16.2-18.9,
		// 16.8-19.8).
		l.k[quant.F16].rows, l.k[quant.BF16].rows, l.k[quant.F32].rows = k("dotF16R4C1NP"), k("dotBF16R4C1NP"), k("dotF32R4C1NP")
	} else {
		// On AMD cores with AVX-512 (Zen 4), one F16 row at a time is one
		// sequential stream through the matrix, which the hardware
		// prefetcher follows best (AMD EPYC, Zen 4, one thread, every F16
		// matrix of TinyLlama in turn from resident memory, three
		// interleaved runs: 4 rows with PREFETCHT1 21.7-22.4 GB/s, 2 rows
		// 23.1-23.9, 1 row 24.7-25.2).
		l.k[quant.F16].rows, l.k[quant.F16].rowsR = k("dotF16R1C1"), 1
	}
	ls := []*level{l}
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI {
		// AVX-512 VNNI: prefill tiles for the 32-element and float formats, and
		// the Q4_K, Q5_K and Q6_K decode kernels (the AVX2 ones are compute bound on one
		// core);
		// the other decode kernels keep up with memory in AVX2.
		v := *l
		v.name = "avx512"
		for _, t := range []quant.Type{quant.Q4_0, quant.Q5_0, quant.Q8_0} {
			ks := *l.k[t]
			ks.tileR, ks.tileC, ks.tileU8 = 4, 8, true
			ks.panel = nil // VNNI tiles need no panels
			v.k[t] = &ks
		}
		v.k[quant.Q4_0].tile, v.k[quant.Q4_0].tile4 = k("dotQ4_0V4C8"), k("dotQ4_0V4C4")
		v.k[quant.Q8_0].tile, v.k[quant.Q8_0].tile4 = k("dotQ8_0V4C8"), k("dotQ8_0V4C4")
		v.k[quant.Q5_0].tile, v.k[quant.Q5_0].tile4 = k("dotQ5_0V4C8"), k("dotQ5_0V4C4")
		v.k[quant.Q8_0].rowsU8, v.k[quant.Q5_0].rowsU8 = pick("dotQ8_0V4C1"), pick("dotQ5_0V4C1")
		v.k[quant.Q4_0].rowsX, v.k[quant.Q4_0].auxPrep = pickX("dotQ4_0SV4C1"), auxQ4_0S
		// Matrices in the packed layout (Pack): the same tiles and decode
		// kernels without the per-row loads and inserts.
		v.k[quant.Q4_0].packed = &kset{blockLen: quant.QK, rowsR: 4,
			rowsX: pickX("dotQ4_0PSV4C1"), auxPrep: auxQ4_0P,
			tile: k("dotQ4_0PV4C8"), tile4: k("dotQ4_0PV4C4"), tileR: 4, tileC: 8, tileU8: true}
		v.k[quant.Q8_0].packed = &kset{blockLen: quant.QK, rowsR: 4,
			rowsU8: pick("dotQ8_0PV4C1"),
			tile:   k("dotQ8_0PV4C8"), tile4: k("dotQ8_0PV4C4"), tileR: 4, tileC: 8, tileU8: true}
		q4k, q5k, q6k := *l.k[quant.Q4_K], *l.k[quant.Q5_K], *l.k[quant.Q6_K]
		// (the AVX-512 tiles are not shown to sum as the decode kernels do)
		q4k.tileExact, q5k.tileExact, q6k.tileExact = false, false, false
		q4k.rows, q5k.rows, q6k.rows = pick("dotQ4_KV4C1"), pick("dotQ5_KV4C1"), pick("dotQ6_KV4C1")
		q4k.tile, q4k.tile4, q4k.tileR, q4k.tileC, q4k.tileK8 = k("dotQ4_KV1C8"), k("dotQ4_KV1C4"), 1, 8, true
		q5k.tile, q5k.tile4, q5k.tileR, q5k.tileC, q5k.tileK8 = k("dotQ5_KV1C8"), k("dotQ5_KV1C4"), 1, 8, true
		q6k.tile, q6k.tile4, q6k.tileR, q6k.tileC = k("dotQ6_KV1C8"), k("dotQ6_KV1C4"), 1, 8
		v.k[quant.Q4_K], v.k[quant.Q5_K], v.k[quant.Q6_K] = &q4k, &q5k, &q6k
		for t, f := range map[quant.Type][2]dotFn{
			quant.F16:  {k("dotF16F32V4C6"), k("dotF16F32V4C4")},
			quant.BF16: {k("dotBF16F32V4C6"), k("dotBF16F32V4C4")},
			quant.F32:  {k("dotF32F32V4C6"), k("dotF32F32V4C4")},
		} {
			ks := *l.k[t]
			ks.tile, ks.tile4, ks.tileR, ks.tileC = f[0], f[1], 4, 6
			ks.panel = nil
			v.k[t] = &ks
		}
		if cpu.X86.HasAVX512BF16 {
			// BF16 weights against the BF16 activation rows as they are
			// (VDPBF16PS, 32 products per instruction), not widened.
			ks := *v.k[quant.BF16]
			ks.tile, ks.tile4, ks.tileR, ks.tileC, ks.tileF32 = k("dotBF16V4C6"), k("dotBF16V4C4"), 4, 6, false
			ks.rest = [4]dotFn{nil, k("dotBF16V4C1"), k("dotBF16V4C2"), k("dotBF16V4C3")}
			v.k[quant.BF16] = &ks
		}
		ls = append([]*level{&v}, ls...)
	}
	return ls
}

// forVendor returns name, a decode kernel that prefetches to L2, on Intel
// cores, and its variant that prefetches to L1 (name + "T0") on others.
func forVendor(intel bool, name string) string {
	if intel {
		return name
	}
	return name + "T0"
}

// vendorIntel is "Genu", the first four bytes of "GenuineIntel" in EBX.
const vendorIntel = 0x756e6547

// The tables the IQ2 and IQ3 kernels read by symbol (see _generate/iq2.go
// and iq3.go): the codebooks, and per 7-bit sign index the 8 signs as
// bytes, -1 for a negative weight and +1 otherwise.
var (
	iq2xxsGrid = quant.IQ2XXSGrid
	iq2xsGrid  = quant.IQ2XSGrid
	iq2sGrid   = quant.IQ2SGrid
	iq3xxsGrid = quant.IQ3XXSGrid
	iq3sGrid   = quant.IQ3SGrid
	iq2Signs64 = func() (t [128]uint64) {
		for i, s := range quant.IQ2Signs {
			for j := 0; j < 8; j++ {
				b := uint64(0x01)
				if s>>j&1 != 0 {
					b = 0xff
				}
				t[i] |= b << (8 * j)
			}
		}
		return t
	}()
	// the IQ1 codebook as 8v+1 for every value v (see _generate/iq1.go)
	iq1Grid8 = func() (g [2048][8]int8) {
		for i, pt := range quant.IQ1Grid {
			for j, v := range pt {
				g[i][j] = 8*v + 1
			}
		}
		return g
	}()
)
