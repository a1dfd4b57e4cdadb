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
	l := &level{name: "avx2", q8_K: quantQ8_KAVX2, axpyF16: axpyF16AVX2, scoresF16: scoresF16AVX2, accumF16: accumF16AVX2,
		expSub: expSubAVX2, siluMul: siluMulAVX2, f32ToF16: f32ToF16AVX2, roundF16: roundF16AVX2}
	l.k[quant.Q4_0] = &kset{blockLen: quant.QK,
		one: oneQ4_0, rowsR: 4, rowsX: dotQ4_0X4, auxPrep: auxPairs(8), tile: dotQ4_0R2C4, tileR: 2, tileC: 4}
	l.k[quant.Q8_0] = &kset{blockLen: quant.QK,
		one: oneQ8_0, rowsR: 4, rowsX: dotQ8_0X4, rowsX8: dotQ8_0X8, auxPrep: auxQ8_0}
	l.k[quant.Q5_0] = &kset{blockLen: quant.QK,
		one: oneQ5_0, rowsR: 4, rowsX: dotQ5_0X4, auxPrep: auxPairs(16), tile: dotQ5_0R2C2, tileR: 2, tileC: 2}
	l.k[quant.Q4_K] = &kset{blockLen: quant.QKK,
		one: oneQ4_K, rows: dotQ4_KR4C1, rowsR: 4, tile: dotQ4_KR1C4, tileR: 1, tileC: 4}
	l.k[quant.Q5_K] = &kset{blockLen: quant.QKK,
		one: oneQ5_K, rows: dotQ5_KR4C1, rowsR: 4, tile: dotQ5_KR1C4, tileR: 1, tileC: 4}
	l.k[quant.Q6_K] = &kset{blockLen: quant.QKK,
		one: oneQ6_K, rows: dotQ6_KR4C1, rowsR: 4, tile: dotQ6_KR1C4, tileR: 1, tileC: 4}
	l.k[quant.F16] = &kset{blockLen: 16, tail: true,
		one: oneF16, rows: dotF16R4C1, rowsR: 4, tile: dotF16F32R4C3, tileR: 4, tileC: 3, tileF32: true}
	l.k[quant.BF16] = &kset{blockLen: 16, tail: true,
		one: oneBF16, rows: dotBF16R4C1, rowsR: 4, tile: dotBF16F32R4C3, tileR: 4, tileC: 3, tileF32: true}
	l.k[quant.F32] = &kset{blockLen: 16, tail: true,
		one: oneF32, rows: dotF32R4C1, rowsR: 4, tile: dotF32F32R4C3, tileR: 4, tileC: 3, tileF32: true}
	if cpuidVendorEBX() == vendorIntel {
		// Float rows decode faster on Intel cores with the hardware
		// prefetcher alone (TinyLlama F16 tg on one thread of a Xeon with
		// AVX-512 BF16: 77% -> 89% of the bandwidth roofline).
		l.k[quant.F16].rows, l.k[quant.BF16].rows, l.k[quant.F32].rows = dotF16R4C1NP, dotBF16R4C1NP, dotF32R4C1NP
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
			v.k[t] = &ks
		}
		v.k[quant.Q4_0].tile, v.k[quant.Q4_0].tile4 = dotQ4_0V4C8, dotQ4_0V4C4
		v.k[quant.Q8_0].tile, v.k[quant.Q8_0].tile4 = dotQ8_0V4C8, dotQ8_0V4C4
		v.k[quant.Q5_0].tile, v.k[quant.Q5_0].tile4 = dotQ5_0V4C8, dotQ5_0V4C4
		v.k[quant.Q8_0].rowsU8, v.k[quant.Q5_0].rowsU8 = dotQ8_0V4C1, dotQ5_0V4C1
		v.k[quant.Q4_0].rowsX, v.k[quant.Q4_0].auxPrep = dotQ4_0SV4C1, auxQ4_0S
		q4k, q5k, q6k := *l.k[quant.Q4_K], *l.k[quant.Q5_K], *l.k[quant.Q6_K]
		q4k.rows, q5k.rows, q6k.rows = dotQ4_KV4C1, dotQ5_KV4C1, dotQ6_KV4C1
		v.k[quant.Q4_K], v.k[quant.Q5_K], v.k[quant.Q6_K] = &q4k, &q5k, &q6k
		for t, f := range map[quant.Type][2]dotFn{
			quant.F16:  {dotF16F32V4C6, dotF16F32V4C4},
			quant.BF16: {dotBF16F32V4C6, dotBF16F32V4C4},
			quant.F32:  {dotF32F32V4C6, dotF32F32V4C4},
		} {
			ks := *l.k[t]
			ks.tile, ks.tile4, ks.tileR, ks.tileC = f[0], f[1], 4, 6
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

// vendorIntel is "Genu", the first four bytes of "GenuineIntel" in EBX.
const vendorIntel = 0x756e6547

func oneQ4_0(w, a *byte, nb int) float32 {
	var o [2]float32
	dotQ4_0R2C1(w, 0, a, 0, nb, &o[0], 0)
	return o[0]
}

func oneQ8_0(w, a *byte, nb int) (o float32) { dotQ8_0R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ5_0(w, a *byte, nb int) (o float32) { dotQ5_0R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ4_K(w, a *byte, nb int) (o float32) { dotQ4_KR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ5_K(w, a *byte, nb int) (o float32) { dotQ5_KR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneQ6_K(w, a *byte, nb int) (o float32) { dotQ6_KR1C1(w, 0, a, 0, nb, &o, 0); return }
func oneF16(w, a *byte, nb int) (o float32)  { dotF16R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneBF16(w, a *byte, nb int) (o float32) { dotBF16R1C1(w, 0, a, 0, nb, &o, 0); return }
func oneF32(w, a *byte, nb int) (o float32)  { dotF32R1C1(w, 0, a, 0, nb, &o, 0); return }
