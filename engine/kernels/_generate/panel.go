package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- panel kernels (AVX2 prefill)
//
// A panel is 8 weight rows that MatMul lays out afresh for each call (see
// panel.go in the package), so that one ymm holds the same 4 (or 2) columns
// of all 8 rows. A broadcast activation word then multiplies 8 rows at once
// and the 8 row sums sit in the lanes of one accumulator: no horizontal sums,
// one conversion, scale and FMA per block and activation for 8 rows, and the
// 8 results go out with one store.
//
// Every panel kernel has the dotFn signature; w is the panel and ws is
// unused. It computes out[c*os + r] for r < 8 and c < C.

// panelBegin starts a panel kernel: the panel pointer, the C activation
// pointers and the block count.
func panelBegin(name string, C int, doc string) (w GPVirtual, a []GPVirtual, nb GPVirtual) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s: a panel of 8 weight rows x %d activation row(s); %s", name, C, doc))
	w = ld("w")
	a = []GPVirtual{ld("a")}
	if C > 1 {
		as := ld("as")
		for c := 1; c < C; c++ {
			p := GP64()
			LEAQ(Mem{Base: a[c-1], Index: as, Scale: 1}, p)
			a = append(a, p)
		}
	}
	return w, a, ld("nb")
}

// panelLoop runs body once per block, then steps the panel by wstep bytes
// and each activation by astep.
func panelLoop(w GPVirtual, a []GPVirtual, nb GPVirtual, wstep, astep int, body func()) {
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	body()
	ADDQ(U32(wstep), w)
	for _, p := range a {
		ADDQ(U32(astep), p)
	}
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
}

// panelScale adds the block's 8 int32 row sums s, times the activation's
// float32 scale at a and the rows' scales dw, to acc.
func panelScale(s VecVirtual, a Mem, dw, acc VecVirtual) {
	f, b := YMM(), YMM()
	VCVTDQ2PS(s, f)
	VBROADCASTSS(a, b)
	VMULPS(b, f, f)
	VFMADD231PS(f, dw, acc)
}

// panelStore writes accumulator c (8 rows) to out + c*os floats.
func panelStore(acc []VecVirtual) {
	out := ld("out")
	os := ld("os")
	SHLQ(U8(2), os)
	for c, v := range acc {
		VMOVUPS(v, Mem{Base: out})
		if c+1 < len(acc) {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}

// panelQ4_0: Q4_0 panel blocks of 144 bytes (quant dword d of rows 0..7 in
// bytes 32d..32d+31, d < 4, then the rows' 8 f16 scales) against s8
// activation blocks of 40 bytes (f32 scale, int32 8*sum of the quants, the 32
// quants). The nibbles are used unsigned (VPMADDUBSW; 8 products of at most
// 2*15*128 add up in 16 bits without overflow) and 8*sum is subtracted per
// block.
func panelQ4_0(name string, C int) {
	w, a, nb := panelBegin(name, C, "Q4_0 weights, s8 activations")
	acc := zeros(C)
	i16 := make([]VecVirtual, C)
	for c := range i16 {
		i16[c] = YMM()
	}
	panelLoop(w, a, nb, 144, 40, func() {
		dwx := XMM()
		VMOVDQU(Mem{Base: w, Disp: 128}, dwx)
		dw := YMM()
		VCVTPH2PS(dwx, dw)
		for d := 0; d < 4; d++ {
			lo, hi := YMM(), YMM()
			VMOVDQU(Mem{Base: w, Disp: 32 * d}, lo)
			VPSRLW(U8(4), lo, hi)
			VPAND(c0F, lo, lo)
			VPAND(c0F, hi, hi)
			for h, v := range []VecVirtual{lo, hi} {
				for c := 0; c < C; c++ {
					b := YMM()
					VPBROADCASTD(Mem{Base: a[c], Disp: 8 + 16*h + 4*d}, b)
					if d == 0 && h == 0 {
						VPMADDUBSW(b, v, i16[c])
					} else {
						t := YMM()
						VPMADDUBSW(b, v, t)
						VPADDW(t, i16[c], i16[c])
					}
				}
			}
		}
		for c := 0; c < C; c++ {
			s, b := YMM(), YMM()
			VPMADDWD(ones16, i16[c], s)
			VPBROADCASTD(Mem{Base: a[c], Disp: 4}, b)
			VPSUBD(b, s, s)
			panelScale(s, Mem{Base: a[c]}, dw, acc[c])
		}
	})
	panelStore(acc)
}

// panelQ8_0: Q8_0 panel blocks of 528 bytes (the quants widened to int16,
// columns 2j and 2j+1 of rows 0..7 in bytes 32j..32j+31, j < 16, then the
// rows' 8 f16 scales) against i16 activation blocks of 68 bytes (f32 scale,
// the 32 quants as int16). VPMADDWD multiplies a column pair of 8 rows by a
// broadcast activation pair; the int32 sums cannot overflow.
func panelQ8_0(name string, C int) {
	w, a, nb := panelBegin(name, C, "Q8_0 weights, i16 activations")
	acc := zeros(C)
	i32 := make([]VecVirtual, C)
	for c := range i32 {
		i32[c] = YMM()
	}
	panelLoop(w, a, nb, 528, 68, func() {
		for j := 0; j < 16; j++ {
			v := YMM()
			VMOVDQU(Mem{Base: w, Disp: 32 * j}, v)
			for c := 0; c < C; c++ {
				b := YMM()
				VPBROADCASTD(Mem{Base: a[c], Disp: 4 + 4*j}, b)
				if j == 0 {
					VPMADDWD(b, v, i32[c])
				} else {
					t := YMM()
					VPMADDWD(b, v, t)
					VPADDD(t, i32[c], i32[c])
				}
			}
		}
		dwx := XMM()
		VMOVDQU(Mem{Base: w, Disp: 512}, dwx)
		dw := YMM()
		VCVTPH2PS(dwx, dw)
		for c := 0; c < C; c++ {
			panelScale(i32[c], Mem{Base: a[c]}, dw, acc[c])
		}
	})
	panelStore(acc)
}
