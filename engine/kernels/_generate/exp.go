package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- exp over float32 vectors (AVX2), for softmax and SiLU
//
// exp(x) = 2^n · p(r), n = round(x/ln2), r = x − n·ln2 (ln2 in two parts),
// p a degree-7 polynomial (Taylor terms refined for float32), x clamped to
// [expLo, expHi] so that 2^n stays a normal float. exp.go beside the
// kernels computes the same sequence in scalar Go.

var expC struct {
	lo, hi, log2e, ln2hi, ln2lo, one, bias Mem
	p                                      [6]Mem
}

func f32bits(f float64) uint32 { return math.Float32bits(float32(f)) }

func constsExp() {
	expC.lo = splat32("expLo", f32bits(-87.33654))
	expC.hi = splat32("expHi", f32bits(88.37626))
	expC.log2e = splat32("expLog2e", f32bits(1.44269504088896341))
	expC.ln2hi = splat32("expLn2hi", f32bits(0.693359375))
	expC.ln2lo = splat32("expLn2lo", f32bits(-2.12194440e-4))
	expC.one = splat32("expOne", f32bits(1))
	expC.bias = splat32("expBias", 127)
	for i, c := range []float64{1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1} {
		expC.p[i] = splat32("expP"+string(rune('0'+i)), f32bits(c))
	}
}

// expPS returns exp(v) (v is clobbered).
func expPS(v VecVirtual) VecVirtual {
	VMAXPS(expC.lo, v, v)
	VMINPS(expC.hi, v, v)
	n := YMM()
	VMULPS(expC.log2e, v, n)
	VROUNDPS(U8(0), n, n) // to nearest
	VFNMADD231PS(expC.ln2hi, n, v)
	VFNMADD231PS(expC.ln2lo, n, v)
	p := YMM()
	VMOVUPS(expC.p[0], p)
	for _, c := range expC.p[1:] {
		VFMADD213PS(c, v, p) // p = p·r + c
	}
	r2 := YMM()
	VMULPS(v, v, r2)
	VFMADD213PS(v, r2, p) // p·r² + r
	VADDPS(expC.one, p, p)
	e := YMM()
	VCVTPS2DQ(n, e)
	VPADDD(expC.bias, e, e)
	VPSLLD(U8(23), e, e)
	VMULPS(e, p, p)
	return p
}

// expSub: x[i] = exp(x[i] − m) for n (a multiple of 8) floats; returns the
// sum of the results.
func expSub() {
	TEXT("expSubAVX2", NOSPLIT, "func(x *float32, n int, m float32) float32")
	Pragma("noescape")
	Doc("expSubAVX2: x[i] = exp(x[i]-m) for n (a multiple of 8) floats; returns their sum.")
	x, n := ld("x"), ld("n")
	mx := XMM()
	Load(Param("m"), mx)
	mm := YMM()
	VBROADCASTSS(mx, mm)
	sum := YMM()
	VXORPS(sum, sum, sum)
	TESTQ(n, n)
	JZ(LabelRef("done"))
	Label("loop")
	v := YMM()
	VMOVUPS(Mem{Base: x}, v)
	VSUBPS(mm, v, v)
	e := expPS(v)
	VMOVUPS(e, Mem{Base: x})
	VADDPS(e, sum, sum)
	ADDQ(U8(32), x)
	SUBQ(U8(8), n)
	JNZ(LabelRef("loop"))
	Label("done")
	s := half(sum)
	VHADDPS(s, s, s)
	VHADDPS(s, s, s)
	Store(s.(Register), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// siluMul: g[i] = g[i]/(1+exp(−g[i])) · u[i] for n (a multiple of 8) floats.
func siluMul() {
	TEXT("siluMulAVX2", NOSPLIT, "func(gate *float32, up *float32, n int)")
	Pragma("noescape")
	Doc("siluMulAVX2: g[i] = silu(g[i])·u[i] for n (a multiple of 8) floats.")
	g, u, n := ld("gate"), ld("up"), ld("n")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	Label("loop")
	x, v := YMM(), YMM()
	VMOVUPS(Mem{Base: g}, x)
	VXORPS(v, v, v)
	VSUBPS(x, v, v)
	e := expPS(v)
	VADDPS(expC.one, e, e)
	VDIVPS(e, x, x)
	VMULPS(Mem{Base: u}, x, x)
	VMOVUPS(x, Mem{Base: g})
	ADDQ(U8(32), g)
	ADDQ(U8(32), u)
	SUBQ(U8(8), n)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// ---- float32 to half conversion (F16C), for F16 activations and the F16
// KV cache: VCVTPS2PH with round-to-nearest-even, as quant.FP32ToFP16.

// f32ToF16: dst[i] = half(src[i]) for n (a multiple of 8) floats.
func f32ToF16() {
	TEXT("f32ToF16AVX2", NOSPLIT, "func(dst *uint16, src *float32, n int)")
	Pragma("noescape")
	Doc("f32ToF16AVX2: dst[i] = half bits of src[i] (round to nearest even) for n (a multiple of 8) floats.")
	d, s, n := ld("dst"), ld("src"), ld("n")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	Label("loop")
	v, h := YMM(), XMM()
	VMOVUPS(Mem{Base: s}, v)
	VCVTPS2PH(U8(0), v, h)
	VMOVDQU(h, Mem{Base: d})
	ADDQ(U8(32), s)
	ADDQ(U8(16), d)
	SUBQ(U8(8), n)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// f16ToF32: dst[i] = float32(src[i]) for n (a multiple of 8) halves
// (F16 payloads off the wire; exact).
func f16ToF32() {
	TEXT("f16ToF32AVX2", NOSPLIT, "func(dst *float32, src *uint16, n int)")
	Pragma("noescape")
	Doc("f16ToF32AVX2: dst[i] = the float32 value of half bits src[i] for n (a multiple of 8) halves.")
	d, s, n := ld("dst"), ld("src"), ld("n")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	Label("loop")
	v := YMM()
	VCVTPH2PS(Mem{Base: s}, v)
	VMOVUPS(v, Mem{Base: d})
	ADDQ(U8(16), s)
	ADDQ(U8(32), d)
	SUBQ(U8(8), n)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// roundF16s: x[i] = float32(half(x[i])) in place for n (a multiple of 8)
// floats, and the same after scaling by s (scaleRoundF16AVX2).
func roundF16s() {
	roundF16Kernel(true)
	roundF16Kernel(false)
}

func roundF16Kernel(scaled bool) {
	var x, n GPVirtual
	var sv VecVirtual
	if scaled {
		TEXT("scaleRoundF16AVX2", NOSPLIT, "func(x *float32, n int, s float32)")
		Pragma("noescape")
		Doc("scaleRoundF16AVX2: x[i] = x[i]·s rounded to half precision (nearest even), n a multiple of 8.")
		x, n = ld("x"), ld("n")
		sx := XMM()
		sv = YMM()
		Load(Param("s"), sx)
		VBROADCASTSS(sx, sv)
	} else {
		TEXT("roundF16AVX2", NOSPLIT, "func(x *float32, n int)")
		Pragma("noescape")
		Doc("roundF16AVX2: x[i] = x[i] rounded to half precision (nearest even), n a multiple of 8.")
		x, n = ld("x"), ld("n")
	}
	TESTQ(n, n)
	JZ(LabelRef("done"))
	Label("loop")
	v, h := YMM(), XMM()
	if scaled {
		VMULPS(Mem{Base: x}, sv, v)
	} else {
		VMOVUPS(Mem{Base: x}, v)
	}
	VCVTPS2PH(U8(0), v, h)
	VCVTPH2PS(h, v)
	VMOVUPS(v, Mem{Base: x})
	ADDQ(U8(32), x)
	SUBQ(U8(8), n)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// scaleMax: x[i] = x[i]·s for n (a multiple of 8, at least 8) floats;
// returns the largest result (attention scores before their softmax).
func scaleMax() {
	TEXT("scaleMaxAVX2", NOSPLIT, "func(x *float32, n int, s float32) float32")
	Pragma("noescape")
	Doc("scaleMaxAVX2: x[i] = x[i]·s for n (a multiple of 8, at least 8) floats; returns the largest.")
	x, n := ld("x"), ld("n")
	sx := XMM()
	Load(Param("s"), sx)
	sv := YMM()
	VBROADCASTSS(sx, sv)
	mx := YMM()
	VMULPS(Mem{Base: x}, sv, mx)
	VMOVUPS(mx, Mem{Base: x})
	ADDQ(U8(32), x)
	SUBQ(U8(8), n)
	JZ(LabelRef("done"))
	Label("loop")
	v := YMM()
	VMULPS(Mem{Base: x}, sv, v)
	VMOVUPS(v, Mem{Base: x})
	VMAXPS(v, mx, mx)
	ADDQ(U8(32), x)
	SUBQ(U8(8), n)
	JNZ(LabelRef("loop"))
	Label("done")
	t := XMM()
	VEXTRACTF128(U8(1), mx, t)
	VMAXPS(mx.AsX(), t, t)
	u := XMM()
	VPERMILPS(U8(0x4e), t, u) // swap the 64-bit halves
	VMAXPS(u, t, t)
	VPERMILPS(U8(0xb1), t, u) // swap neighbours
	VMAXPS(u, t, t)
	Store(t, ReturnIndex(0))
	VZEROUPPER()
	RET()
}
