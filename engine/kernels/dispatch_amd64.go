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
	// Decode kernels prefetch the next rows to L2 on Intel cores and to L1
	// elsewhere (see prefetchStep in _generate/main.go).
	intel := cpuidVendorEBX() == vendorIntel
	pick := func(t1, t0 dotFn) dotFn { return forVendor(intel, t1, t0) }
	pickX := func(t1, t0 rowsXFn) rowsXFn { return forVendor(intel, t1, t0) }
	l := &level{name: "avx2", q8_0: quantQ8_0AVX2, q8_K: quantQ8_KAVX2, prepU8: prepU8AVX2, scoresF16: scoresF16AVX2, accumF16: accumF16AVX2,
		expSub: expSubAVX2, siluMul: siluMulAVX2, f32ToF16: f32ToF16AVX2, roundF16: roundF16AVX2,
		scaleRoundF16: scaleRoundF16AVX2, scaleMax: scaleMaxAVX2}
	l.k[quant.Q4_0] = &kset{blockLen: quant.QK,
		one: oneQ4_0, rowsR: 4, rowsX: pickX(dotQ4_0X4, dotQ4_0X4T0), auxPrep: auxPairs(8), tile: dotQ4_0R2C4, tileR: 2, tileC: 4}
	l.k[quant.Q4_0].panel = &panelSet{R: 8, group: 64, blockLen: quant.QK, C: 4, tiles: [7]dotFn{nil, panelQ4_0C1, panelQ4_0C2, panelQ4_0C3, panelQ4_0C4},
		blockBytes: 144, pack: quantPanel(panelPackQ4_0, 18, 144), prep: prepS8, actBytes: 40, minN: 4}
	l.k[quant.Q8_0] = &kset{blockLen: quant.QK,
		one: oneQ8_0, rowsR: 4, rowsX: pickX(dotQ8_0X4, dotQ8_0X4T0), auxPrep: auxQ8_0}
	if intel {
		// Eight rows at once keep more memory streams busy on Intel cores;
		// on an AMD EPYC (AVX2 only) they streamed at 10 GB/s where four
		// rows stream at 17-19 (BenchmarkMatMul/Q8_0/stream/n=1).
		l.k[quant.Q8_0].rowsX8 = dotQ8_0X8
	}
	l.k[quant.Q8_0].panel = &panelSet{R: 8, group: 64, blockLen: quant.QK, C: 4, tiles: [7]dotFn{nil, panelQ8_0C1, panelQ8_0C2, panelQ8_0C3, panelQ8_0C4},
		blockBytes: 528, pack: quantPanel(panelPackQ8_0, 34, 528), prep: prepI16, actBytes: 68, minN: 12}
	l.k[quant.Q5_0] = &kset{blockLen: quant.QK,
		one: oneQ5_0, rowsR: 4, rowsX: pickX(dotQ5_0X4, dotQ5_0X4T0), auxPrep: auxPairs(16), tile: dotQ5_0R2C2, tileR: 2, tileC: 2}
	l.k[quant.Q4_K] = &kset{blockLen: quant.QKK,
		one: oneQ4_K, rows: pick(dotQ4_KR4C1, dotQ4_KR4C1T0), rowsR: 4, tile: dotQ4_KR1C4, tileR: 1, tileC: 4}
	l.k[quant.Q5_K] = &kset{blockLen: quant.QKK,
		one: oneQ5_K, rows: pick(dotQ5_KR4C1, dotQ5_KR4C1T0), rowsR: 4, tile: dotQ5_KR1C4, tileR: 1, tileC: 4}
	l.k[quant.Q6_K] = &kset{blockLen: quant.QKK,
		one: oneQ6_K, rows: pick(dotQ6_KR4C1, dotQ6_KR4C1T0), rowsR: 4, tile: dotQ6_KR1C4, tileR: 1, tileC: 4}
	// Their 1x4 tiles sum each row's blocks as the 4-row decode kernels do.
	l.k[quant.Q4_K].tileExact, l.k[quant.Q5_K].tileExact, l.k[quant.Q6_K].tileExact = true, true, true
	// IQ4_NL and IQ4_XS: decode kernels only (a batch runs them once per
	// activation).
	l.k[quant.IQ4_NL] = &kset{blockLen: quant.QK,
		one: oneIQ4_NL, rows: pick(dotIQ4_NLR4C1, dotIQ4_NLR4C1T0), rowsR: 4}
	l.k[quant.IQ4_XS] = &kset{blockLen: quant.QKK,
		one: oneIQ4_XS, rows: pick(dotIQ4_XSR4C1, dotIQ4_XSR4C1T0), rowsR: 4}
	// The IQ2, IQ3 and IQ1 types: decode kernels only, likewise.
	l.k[quant.IQ2_XXS] = &kset{blockLen: quant.QKK,
		one: oneIQ2_XXS, rows: pick(dotIQ2_XXSR4C1, dotIQ2_XXSR4C1T0), rowsR: 4}
	l.k[quant.IQ2_XS] = &kset{blockLen: quant.QKK,
		one: oneIQ2_XS, rows: pick(dotIQ2_XSR4C1, dotIQ2_XSR4C1T0), rowsR: 4}
	l.k[quant.IQ2_S] = &kset{blockLen: quant.QKK,
		one: oneIQ2_S, rows: pick(dotIQ2_SR4C1, dotIQ2_SR4C1T0), rowsR: 4}
	l.k[quant.IQ3_XXS] = &kset{blockLen: quant.QKK,
		one: oneIQ3_XXS, rows: pick(dotIQ3_XXSR4C1, dotIQ3_XXSR4C1T0), rowsR: 4}
	l.k[quant.IQ3_S] = &kset{blockLen: quant.QKK,
		one: oneIQ3_S, rows: pick(dotIQ3_SR4C1, dotIQ3_SR4C1T0), rowsR: 4}
	l.k[quant.IQ1_S] = &kset{blockLen: quant.QKK,
		one: oneIQ1_S, rows: pick(dotIQ1_SR4C1, dotIQ1_SR4C1T0), rowsR: 4}
	l.k[quant.IQ1_M] = &kset{blockLen: quant.QKK,
		one: oneIQ1_M, rows: pick(dotIQ1_MR4C1, dotIQ1_MR4C1T0), rowsR: 4}
	// Float rows prefetch to L2: their groups of 4 rows (16-45 KB in
	// TinyLlama's F16 matrices) leave L1 before they are read (AMD EPYC,
	// Zen 4, one thread, every F16 matrix of TinyLlama in turn from
	// resident memory: 24.0-24.2 GB/s with T0, 25.0-25.5 with T1).
	l.k[quant.F16] = &kset{blockLen: 16, tail: true,
		one: oneF16, rows: dotF16R4C1, rowsR: 4, tile: dotF16F32R4C3, tileR: 4, tileC: 3, tileF32: true}
	l.k[quant.BF16] = &kset{blockLen: 16, tail: true,
		one: oneBF16, rows: dotBF16R4C1, rowsR: 4, tile: dotBF16F32R4C3, tileR: 4, tileC: 3, tileF32: true}
	l.k[quant.F32] = &kset{blockLen: 16, tail: true,
		one: oneF32, rows: dotF32R4C1, rowsR: 4, tile: dotF32F32R4C3, tileR: 4, tileC: 3, tileF32: true}
	floatTiles := [7]dotFn{nil, panelF32C1, panelF32C2, panelF32C3, panelF32C4, panelF32C5, panelF32C6}
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
		l.k[quant.F16].rows, l.k[quant.BF16].rows, l.k[quant.F32].rows = dotF16R4C1NP, dotBF16R4C1NP, dotF32R4C1NP
	} else {
		// On AMD cores with AVX-512 (Zen 4), one F16 row at a time is one
		// sequential stream through the matrix, which the hardware
		// prefetcher follows best (AMD EPYC, Zen 4, one thread, every F16
		// matrix of TinyLlama in turn from resident memory, three
		// interleaved runs: 4 rows with PREFETCHT1 21.7-22.4 GB/s, 2 rows
		// 23.1-23.9, 1 row 24.7-25.2).
		l.k[quant.F16].rows, l.k[quant.F16].rowsR = dotF16R1C1, 1
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
		v.k[quant.Q4_0].tile, v.k[quant.Q4_0].tile4 = dotQ4_0V4C8, dotQ4_0V4C4
		v.k[quant.Q8_0].tile, v.k[quant.Q8_0].tile4 = dotQ8_0V4C8, dotQ8_0V4C4
		v.k[quant.Q5_0].tile, v.k[quant.Q5_0].tile4 = dotQ5_0V4C8, dotQ5_0V4C4
		v.k[quant.Q8_0].rowsU8, v.k[quant.Q5_0].rowsU8 = pick(dotQ8_0V4C1, dotQ8_0V4C1T0), pick(dotQ5_0V4C1, dotQ5_0V4C1T0)
		v.k[quant.Q4_0].rowsX, v.k[quant.Q4_0].auxPrep = pickX(dotQ4_0SV4C1, dotQ4_0SV4C1T0), auxQ4_0S
		// Matrices in the packed layout (Pack): the same tiles and decode
		// kernels without the per-row loads and inserts.
		v.k[quant.Q4_0].packed = &kset{blockLen: quant.QK, rowsR: 4,
			rowsX: pickX(dotQ4_0PSV4C1, dotQ4_0PSV4C1T0), auxPrep: auxQ4_0P,
			tile: dotQ4_0PV4C8, tile4: dotQ4_0PV4C4, tileR: 4, tileC: 8, tileU8: true}
		v.k[quant.Q8_0].packed = &kset{blockLen: quant.QK, rowsR: 4,
			rowsU8: pick(dotQ8_0PV4C1, dotQ8_0PV4C1T0),
			tile:   dotQ8_0PV4C8, tile4: dotQ8_0PV4C4, tileR: 4, tileC: 8, tileU8: true}
		q4k, q5k, q6k := *l.k[quant.Q4_K], *l.k[quant.Q5_K], *l.k[quant.Q6_K]
		// (the AVX-512 tiles are not shown to sum as the decode kernels do)
		q4k.tileExact, q5k.tileExact, q6k.tileExact = false, false, false
		q4k.rows, q5k.rows, q6k.rows = pick(dotQ4_KV4C1, dotQ4_KV4C1T0), pick(dotQ5_KV4C1, dotQ5_KV4C1T0), pick(dotQ6_KV4C1, dotQ6_KV4C1T0)
		q4k.tile, q4k.tile4, q4k.tileR, q4k.tileC, q4k.tileK8 = dotQ4_KV1C8, dotQ4_KV1C4, 1, 8, true
		q5k.tile, q5k.tile4, q5k.tileR, q5k.tileC, q5k.tileK8 = dotQ5_KV1C8, dotQ5_KV1C4, 1, 8, true
		q6k.tile, q6k.tile4, q6k.tileR, q6k.tileC = dotQ6_KV1C8, dotQ6_KV1C4, 1, 8
		v.k[quant.Q4_K], v.k[quant.Q5_K], v.k[quant.Q6_K] = &q4k, &q5k, &q6k
		for t, f := range map[quant.Type][2]dotFn{
			quant.F16:  {dotF16F32V4C6, dotF16F32V4C4},
			quant.BF16: {dotBF16F32V4C6, dotBF16F32V4C4},
			quant.F32:  {dotF32F32V4C6, dotF32F32V4C4},
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
			ks.tile, ks.tile4, ks.tileR, ks.tileC, ks.tileF32 = dotBF16V4C6, dotBF16V4C4, 4, 6, false
			ks.rest = [4]dotFn{nil, dotBF16V4C1, dotBF16V4C2, dotBF16V4C3}
			v.k[quant.BF16] = &ks
		}
		ls = append([]*level{&v}, ls...)
	}
	return ls
}

// forVendor returns the kernel that prefetches to L2 (t1) on Intel cores and
// the one that prefetches to L1 (t0) on others.
func forVendor[F any](intel bool, t1, t0 F) F {
	if intel {
		return t1
	}
	return t0
}

// vendorIntel is "Genu", the first four bytes of "GenuineIntel" in EBX.
const vendorIntel = 0x756e6547

func oneQ4_0(w, a *byte, nb int) float32 {
	var o [2]float32
	dotQ4_0R2C1(w, 0, a, 0, nb, &o[0], 0)
	return o[0]
}

func oneQ8_0(w, a *byte, nb int) (o float32)    { dotQ8_0R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ5_0(w, a *byte, nb int) (o float32)    { dotQ5_0R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ4_K(w, a *byte, nb int) (o float32)    { dotQ4_KR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ5_K(w, a *byte, nb int) (o float32)    { dotQ5_KR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ6_K(w, a *byte, nb int) (o float32)    { dotQ6_KR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ4_NL(w, a *byte, nb int) (o float32)  { dotIQ4_NLR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ4_XS(w, a *byte, nb int) (o float32)  { dotIQ4_XSR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ2_XXS(w, a *byte, nb int) (o float32) { dotIQ2_XXSR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ2_XS(w, a *byte, nb int) (o float32)  { dotIQ2_XSR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ2_S(w, a *byte, nb int) (o float32)   { dotIQ2_SR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ3_XXS(w, a *byte, nb int) (o float32) { dotIQ3_XXSR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ3_S(w, a *byte, nb int) (o float32)   { dotIQ3_SR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ1_S(w, a *byte, nb int) (o float32)   { dotIQ1_SR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneIQ1_M(w, a *byte, nb int) (o float32)   { dotIQ1_MR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneF16(w, a *byte, nb int) (o float32)     { dotF16R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneBF16(w, a *byte, nb int) (o float32)    { dotBF16R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneF32(w, a *byte, nb int) (o float32)     { dotF32R1C1(w, 0, a, 0, nb, &o, 0); return }

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
