package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- panel kernels (AVX2 prefill)
//
// A panel is 8 weight rows (floats: 16, as float32) that MatMul lays out
// afresh for each call (see panel.go in the package), so that one ymm holds
// the same 4 (Q4_0), 2 (Q8_0) or 1 (floats) columns of 8 rows. A broadcast
// activation word then multiplies 8 rows at once and the row sums sit in the
// lanes of one accumulator: no horizontal sums, for the quants one
// conversion, scale and FMA per block and activation for 8 rows, and the
// results go out with one store per 8 rows.
//
// Every panel kernel has the dotFn signature; w is the panel and ws is
// unused. It computes out[c*os + r] for the panel's rows r (8, or 16 for
// floats) and c < C.

// panelBegin starts a panel kernel: the panel pointer, the C activation
// pointers and the block count.
func panelBegin(name string, C int, doc string) (w GPVirtual, a []GPVirtual, nb GPVirtual) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s: a panel of %s x %d activation row(s)", name, doc, C))
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
	w, a, nb := panelBegin(name, C, "8 Q4_0 weight rows (s8 activations)")
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
	w, a, nb := panelBegin(name, C, "8 Q8_0 weight rows (i16 activations)")
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

// panelF32: float panels (per column, the 16 rows' float32 values in 64
// bytes) against float32 activation rows, 16 columns per block. Each column
// is two ymm of rows times a broadcast activation: 12 FMAs per column for 6
// activations, the most registers allow.
func panelF32(name string, C int) {
	w, a, nb := panelBegin(name, C, "16 float weight rows (float32 activations, 16 columns per block)")
	acc := zeros(2 * C)
	panelLoop(w, a, nb, 1024, 64, func() {
		for k := 0; k < 16; k++ {
			w0, w1 := YMM(), YMM()
			VMOVUPS(Mem{Base: w, Disp: 64 * k}, w0)
			VMOVUPS(Mem{Base: w, Disp: 64*k + 32}, w1)
			for c := 0; c < C; c++ {
				b := YMM()
				VBROADCASTSS(Mem{Base: a[c], Disp: 4 * k}, b)
				VFMADD231PS(w0, b, acc[2*c])
				VFMADD231PS(w1, b, acc[2*c+1])
			}
		}
	})
	out := ld("out")
	os := ld("os")
	SHLQ(U8(2), os)
	for c := 0; c < C; c++ {
		VMOVUPS(acc[2*c], Mem{Base: out})
		VMOVUPS(acc[2*c+1], Mem{Base: out, Disp: 32})
		if c+1 < C {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}

// panelPackF writes 8 float rows (format f, ws bytes apart) of nk columns
// (a multiple of 8) as float32 columns: column k's 8 values at dst + k*ds
// bytes. Per 8 columns: 8 loads, an 8x8 transpose, 8 stores.
func panelPackF(name string, f ffmt) {
	TEXT(name, NOSPLIT, "func(w *byte, ws int, nk int, dst *float32, ds int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s writes 8 rows of nk %s values (a multiple of 8) as float32 columns of 8, ds bytes apart.", name, []string{"float32", "f16", "bf16"}[f]))
	p, _ := rowPtrs(8)
	nk := ld("nk")
	dst := ld("dst")
	ds := ld("ds")
	SHRQ(U8(3), nk)
	TESTQ(nk, nk)
	JZ(LabelRef("done"))
	Label("loop")
	v := make([]VecVirtual, 8)
	for r := range v {
		v[r] = YMM()
		loadF(f, Mem{Base: p[r]}, v[r])
	}
	o := GP64()
	MOVQ(dst, o)
	for _, x := range transpose8x8(v) {
		VMOVUPS(x, Mem{Base: o})
		ADDQ(ds, o)
	}
	MOVQ(o, dst)
	for _, r := range p {
		ADDQ(U32(8*f.size()), r)
	}
	DECQ(nk)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// panelPackQ writes 8 Q4_0 (q80 false) or Q8_0 rows (ws bytes apart) of nb
// blocks as a panel (see packQ4_0Panel and packQ8_0Panel in the package):
// per block, a 4x4 (Q4_0) or two 8x8 (Q8_0, widened to int16) dword
// transposes and the 8 scales.
func panelPackQ(name string, q80 bool) {
	TEXT(name, NOSPLIT, "func(w *byte, ws int, nb int, dst *byte)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s writes 8 rows of nb blocks, ws bytes apart, as a panel at dst.", name))
	p, _ := rowPtrs(8)
	nb := ld("nb")
	dst := ld("dst")
	bs, pbs, sc := 18, 144, 128
	if q80 {
		bs, pbs, sc = 34, 528, 512
	}
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	if q80 {
		for h := 0; h < 2; h++ {
			v := make([]VecVirtual, 8)
			for r := range v {
				v[r] = YMM()
				VPMOVSXBW(Mem{Base: p[r], Disp: 2 + 16*h}, v[r])
			}
			for j, x := range transpose8x8(v) {
				VMOVDQU(x, Mem{Base: dst, Disp: 32 * (8*h + j)})
			}
		}
	} else {
		v := make([]VecVirtual, 4)
		for r := range v {
			v[r] = YMM()
			VMOVDQU(Mem{Base: p[r], Disp: 2}, v[r].AsX())
			VINSERTI128(U8(1), Mem{Base: p[r+4], Disp: 2}, v[r], v[r])
		}
		for d, x := range transpose4x4(v) {
			VMOVDQU(x, Mem{Base: dst, Disp: 32 * d})
		}
	}
	t := GP16()
	for r := 0; r < 8; r++ {
		MOVW(Mem{Base: p[r]}, t)
		MOVW(t, Mem{Base: dst, Disp: sc + 2*r})
	}
	for _, r := range p {
		ADDQ(U32(bs), r)
	}
	ADDQ(U32(pbs), dst)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// transpose4x4 transposes the 4x4 dwords in each lane of v[0..3]: result
// d holds dword d of v[0..3] in each lane.
func transpose4x4(v []VecVirtual) []VecVirtual {
	t := make([]VecVirtual, 4)
	for i := 0; i < 2; i++ {
		t[2*i], t[2*i+1] = YMM(), YMM()
		VUNPCKLPS(v[2*i+1], v[2*i], t[2*i])
		VUNPCKHPS(v[2*i+1], v[2*i], t[2*i+1])
	}
	u := make([]VecVirtual, 4)
	for e := range u {
		u[e] = YMM()
		VSHUFPS(U8([]uint8{0x44, 0xee}[e%2]), t[2+e/2], t[e/2], u[e])
	}
	return u
}

// transpose8x8 transposes 8 vectors of 8 dwords: result e holds dword e of
// v[0..7].
func transpose8x8(v []VecVirtual) []VecVirtual {
	lo, hi := transpose4x4(v[:4]), transpose4x4(v[4:])
	out := make([]VecVirtual, 8)
	for e := range out {
		out[e] = YMM()
		imm := uint8(0x20)
		if e >= 4 {
			imm = 0x31
		}
		VPERM2F128(U8(imm), hi[e%4], lo[e%4], out[e])
	}
	return out
}
