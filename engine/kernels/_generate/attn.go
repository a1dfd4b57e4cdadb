package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- attention over F16 cache rows (AVX2)

// scoresF16: out[t] = dot(q[0:d], row t) for t < T, row t at k + t*stride
// bytes (half floats); d a multiple of 8. Four keys at a time share each
// load of q.
func scoresF16() {
	TEXT("scoresF16AVX2", NOSPLIT, "func(q *float32, k *uint16, stride int, d int, T int, out *float32)")
	Pragma("noescape")
	Doc("scoresF16AVX2: out[t] = q·row t for T half-float rows at k + t*stride bytes; d a multiple of 8.")
	q, k, stride, d, T, out := ld("q"), ld("k"), ld("stride"), ld("d"), ld("T"), ld("out")
	j := GP64()

	quad := func(kr []GPVirtual) {
		acc := zeros(len(kr))
		XORQ(j, j)
		Label("quadDim")
		qv := YMM()
		VMOVUPS(Mem{Base: q, Index: j, Scale: 4}, qv)
		for i, p := range kr {
			t := YMM()
			VCVTPH2PS(Mem{Base: p, Index: j, Scale: 2}, t)
			VFMADD231PS(t, qv, acc[i])
		}
		ADDQ(U8(8), j)
		CMPQ(j, d)
		JB(LabelRef("quadDim"))
		h := make([]Op, 4)
		for i := range acc {
			h[i] = half(acc[i])
		}
		VHADDPS(h[1], h[0], h[0])
		VHADDPS(h[3], h[2], h[2])
		VHADDPS(h[2], h[0], h[0])
		VMOVUPS(h[0], Mem{Base: out})
	}

	CMPQ(T, U8(4))
	JB(LabelRef("single"))
	Label("quad")
	k1, k2, k3 := GP64(), GP64(), GP64()
	LEAQ(Mem{Base: k, Index: stride, Scale: 1}, k1)
	LEAQ(Mem{Base: k, Index: stride, Scale: 2}, k2)
	LEAQ(Mem{Base: k1, Index: stride, Scale: 2}, k3)
	quad([]GPVirtual{k, k1, k2, k3})
	LEAQ(Mem{Base: k3, Index: stride, Scale: 1}, k)
	ADDQ(U8(16), out)
	SUBQ(U8(4), T)
	CMPQ(T, U8(4))
	JAE(LabelRef("quad"))

	Label("single")
	TESTQ(T, T)
	JZ(LabelRef("done"))
	acc := YMM()
	VXORPS(acc, acc, acc)
	XORQ(j, j)
	Label("singleDim")
	t := YMM()
	VCVTPH2PS(Mem{Base: k, Index: j, Scale: 2}, t)
	VFMADD231PS(Mem{Base: q, Index: j, Scale: 4}, t, acc)
	ADDQ(U8(8), j)
	CMPQ(j, d)
	JB(LabelRef("singleDim"))
	x := half(acc)
	VHADDPS(x, x, x)
	VHADDPS(x, x, x)
	VMOVSS(x, Mem{Base: out})
	ADDQ(stride, k)
	ADDQ(U8(4), out)
	DECQ(T)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// accumF16: acc[0:d] += sum over t < T of p[t] * row t, row t at v + t*stride
// bytes (half floats); d a multiple of 8. The accumulator stays in registers
// 32 floats at a time while all T rows pass.
func accumF16() {
	TEXT("accumF16AVX2", NOSPLIT, "func(acc *float32, p *float32, v *uint16, stride int, d int, T int)")
	Pragma("noescape")
	Doc("accumF16AVX2: acc[0:d] += Σ_t p[t]·row t for T half-float rows at v + t*stride bytes; d a multiple of 8.")
	acc, p, v, stride, d, T := ld("acc"), ld("p"), ld("v"), ld("stride"), ld("d"), ld("T")
	TESTQ(T, T)
	JZ(LabelRef("done"))
	row, t := GP64(), GP64()

	chunk := func(name string, w int) {
		a := make([]VecVirtual, w)
		for i := range a {
			a[i] = YMM()
			VMOVUPS(Mem{Base: acc, Disp: 32 * i}, a[i])
		}
		MOVQ(v, row)
		XORQ(t, t)
		Label(name)
		b := YMM()
		VBROADCASTSS(Mem{Base: p, Index: t, Scale: 4}, b)
		for i := range a {
			x := YMM()
			VCVTPH2PS(Mem{Base: row, Disp: 16 * i}, x)
			VFMADD231PS(x, b, a[i])
		}
		ADDQ(stride, row)
		INCQ(t)
		CMPQ(t, T)
		JB(LabelRef(name))
		for i := range a {
			VMOVUPS(a[i], Mem{Base: acc, Disp: 32 * i})
		}
		ADDQ(U32(32*w), acc)
		ADDQ(U32(16*w), v)
	}

	Label("wide")
	CMPQ(d, U8(32))
	JB(LabelRef("narrow"))
	chunk("wideRow", 4)
	SUBQ(U8(32), d)
	JMP(LabelRef("wide"))
	Label("narrow")
	TESTQ(d, d)
	JZ(LabelRef("done"))
	chunk("narrowRow", 1)
	SUBQ(U8(8), d)
	JMP(LabelRef("narrow"))
	Label("done")
	VZEROUPPER()
	RET()
}

// accumQ: acc[0:d] += sum over t < T of p[t] * row t, row t at v + t*stride
// bytes, a Q8_0 row (q4 false) or a Q4_0 row (q4 true) of d/32 blocks: a
// quantized KV cache's value rows. The 32 floats of a block stay in
// registers while all T rows pass; d a multiple of 32.
func accumQ(name string, q4 bool) {
	TEXT(name, NOSPLIT, "func(acc *float32, p *float32, v *byte, stride int, d int, T int)")
	Pragma("noescape")
	kind, bs := "Q8_0", 34
	if q4 {
		kind, bs = "Q4_0", 18
	}
	Doc(name + ": acc[0:d] += Σ_t p[t]·row t for T " + kind + " rows at v + t*stride bytes; d a multiple of 32.")
	acc, p, v, stride, d, T := ld("acc"), ld("p"), ld("v"), ld("stride"), ld("d"), ld("T")
	TESTQ(T, T)
	JZ(LabelRef("done"))
	row, t, h := GP64(), GP64(), GP32()
	Label("block")
	CMPQ(d, U8(32))
	JB(LabelRef("done"))
	a := make([]VecVirtual, 4)
	for i := range a {
		a[i] = YMM()
		VMOVUPS(Mem{Base: acc, Disp: 32 * i}, a[i])
	}
	MOVQ(v, row)
	XORQ(t, t)
	Label("row")
	// the row's coefficient: p[t] times the block's half-float scale
	MOVWLZX(Mem{Base: row}, h)
	s := XMM()
	VMOVD(h, s)
	VCVTPH2PS(s, s)
	VMULSS(Mem{Base: p, Index: t, Scale: 4}, s, s)
	b := YMM()
	VBROADCASTSS(s, b)
	fma := func(i int, src Op) {
		x := YMM()
		VPMOVSXBD(src, x)
		VCVTDQ2PS(x, x)
		VFMADD231PS(x, b, a[i])
	}
	if q4 {
		// elements 0-15 are the low nibbles, 16-31 the high ones, less 8
		raw, lo, hi := XMM(), XMM(), XMM()
		VMOVDQU(Mem{Base: row, Disp: 2}, raw)
		VPAND(c0F, raw, lo)
		VPSRLW(U8(4), raw, hi)
		VPAND(c0F, hi, hi)
		VPSUBB(c08, lo, lo)
		VPSUBB(c08, hi, hi)
		for i, src := range []VecVirtual{lo, hi} {
			fma(2*i, src)
			up := XMM()
			VPSRLDQ(U8(8), src, up)
			fma(2*i+1, up)
		}
	} else {
		for i := range a {
			fma(i, Mem{Base: row, Disp: 2 + 8*i})
		}
	}
	ADDQ(stride, row)
	INCQ(t)
	CMPQ(t, T)
	JB(LabelRef("row"))
	for i := range a {
		VMOVUPS(a[i], Mem{Base: acc, Disp: 32 * i})
	}
	ADDQ(U8(128), acc)
	ADDQ(U8(bs), v)
	SUBQ(U8(32), d)
	JMP(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}
