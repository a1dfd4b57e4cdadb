// Command _generate writes shoal's amd64 AVX2+FMA+F16C kernels with avo:
//
//	cd engine/kernels/_generate && go run . -out ../dot_amd64.s -stubs ../dot_amd64.go -pkg kernels
//
// (go generate ./engine/kernels runs it.)
//
// Every dot kernel has the signature
//
//	func(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)
//
// and computes, for R weight rows (w + r*ws) and C activation rows (a + c*as)
// of nb blocks each, out[c*os + r] = dot(row r, act c). R and C are fixed per
// kernel and in its name (…R4C1 is the 4-row decode kernel). For the float
// formats a "block" is 16 elements.
//
// Those kernels, and the decode kernels of signature sigX, are not declared
// in Go: after avo has written both files, static.go makes them file-local
// symbols that Go reaches by name through address tables and two
// trampolines.
package main

import (
	"fmt"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// prefetchT0 makes prefetchStep prefetch to L1 instead of L2.
var prefetchT0 bool

const sig = "func(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)"

// sigX is the signature of the decode kernels that take activation data
// from auxPrep (see q40x).
const sigX = "func(w *byte, ws int, a *byte, aux *byte, nb int, out *float32)"

func main() {
	ConstraintExpr("amd64,!noasm,gc")
	consts()
	consts512()
	constsQ4K512()
	constsQ6K512()
	constsExp()
	constsIQ4()
	constsMXFP4()
	constsIQ2()
	constsIQ1()
	cpuid()

	q40x("dotQ4_0X4", quant40, 4)
	q40x("dotQ8_0X4", quant80, 4)
	q40x("dotQ5_0X4", quant50, 4)
	q40x("dotQ8_0X8", quant80, 8)
	q40("dotQ4_0R2C1", 2, 1)
	q40("dotQ4_0R2C4", 2, 4)
	q80("dotQ8_0R1C1", 1, 1)
	q80("dotQ8_0R2C2", 2, 2)
	q50("dotQ5_0R1C1", 1, 1)
	q50("dotQ5_0R2C2", 2, 2)
	for c := 1; c <= 4; c++ {
		panelQ4_0(fmt.Sprintf("panelQ4_0C%d", c), c)
		panelQ8_0(fmt.Sprintf("panelQ8_0C%d", c), c)
	}
	for c := 1; c <= 6; c++ {
		panelF32(fmt.Sprintf("panelF32C%d", c), c)
	}
	panelPackQ("panelPackQ4_0", false)
	panelPackQ("panelPackQ8_0", true)
	panelPackF("panelPackF16", fF16)
	panelPackF("panelPackBF16", fBF16)
	panelPackF("panelPackF32", fF32)

	fdot("dotF16R4C1", fF16, fF16, 4, 1)
	fdot("dotF16R1C1", fF16, fF16, 1, 1)
	fdot("dotBF16R4C1", fBF16, fBF16, 4, 1)
	fdot("dotBF16R1C1", fBF16, fBF16, 1, 1)
	fdot("dotF32R4C1", fF32, fF32, 4, 1)
	fdot("dotF32R1C1", fF32, fF32, 1, 1)
	fdot("dotF16R4C1NP", fF16, fF16, 4, 1)
	fdot("dotBF16R4C1NP", fBF16, fBF16, 4, 1)
	fdot("dotF32R4C1NP", fF32, fF32, 4, 1)
	fdot("dotF16F32R4C3", fF16, fF32, 4, 3)
	fdot("dotBF16F32R4C3", fBF16, fF32, 4, 3)
	fdot("dotF32F32R4C3", fF32, fF32, 4, 3)

	q4k("dotQ4_KR4C1", 4, 1, false)
	q4k("dotQ4_KR1C1", 1, 1, false)
	q4k("dotQ4_KR1C4", 1, 4, false)
	q4k("dotQ5_KR4C1", 4, 1, true)
	q4k("dotQ5_KR1C1", 1, 1, true)
	q4k("dotQ5_KR1C4", 1, 4, true)
	q6k("dotQ6_KR4C1", 4, 1)
	q6k("dotQ6_KR1C1", 1, 1)
	q6k("dotQ6_KR1C4", 1, 4)
	iq4Kernels(false)
	mxfp4Kernels(false)
	iq2Kernels(false)
	iq1Kernels(false)

	legacyV4("dotQ4_0V4C8", quant40, 8, false)
	legacyV4("dotQ8_0V4C8", quant80, 8, false)
	q4kV4("dotQ4_KV4C1", false)
	q4kV4("dotQ5_KV4C1", true)
	q6kV4("dotQ6_KV4C1")
	q4kTile("dotQ4_KV1C8", 8, false)
	q4kTile("dotQ4_KV1C4", 4, false)
	q4kTile("dotQ5_KV1C8", 8, true)
	q4kTile("dotQ5_KV1C4", 4, true)
	q6kTile("dotQ6_KV1C8", 8)
	q6kTile("dotQ6_KV1C4", 4)
	legacyV4("dotQ4_0V4C4", quant40, 4, false)
	q40s("dotQ4_0SV4C1")
	legacyV4("dotQ8_0V4C1", quant80, 1, false)
	legacyV4("dotQ5_0V4C1", quant50, 1, false)
	legacyV4("dotQ8_0V4C4", quant80, 4, false)
	legacyV4("dotQ5_0V4C8", quant50, 8, false)
	legacyV4("dotQ5_0V4C4", quant50, 4, false)
	legacyV4("dotQ4_0PV4C8", quant40, 8, true)
	legacyV4("dotQ4_0PV4C4", quant40, 4, true)
	legacyV4("dotQ8_0PV4C8", quant80, 8, true)
	legacyV4("dotQ8_0PV4C4", quant80, 4, true)
	q40p("dotQ4_0PSV4C1")
	legacyV4("dotQ8_0PV4C1", quant80, 1, true)
	fdot512("dotF16F32V4C6", fF16, 6)
	fdot512("dotBF16F32V4C6", fBF16, 6)
	fdot512("dotF32F32V4C6", fF32, 6)
	fdot512("dotF16F32V4C4", fF16, 4)
	fdot512("dotBF16F32V4C4", fBF16, 4)
	fdot512("dotF32F32V4C4", fF32, 4)
	bf16V4("dotBF16V4C6", 6)
	bf16V4("dotBF16V4C4", 4)
	bf16V4("dotBF16V4C3", 3)
	bf16V4("dotBF16V4C2", 2)
	bf16V4("dotBF16V4C1", 1)

	// the decode kernels again, prefetching to L1 (see prefetchStep)
	prefetchT0 = true
	q40x("dotQ4_0X4T0", quant40, 4)
	q40x("dotQ8_0X4T0", quant80, 4)
	q40x("dotQ5_0X4T0", quant50, 4)
	q4k("dotQ4_KR4C1T0", 4, 1, false)
	q4k("dotQ5_KR4C1T0", 4, 1, true)
	q6k("dotQ6_KR4C1T0", 4, 1)
	q4kV4("dotQ4_KV4C1T0", false)
	q4kV4("dotQ5_KV4C1T0", true)
	q6kV4("dotQ6_KV4C1T0")
	q40s("dotQ4_0SV4C1T0")
	legacyV4("dotQ8_0V4C1T0", quant80, 1, false)
	legacyV4("dotQ5_0V4C1T0", quant50, 1, false)
	q40p("dotQ4_0PSV4C1T0")
	legacyV4("dotQ8_0PV4C1T0", quant80, 1, true)
	iq4Kernels(true)
	mxfp4Kernels(true)
	iq2Kernels(true)
	iq1Kernels(true)
	prefetchT0 = false

	scoresF16()
	accumF16()
	accumQ("accumQ8_0AVX2", false)
	accumQ("accumQ4_0AVX2", true)
	expSub()
	siluMul()
	f32ToF16()
	f16ToF32()
	roundF16s()
	scaleMax()

	quantQ8_0()
	prepU8()
	q8sums()
	quantQ8_K()

	Generate()
	staticKernels() // rewrites what Generate wrote: see static.go
}

// ---- constants

var (
	c0F, c08, c10, c20, c30, ones16, onesU8         Mem
	bitsSel, bitsShuf                               Mem
	absMask, signMask, halfDown                     Mem
	q6kEvenOdd, wordBcast                           Mem
	q4kShufA, q4kShufB, q4kMaskA1, q4kMaskA2        Mem
	q5kBit                                          [8]Mem
	q50Shuf                                         [2]Mem
	packPerm, lowByte, magic, mant23, half22, c127d Mem
)

func splat8(name string, v byte) Mem {
	m := GLOBL(name, RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		DATA(i, U8(v))
	}
	return m
}

func splat32(name string, v uint32) Mem {
	m := GLOBL(name, RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(v))
	}
	return m
}

func consts() {
	c0F = splat8("c0F", 0x0f)
	c08 = splat8("c08", 0x08)
	c10 = splat8("c10", 0x10)
	c20 = splat8("c20", 0x20)
	c30 = splat8("c30", 0x30)
	onesU8 = splat8("onesU8", 0x01)
	ones16 = GLOBL("ones16", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(2*i, U16(1))
	}
	// Q5_0 high bits: broadcast the 32-bit qh, byte j takes byte j/8 of it
	// (bitsShuf), then tests bit j%8 (bitsSel).
	bitsShuf = GLOBL("bitsShuf", RODATA|NOPTR)
	for j := 0; j < 32; j++ {
		DATA(j, U8(j/8))
	}
	bitsSel = GLOBL("bitsSel", RODATA|NOPTR)
	for j := 0; j < 32; j++ {
		DATA(j, U8(1<<(j%8)))
	}
	absMask = GLOBL("absMask", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(0x7fffffff))
	}
	signMask = GLOBL("signMask", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(0x80000000))
	}
	// 0.49999997 = 0.5 - 2^-25: x + copysign(halfDown, x) truncated is roundf(x).
	halfDown = GLOBL("halfDown", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(0x3effffff))
	}
	// Q6_K scales: even-indexed scales to the low 8 bytes, odd to the high.
	q6kEvenOdd = GLOBL("q6kEvenOdd", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(i, U8(2*i))
	}
	for i := 0; i < 8; i++ {
		DATA(8+i, U8(2*i+1))
	}
	// Q5_0 in lane pairs: byte j of either lane takes byte j/8 (low nibbles)
	// or 2+j/8 (high nibbles) of that lane's qh.
	for i := range q50Shuf {
		q50Shuf[i] = GLOBL(fmt.Sprintf("q50Shuf%d", i), RODATA|NOPTR)
		for j := 0; j < 32; j++ {
			DATA(j, U8(2*i+j%16/8))
		}
	}
	// Q4_K scales in vector registers (q4kScalesVec): the 16 bytes from the
	// block's start rearranged by two VPSHUFB controls and masks.
	q4kShufA = GLOBL("q4kShufA", RODATA|NOPTR)
	for i, b := range []int{4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15} {
		DATA(i, U8(b))
	}
	q4kShufB = GLOBL("q4kShufB", RODATA|NOPTR)
	for i, b := range []int{0x80, 0x80, 0x80, 0x80, 4, 5, 6, 7, 0x80, 0x80, 0x80, 0x80, 8, 9, 10, 11} {
		DATA(i, U8(b))
	}
	q4kMaskA1 = GLOBL("q4kMaskA1", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(i, U8([]byte{0x3f, 0x0f, 0x3f, 0x00}[i/4]))
	}
	q4kMaskA2 = GLOBL("q4kMaskA2", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(i, U8([]byte{0, 0, 0, 0x0f}[i/4]))
	}
	// wordBcast+32*i: VPSHUFB control broadcasting 16-bit word i of each lane.
	wordBcast = GLOBL("wordBcast", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		for b := 0; b < 32; b += 2 {
			DATA(32*i+b, U8(2*i))
			DATA(32*i+b+1, U8(2*i+1))
		}
	}
	for j := 0; j < 8; j++ {
		q5kBit[j] = splat8(fmt.Sprintf("q5kBit%d", j), 1<<j)
	}
	lowByte = splat32("lowByte", 0xff)
	magic = splat32("magic", 0x4b400000) // 12582912 = 1.5*2^23
	mant23 = splat32("mant23", 0x007fffff)
	half22 = splat32("half22", 0x00400000)
	c127d = splat32("c127d", 127)
	// VPERMD control undoing the lane interleave of VPACKSSDW+VPACKSSWB.
	packPerm = GLOBL("packPerm", RODATA|NOPTR)
	for i, v := range []uint32{0, 4, 1, 5, 2, 6, 3, 7} {
		DATA(4*i, U32(v))
	}
}

// ---- cpuid

func cpuid() {
	TEXT("cpuid1ECX", NOSPLIT, "func() uint32")
	Doc("cpuid1ECX returns ECX of CPUID leaf 1 (bit 29: F16C).")
	MOVL(U32(1), EAX)
	XORL(ECX, ECX)
	CPUID()
	Store(ECX, ReturnIndex(0))
	RET()

	TEXT("cpuidVendorEBX", NOSPLIT, "func() uint32")
	Doc("cpuidVendorEBX returns EBX of CPUID leaf 0: the first four bytes of the vendor string (\"Genu\", \"Auth\").")
	XORL(EAX, EAX)
	XORL(ECX, ECX)
	CPUID()
	Store(EBX, ReturnIndex(0))
	RET()
}

// ---- frame

type kern struct {
	name string
	R, C int
	w    []GPVirtual
	a    []GPVirtual
	nb   GPVirtual
	ws   GPVirtual // weight row stride (R > 1)
}

func begin(name string, R, C int, doc string) *kern {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s: %d weight row(s) x %d activation row(s); %s", name, R, C, doc))
	k := &kern{name: name, R: R, C: C}
	if R > 1 {
		k.w, k.ws = rowPtrs(R)
	} else {
		k.w = []GPVirtual{ld("w")}
	}
	k.a = append(k.a, ld("a"))
	if C > 1 {
		as := ld("as")
		for c := 1; c < C; c++ {
			p := GP64()
			LEAQ(Mem{Base: k.a[c-1], Index: as, Scale: 1}, p)
			k.a = append(k.a, p)
		}
	}
	k.nb = ld("nb")
	return k
}

func ld(name string) GPVirtual {
	r := GP64()
	Load(Param(name), r)
	return r
}

func zeros(n int) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = YMM()
		VXORPS(v[i], v[i], v[i])
	}
	return v
}

func (k *kern) loop(wstep, astep int, body func()) {
	// The multi-row decode kernels prefetch the next group of R rows, except
	// the NP variants, which leave it to the hardware prefetcher (faster
	// for float rows on Intel cores: see dispatch_amd64.go).
	var pf GPVirtual
	if k.R > 1 && k.C == 1 && !strings.HasSuffix(k.name, "NP") {
		pf = nextRows(k.w[k.R-1], k.ws)
	}
	TESTQ(k.nb, k.nb)
	JZ(LabelRef("done"))
	Label("loop")
	if pf != nil {
		prefetchStep(pf, k.R*wstep)
	}
	body()
	for _, p := range k.w {
		ADDQ(U32(wstep), p)
	}
	for _, p := range k.a {
		ADDQ(U32(astep), p)
	}
	DECQ(k.nb)
	JNZ(LabelRef("loop"))
	Label("done")
}

// half reduces a full 8-lane accumulator to 4 partial sums in an xmm.
func half(acc VecVirtual) Op {
	t := XMM()
	VEXTRACTF128(U8(1), acc, t)
	VADDPS(acc.AsX(), t, t)
	return t
}

// store writes, for each activation c, the R row sums whose 4 partial sums
// each are parts[c][r] (xmm).
func (k *kern) store(parts [][]Op) {
	out := ld("out")
	var os GPVirtual
	if k.C > 1 {
		os = ld("os")
		SHLQ(U8(2), os)
	}
	for c := 0; c < k.C; c++ {
		p := parts[c]
		m := Mem{Base: out}
		switch k.R {
		case 1:
			VHADDPS(p[0], p[0], p[0])
			VHADDPS(p[0], p[0], p[0])
			VMOVSS(p[0], m)
		case 2:
			VHADDPS(p[1], p[0], p[0])
			VHADDPS(p[0], p[0], p[0])
			VMOVQ(p[0], m)
		case 4:
			VHADDPS(p[1], p[0], p[0])
			VHADDPS(p[3], p[2], p[2])
			VHADDPS(p[2], p[0], p[0])
			VMOVUPS(p[0], m)
		default:
			panic("R")
		}
		if c+1 < k.C {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}

// storeRows stores per-row 8-lane accumulators acc[r][c].
func (k *kern) storeRows(acc [][]VecVirtual) {
	parts := make([][]Op, k.C)
	for c := range parts {
		for r := 0; r < k.R; r++ {
			parts[c] = append(parts[c], half(acc[r][c]))
		}
	}
	k.store(parts)
}

func grid(R, C int) [][]VecVirtual {
	g := make([][]VecVirtual, R)
	for r := range g {
		g[r] = zeros(C)
	}
	return g
}

// halfScale returns 8 copies of the f16 at m as float32 in a ymm.
func halfScale(m Mem) VecVirtual {
	x := XMM()
	VPBROADCASTW(m, x)
	y := YMM()
	VCVTPH2PS(x, y)
	return y
}

// ---- Q4_0 · Q8_0
//
// Rows go in pairs: one ymm holds the nibbles of a block of row 2p in its low
// lane and of row 2p+1 in its high lane; the activation halves are broadcast
// to both lanes. Nibbles are used unsigned (VPMADDUBSW) and 8*sum(y) is
// subtracted in 16 bits.

func q40(name string, R, C int) {
	k := begin(name, R, C, "Q4_0 weights, Q8_0 activations")
	P := R / 2
	mask, eights := YMM(), YMM()
	VMOVDQU(c0F, mask)
	VMOVDQU(c08, eights)
	acc := grid(P, C)
	k.loop(18, 34, func() {
		type wblk struct{ l, h, dw VecVirtual }
		unpack := func(p int) wblk {
			t, h := YMM(), YMM()
			VBROADCASTI128(Mem{Base: k.w[2*p], Disp: 2}, t)
			VINSERTI128(U8(1), Mem{Base: k.w[2*p+1], Disp: 2}, t, t)
			VPSRLW(U8(4), t, h)
			VPAND(mask, t, t)
			VPAND(mask, h, h)
			x0, x1 := XMM(), XMM()
			VPBROADCASTW(Mem{Base: k.w[2*p]}, x0)
			VPBROADCASTW(Mem{Base: k.w[2*p+1]}, x1)
			VPUNPCKLQDQ(x1, x0, x0)
			dw := YMM()
			VCVTPH2PS(x0, dw)
			return wblk{t, h, dw}
		}
		type ablk struct{ lo, hi, s, da VecVirtual }
		act := func(c int) ablk {
			lo, hi, s, t := YMM(), YMM(), YMM(), YMM()
			VBROADCASTI128(Mem{Base: k.a[c], Disp: 2}, lo)
			VBROADCASTI128(Mem{Base: k.a[c], Disp: 18}, hi)
			VPMADDUBSW(lo, eights, s)
			VPMADDUBSW(hi, eights, t)
			VPADDW(t, s, s)
			return ablk{lo, hi, s, halfScale(Mem{Base: k.a[c]})}
		}
		mac := func(wb wblk, ab ablk, acc VecVirtual) {
			p0, p1 := YMM(), YMM()
			VPMADDUBSW(ab.lo, wb.l, p0)
			VPMADDUBSW(ab.hi, wb.h, p1)
			VPADDW(p1, p0, p0)
			VPSUBW(ab.s, p0, p0)
			VPMADDWD(ones16, p0, p0)
			VCVTDQ2PS(p0, p0)
			VMULPS(ab.da, wb.dw, p1)
			VFMADD231PS(p0, p1, acc)
		}
		if C == 1 {
			ab := act(0)
			for p := 0; p < P; p++ {
				mac(unpack(p), ab, acc[p][0])
			}
			return
		}
		wbs := make([]wblk, P)
		for p := range wbs {
			wbs[p] = unpack(p)
		}
		for c := 0; c < C; c++ {
			ab := act(c)
			for p := 0; p < P; p++ {
				mac(wbs[p], ab, acc[p][c])
			}
		}
	})
	parts := make([][]Op, C)
	for c := range parts {
		for p := 0; p < P; p++ {
			hi := XMM()
			VEXTRACTF128(U8(1), acc[p][c], hi)
			parts[c] = append(parts[c], acc[p][c].AsX(), hi)
		}
	}
	k.store(parts)
}

// ---- Q8_0 · Q8_0: both sign-extended to 16 bits, VPMADDWD (exact for -128).

func q80(name string, R, C int) {
	k := begin(name, R, C, "Q8_0 weights, Q8_0 activations")
	acc := grid(R, C)
	k.loop(34, 34, func() {
		type blk struct{ lo, hi, d VecVirtual }
		load := func(p GPVirtual) blk {
			lo, hi := YMM(), YMM()
			VPMOVSXBW(Mem{Base: p, Disp: 2}, lo)
			VPMOVSXBW(Mem{Base: p, Disp: 18}, hi)
			return blk{lo, hi, halfScale(Mem{Base: p})}
		}
		mac := func(x, y blk, acc VecVirtual) {
			p0, p1 := YMM(), YMM()
			VPMADDWD(y.lo, x.lo, p0)
			VPMADDWD(y.hi, x.hi, p1)
			VPADDD(p1, p0, p0)
			VCVTDQ2PS(p0, p0)
			VMULPS(y.d, x.d, p1)
			VFMADD231PS(p0, p1, acc)
		}
		if C == 1 {
			y := load(k.a[0])
			for r := 0; r < R; r++ {
				mac(load(k.w[r]), y, acc[r][0])
			}
			return
		}
		xs := make([]blk, R)
		for r := range xs {
			xs[r] = load(k.w[r])
		}
		for c := 0; c < C; c++ {
			y := load(k.a[c])
			for r := 0; r < R; r++ {
				mac(xs[r], y, acc[r][c])
			}
		}
	})
	k.storeRows(acc)
}

// ---- Q5_0 · Q8_0: the fifth bits are spread to bytes (VPSHUFB of the
// broadcast qh, test bit j%8), giving unsigned 5-bit values; 16*sum(y) is
// subtracted in 16 bits.

func q50(name string, R, C int) {
	k := begin(name, R, C, "Q5_0 weights, Q8_0 activations")
	acc := grid(R, C)
	k.loop(22, 34, func() {
		type wblk struct{ q, dw VecVirtual }
		unpack := func(p GPVirtual) wblk {
			t, h := YMM(), YMM()
			VBROADCASTI128(Mem{Base: p, Disp: 6}, t)
			VPSRLW(U8(4), t, h)
			VPBLENDD(U8(0xf0), h, t, t)
			VPAND(c0F, t, t)
			b := YMM()
			VPBROADCASTD(Mem{Base: p, Disp: 2}, b)
			VPSHUFB(bitsShuf, b, b)
			VPAND(bitsSel, b, b)
			VPCMPEQB(bitsSel, b, b)
			VPAND(c10, b, b)
			VPOR(b, t, t)
			return wblk{t, halfScale(Mem{Base: p})}
		}
		type ablk struct{ y, s, da VecVirtual }
		act := func(c int) ablk {
			y, s, sx := YMM(), YMM(), YMM()
			VMOVDQU(Mem{Base: k.a[c], Disp: 2}, y)
			VMOVDQU(c10, sx)
			VPMADDUBSW(y, sx, s)
			return ablk{y, s, halfScale(Mem{Base: k.a[c]})}
		}
		mac := func(wb wblk, ab ablk, acc VecVirtual) {
			p0, p1 := YMM(), YMM()
			VPMADDUBSW(ab.y, wb.q, p0)
			VPSUBW(ab.s, p0, p0)
			VPMADDWD(ones16, p0, p0)
			VCVTDQ2PS(p0, p0)
			VMULPS(ab.da, wb.dw, p1)
			VFMADD231PS(p0, p1, acc)
		}
		if C == 1 {
			ab := act(0)
			for r := 0; r < R; r++ {
				mac(unpack(k.w[r]), ab, acc[r][0])
			}
			return
		}
		wbs := make([]wblk, R)
		for r := range wbs {
			wbs[r] = unpack(k.w[r])
		}
		for c := 0; c < C; c++ {
			ab := act(c)
			for r := 0; r < R; r++ {
				mac(wbs[r], ab, acc[r][c])
			}
		}
	})
	k.storeRows(acc)
}

// ---- float rows: blocks of 16 elements (two ymm of float32).

type ffmt int

const (
	fF32 ffmt = iota
	fF16
	fBF16
)

func (f ffmt) size() int {
	if f == fF32 {
		return 4
	}
	return 2
}

// loadF converts 8 elements at m to float32 in v.
func loadF(f ffmt, m Mem, v VecVirtual) {
	switch f {
	case fF32:
		VMOVUPS(m, v)
	case fF16:
		VCVTPH2PS(m, v)
	case fBF16:
		VPMOVZXWD(m, v)
		VPSLLD(U8(16), v, v)
	}
}

func fdot(name string, wf, af ffmt, R, C int) {
	k := begin(name, R, C, "float rows, 16 elements per block")
	if C == 1 {
		// two accumulators per row
		acc := grid(R, 2)
		k.loop(16*wf.size(), 16*af.size(), func() {
			a0, a1 := YMM(), YMM()
			loadF(af, Mem{Base: k.a[0]}, a0)
			loadF(af, Mem{Base: k.a[0], Disp: 8 * af.size()}, a1)
			for r := 0; r < R; r++ {
				x := YMM()
				loadF(wf, Mem{Base: k.w[r]}, x)
				VFMADD231PS(a0, x, acc[r][0])
				x = YMM()
				loadF(wf, Mem{Base: k.w[r], Disp: 8 * wf.size()}, x)
				VFMADD231PS(a1, x, acc[r][1])
			}
		})
		for r := 0; r < R; r++ {
			VADDPS(acc[r][1], acc[r][0], acc[r][0])
			acc[r] = acc[r][:1]
		}
		k.storeRows(acc)
		return
	}
	if af != fF32 {
		panic("tiled float kernels take float32 activations")
	}
	acc := grid(R, C)
	k.loop(16*wf.size(), 64, func() {
		for h := 0; h < 2; h++ {
			xs := make([]VecVirtual, R)
			for r := range xs {
				xs[r] = YMM()
				loadF(wf, Mem{Base: k.w[r], Disp: 8 * h * wf.size()}, xs[r])
			}
			for c := 0; c < C; c++ {
				for r := 0; r < R; r++ {
					VFMADD231PS(Mem{Base: k.a[c], Disp: 32 * h}, xs[r], acc[r][c])
				}
			}
		}
	})
	k.storeRows(acc)
}

// ---- Q4_K / Q5_K · Q8_K
//
// Per block: the 6-bit scales and mins are unpacked with integer
// instructions (the utmp shuffle of ggml) and widened to 16-bit words kept in
// a stack slot: words 0..7 the scales, 8..15 the mins. Sub-block j's products
// (VPMADDUBSW of the unsigned 4/5-bit values with the int8 activations) are
// weighted by its scale with VPMADDWD of a VPBROADCASTW of that word. The mins
// meet the pairwise sums of the Q8_K bsums in one VPMADDWD.

func q4k(name string, R, C int, withHigh bool) {
	bx, qoff := 144, 16
	what := "Q4_K weights, Q8_K activations"
	if withHigh {
		bx, qoff = 176, 48
		what = "Q5_K weights, Q8_K activations"
	}
	k := begin(name, R, C, what)
	slot := AllocLocal(32)
	// The decode kernels keep the scales in registers and broadcast them
	// with VPSHUFB (on an AMD EPYC, AVX2: 14.4 -> 17.1 GB/s in L2, where a
	// 32-byte store and 2-byte loads from it went through memory); with
	// several activations there are not enough registers, and the scales
	// go through a stack slot (VPBROADCASTW per sub-block).
	q4kSlot := C > 1
	acc := grid(R, C)
	k.loop(bx, 292, func() {
		// scales returns the block's 8 scales as words in both lanes (for
		// VPSHUFB broadcasts) and its 8 mins as words.
		scales := func(x GPVirtual) (sdup VecVirtual, mins VecVirtual) {
			xs := q4kScalesVec(x)
			wds := YMM()
			VPMOVZXBW(xs, wds)
			if q4kSlot {
				VMOVDQU(wds, slot)
				return nil, nil
			}
			sdup, mins = YMM(), XMM()
			VPERMQ(U8(0x44), wds, sdup)
			VEXTRACTI128(U8(1), wds, mins)
			return sdup, mins
		}
		// q8sp: the 8 sums bsums[2j]+bsums[2j+1] of activation c.
		q8sp := func(c int) VecVirtual {
			v := XMM()
			VMOVDQU(Mem{Base: k.a[c], Disp: 260}, v)
			VPHADDW(Mem{Base: k.a[c], Disp: 276}, v, v)
			return v
		}
		// With several rows and one activation, the activation's pair sums
		// and scale are read once per block.
		var q8s, das VecVirtual
		if R > 1 {
			q8s, das = q8sp(0), YMM()
			VBROADCASTSS(Mem{Base: k.a[0]}, das)
		}
		// finish adds one block's integer sums of row x · act c into acc.
		finish := func(x GPVirtual, c int, sumi, acc VecVirtual, mins VecVirtual) {
			var mm Op = mins
			if q4kSlot {
				mm = slot.Offset(16)
			}
			mp := XMM()
			if q8s != nil {
				VPMADDWD(mm, q8s, mp)
			} else {
				VPMADDWD(mm, q8sp(c), mp)
			}
			VCVTDQ2PS(mp, mp)
			dd, t := XMM(), YMM()
			VPBROADCASTD(Mem{Base: x}, dd)
			VCVTPH2PS(dd, t)
			da := das
			if da == nil {
				da = YMM()
				VBROADCASTSS(Mem{Base: k.a[c]}, da)
			}
			VMULPS(da, t, t)
			dv, dm := YMM(), YMM()
			VPERMILPS(U8(0x00), t, dv)
			VPERMILPS(U8(0x55), t, dm)
			VCVTDQ2PS(sumi, sumi)
			VFMADD231PS(sumi, dv, acc)
			VFNMADD231PS(mp.AsY(), dm, acc)
		}
		for r := 0; r < R; r++ {
			x := k.w[r]
			sdup, mins := scales(x)
			var qh VecVirtual
			if withHigh {
				qh = YMM()
				VMOVDQU(Mem{Base: x, Disp: 16}, qh)
			}
			sumi := make([]VecVirtual, C)
			for kk := 0; kk < 4; kk++ {
				l, h := YMM(), YMM()
				VMOVDQU(Mem{Base: x, Disp: qoff + 32*kk}, l)
				VPSRLW(U8(4), l, h)
				VPAND(c0F, l, l)
				VPAND(c0F, h, h)
				if withHigh {
					for i, v := range []VecVirtual{l, h} {
						j := 2*kk + i
						b := YMM()
						VPAND(q5kBit[j], qh, b)
						switch {
						case j < 4:
							VPSLLW(U8(4-j), b, b)
						case j > 4:
							VPSRLW(U8(j-4), b, b)
						}
						VPOR(b, v, v)
					}
				}
				s0, s1 := YMM(), YMM()
				if q4kSlot {
					VPBROADCASTW(slot.Offset(2*(2*kk)), s0)
					VPBROADCASTW(slot.Offset(2*(2*kk+1)), s1)
				} else {
					VPSHUFB(wordBcast.Offset(32*(2*kk)), sdup, s0)
					VPSHUFB(wordBcast.Offset(32*(2*kk+1)), sdup, s1)
				}
				for c := 0; c < C; c++ {
					p0, p1 := YMM(), YMM()
					VPMADDUBSW(Mem{Base: k.a[c], Disp: 4 + 64*kk}, l, p0)
					VPMADDUBSW(Mem{Base: k.a[c], Disp: 4 + 64*kk + 32}, h, p1)
					VPMADDWD(s0, p0, p0)
					VPMADDWD(s1, p1, p1)
					if kk == 0 {
						sumi[c] = p0
					} else {
						VPADDD(p0, sumi[c], sumi[c])
					}
					VPADDD(p1, sumi[c], sumi[c])
				}
			}
			for c := 0; c < C; c++ {
				finish(x, c, sumi[c], acc[r][c], mins)
			}
		}
	})
	k.storeRows(acc)
}

// ---- Q6_K · Q8_K
//
// Per 128-element half: 4 vectors of 32 6-bit values built from ql nibbles and
// qh bit pairs, used unsigned; the -32 offset is applied once per block as
// 32 * sum(scale_g * bsum_g). Vector k of half h spans sub-blocks 8h+2k (low
// lane) and 8h+2k+1 (high lane); their scales come from the scales reordered
// even/odd and widened (lane 0 even, lane 1 odd), picked with VPSHUFB.

func q6k(name string, R, C int) {
	k := begin(name, R, C, "Q6_K weights, Q8_K activations")
	acc := grid(R, C)
	k.loop(210, 292, func() {
		var das VecVirtual // with several rows: the activation's scale, read once
		if R > 1 {
			das = YMM()
			VBROADCASTSS(Mem{Base: k.a[0]}, das)
		}
		for r := 0; r < R; r++ {
			x := k.w[r]
			sce, xs := YMM(), XMM()
			VMOVDQU(Mem{Base: x, Disp: 192}, xs)
			VPSHUFB(q6kEvenOdd, xs, xs)
			VPMOVSXBW(xs, sce)
			sumi := make([]VecVirtual, C)
			for h := 0; h < 2; h++ {
				ql := Mem{Base: x, Disp: 64 * h}
				qhm := Mem{Base: x, Disp: 128 + 32*h}
				qh := YMM()
				VMOVDQU(qhm, qh)
				for kk := 0; kk < 4; kk++ {
					q, t := YMM(), YMM()
					// low nibbles of ql[0:32] (kk=0), ql[32:64] (kk=1); high nibbles (kk=2,3)
					VMOVDQU(ql.Offset(32*(kk&1)), q)
					if kk >= 2 {
						VPSRLW(U8(4), q, q)
					}
					VPAND(c0F, q, q)
					// bits 2kk, 2kk+1 of qh to bits 4, 5
					VMOVDQA(qh, t)
					switch kk {
					case 0:
						VPSLLW(U8(4), t, t)
					case 1:
						VPSLLW(U8(2), t, t)
					case 3:
						VPSRLW(U8(2), t, t)
					}
					VPAND(c30, t, t)
					VPOR(t, q, q)
					sc := YMM()
					VPSHUFB(wordBcast.Offset(32*(4*h+kk)), sce, sc)
					for c := 0; c < C; c++ {
						p := YMM()
						VPMADDUBSW(Mem{Base: k.a[c], Disp: 4 + 128*h + 32*kk}, q, p)
						VPMADDWD(sc, p, p)
						if h == 0 && kk == 0 {
							sumi[c] = p
						} else {
							VPADDD(p, sumi[c], sumi[c])
						}
					}
				}
			}
			scw := YMM()
			VPMOVSXBW(Mem{Base: x, Disp: 192}, scw)
			for c := 0; c < C; c++ {
				corr := YMM()
				VPMADDWD(Mem{Base: k.a[c], Disp: 260}, scw, corr)
				VPSLLD(U8(5), corr, corr)
				VPSUBD(corr, sumi[c], sumi[c])
				VCVTDQ2PS(sumi[c], sumi[c])
				d, da := halfScale(Mem{Base: x, Disp: 208}), das
				if da == nil {
					da = YMM()
					VBROADCASTSS(Mem{Base: k.a[c]}, da)
				}
				VMULPS(da, d, d)
				VFMADD231PS(sumi[c], d, acc[r][c])
			}
		}
	})
	k.storeRows(acc)
}

// ---- activation quantizers

// roundAway converts v (float32 lanes) to int32 rounding half away from
// zero, as C's roundf: trunc(v + copysign(0.5 - 2^-25, v)).
func roundAway(v VecVirtual) {
	s := YMM()
	VANDPS(signMask, v, s)
	VORPS(halfDown, s, s)
	VADDPS(s, v, v)
	VCVTTPS2DQ(v, v)
}

// pack32 packs the low bytes of four vectors of 8 int32 (elements 0..31 in
// order) to 32 bytes in q0: the truncation Go's int8(v) does.
func pack32(q [4]VecVirtual) VecVirtual {
	for _, v := range q {
		VPAND(lowByte, v, v)
	}
	VPACKUSDW(q[1], q[0], q[0])
	VPACKUSDW(q[3], q[2], q[2])
	VPACKUSWB(q[2], q[0], q[0])
	p := YMM()
	VMOVDQU(packPerm, p)
	VPERMD(q[0], p, q[0])
	return q[0]
}

// hmax returns the largest of the 8 lanes of v in every lane of an xmm.
func hmax(v VecVirtual) VecVirtual {
	t := XMM()
	VEXTRACTF128(U8(1), v, t)
	VMAXPS(v.AsX(), t, t)
	u := XMM()
	VPERMILPS(U8(0x4e), t, u)
	VMAXPS(u, t, t)
	VPERMILPS(U8(0xb1), t, u)
	VMAXPS(u, t, t)
	return t
}

// fconst returns the float32 with the given bits in lane 0 of an xmm.
func fconst(bits uint32) VecVirtual {
	g, x := GP32(), XMM()
	MOVL(U32(bits), g)
	VMOVD(g, x)
	return x
}

func quantQ8_0() {
	TEXT("quantQ8_0AVX2", NOSPLIT, "func(x *float32, dst *byte, nb int)")
	Pragma("noescape")
	Doc("quantQ8_0AVX2 quantizes nb blocks of 32 floats to Q8_0 exactly as quant.QuantizeRow.")
	x := ld("x")
	dst := ld("dst")
	nb := ld("nb")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	var v [4]VecVirtual
	am := YMM()
	for i := range v {
		v[i] = YMM()
		VMOVUPS(Mem{Base: x, Disp: 32 * i}, v[i])
		if i == 0 {
			VANDPS(absMask, v[i], am)
		} else {
			t := YMM()
			VANDPS(absMask, v[i], t)
			VMAXPS(t, am, am)
		}
	}
	amax := hmax(am)
	// d = amax/127; id = d != 0 ? 1/d : 0
	d := fconst(0x42fe0000)
	VDIVSS(d, amax, d)
	id := fconst(0x3f800000)
	VDIVSS(d, id, id)
	z, m := XMM(), XMM()
	VXORPS(z, z, z)
	VCMPSS(U8(4), z, d, m) // d != 0
	VANDPS(m, id, id)
	h := XMM()
	VCVTPS2PH(U8(0), d, h)
	VPEXTRW(U8(0), h, Mem{Base: dst})
	idv := YMM()
	VBROADCASTSS(id, idv)
	for i := range v {
		VMULPS(idv, v[i], v[i])
		roundAway(v[i])
	}
	VMOVDQU(pack32(v), Mem{Base: dst, Disp: 2})
	ADDQ(U32(128), x)
	ADDQ(U32(34), dst)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

func prepU8() {
	TEXT("prepU8AVX2", NOSPLIT, "func(src *byte, dst *byte, nb int)")
	Pragma("noescape")
	Doc("prepU8AVX2 lays out nb Q8_0 blocks (34 bytes) as the u8 kernels read them (36 bytes):",
		"the scale widened to float32, then the quants plus 128 as unsigned bytes.")
	src := ld("src")
	dst := ld("dst")
	nb := ld("nb")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	bias := YMM()
	g := GP32()
	MOVL(U32(0x80808080), g)
	bx := XMM()
	VMOVD(g, bx)
	VPBROADCASTD(bx, bias)
	h, f := GP32(), XMM()
	Label("loop")
	MOVWLZX(Mem{Base: src}, h)
	VMOVD(h, f)
	VCVTPH2PS(f, f)
	VMOVSS(f, Mem{Base: dst})
	q := YMM()
	VPXOR(Mem{Base: src, Disp: 2}, bias, q)
	VMOVDQU(q, Mem{Base: dst, Disp: 4})
	ADDQ(U32(34), src)
	ADDQ(U32(36), dst)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

func quantQ8_K() {
	TEXT("quantQ8_KAVX2", NOSPLIT, "func(x *float32, dst *byte, nb int)")
	Pragma("noescape")
	Doc("quantQ8_KAVX2 quantizes nb blocks of 256 floats to Q8_K exactly as quant.QuantizeRow.")
	x := ld("x")
	dst := ld("dst")
	nb := ld("nb")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	// amax over the 32 vectors, four running maxima
	var am [4]VecVirtual
	absm := YMM()
	VMOVUPS(absMask, absm)
	for i := 0; i < 32; i++ {
		t := YMM()
		VANDPS(Mem{Base: x, Disp: 32 * i}, absm, t)
		if i < 4 {
			am[i] = t
		} else {
			VMAXPS(t, am[i%4], am[i%4])
		}
	}
	VMAXPS(am[1], am[0], am[0])
	VMAXPS(am[3], am[2], am[2])
	VMAXPS(am[2], am[0], am[0])
	amax := hmax(am[0])
	z := XMM()
	VXORPS(z, z, z)
	VUCOMISS(z, amax)
	JNE(LabelRef("nonzero"))
	zy := YMM()
	VXORPS(zy, zy, zy)
	for off := 0; off < 288; off += 32 {
		VMOVDQU(zy, Mem{Base: dst, Disp: off})
	}
	MOVL(U32(0), Mem{Base: dst, Disp: 288})
	JMP(LabelRef("next"))

	Label("nonzero")
	// the first element whose magnitude is amax gives the signed max
	av := YMM()
	VBROADCASTSS(amax, av)
	i, msk := GP64(), GP32()
	XORQ(i, i)
	Label("find")
	t := YMM()
	VANDPS(Mem{Base: x, Index: i, Scale: 1}, absm, t)
	VCMPPS(U8(0), av, t, t) // EQ_OQ
	VMOVMSKPS(t, msk)
	TESTL(msk, msk)
	JNZ(LabelRef("found"))
	ADDQ(U8(32), i)
	JMP(LabelRef("find"))
	Label("found")
	idx := GP32()
	BSFL(msk, idx)
	off := idx.As64()
	SHLQ(U8(2), off)
	ADDQ(i, off)
	mx := XMM()
	VMOVSS(Mem{Base: x, Index: off, Scale: 1}, mx)
	// iscale = -127/max; d = 1/iscale
	is := fconst(0xc2fe0000)
	VDIVSS(mx, is, is)
	one := fconst(0x3f800000)
	VDIVSS(is, one, one)
	VMOVSS(one, Mem{Base: dst})
	isv, ones := YMM(), YMM()
	VBROADCASTSS(is, isv)
	VMOVDQU(onesU8, ones)
	var parts [8]VecVirtual
	for g := 0; g < 8; g++ {
		var q [4]VecVirtual
		for j := range q {
			q[j] = YMM()
			VMULPS(Mem{Base: x, Disp: 128*g + 32*j}, isv, q[j])
			// min(127, nearestInt(v)) with ggml's magic-number rounding
			VADDPS(magic, q[j], q[j])
			VPAND(mant23, q[j], q[j])
			VPSUBD(half22, q[j], q[j])
			VPMINSD(c127d, q[j], q[j])
		}
		b := pack32(q)
		VMOVDQU(b, Mem{Base: dst, Disp: 4 + 32*g})
		w := YMM()
		VPMADDUBSW(b, ones, w)
		VPMADDWD(ones16, w, w)
		parts[g] = w
	}
	// parts[g]: low lane 4 partial sums of bsum 2g, high lane of bsum 2g+1
	var hh [2]VecVirtual
	for i := range hh {
		p := parts[4*i:]
		VPHADDD(p[1], p[0], p[0])
		VPHADDD(p[3], p[2], p[2])
		VPHADDD(p[2], p[0], p[0])
		hh[i] = p[0]
	}
	VPACKSSDW(hh[1], hh[0], hh[0])
	hi := XMM()
	VEXTRACTI128(U8(1), hh[0], hi)
	r0, r1 := XMM(), XMM()
	VPUNPCKLWD(hi, hh[0].AsX(), r0)
	VPUNPCKHWD(hi, hh[0].AsX(), r1)
	VMOVDQU(r0, Mem{Base: dst, Disp: 260})
	VMOVDQU(r1, Mem{Base: dst, Disp: 276})

	Label("next")
	ADDQ(U32(1024), x)
	ADDQ(U32(292), dst)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// ---- decode kernels for the 32-element formats with precomputed
// activation data
//
//	func(w *byte, ws int, a *byte, aux *byte, nb int, out *float32)
//
// computes 4 rows (w + r*ws) against one Q8_0 activation row a. aux holds,
// per pair of blocks (b, b+1), 64 bytes: float32 [da_b da_b da_b1 da_b1] twice
// and int32 [c_b c_b c_b1 c_b1] twice, where da is the activation block's
// scale and c = k*sum(q8) the offset correction (k = 8 for Q4_0, 16 for
// Q5_0, unused for Q8_0); an odd last block is paired with a phantom block
// of scale 0. Each iteration takes two blocks of four rows: the int32
// partial sums are reduced with unpacks to one vector holding the 8
// (row, block) sums in the order [r0b r2b r0b1 r2b1 | r1b r3b r1b1 r3b1],
// scaled by the weight scales gathered with integer loads into the same
// order, so one conversion and one FMA serve 8 row-blocks.

type legacy int

const (
	quant40 legacy = iota
	quant80
	quant50
)

func (q legacy) size() int { return [...]int{18, 34, 22}[q] }

func q40x(name string, q legacy, R int) {
	TEXT(name, NOSPLIT, sigX)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s: %d weight rows x 1 Q8_0 activation row, two blocks per iteration.", name, R))
	// rm addresses row r at displacement d. Four rows have a pointer each;
	// eight are two groups of four, each a pointer plus (0, ws, 2ws, 3ws),
	// which leaves general registers for the rest. Eight rows at once help
	// Q8_0 on Intel cores, where one core's bandwidth grows with the number
	// of streams it reads (Qwen-shaped Q8_0 tg, Xeon with AVX-512 BF16: 1
	// thread 67% -> 71% of the roofline, 2 threads 50-56% -> 55-59%); Q4_0
	// lost with them (70% -> 66%), so it keeps 4.
	var w []GPVirtual
	var ws, ws3 GPVirtual
	if R == 4 {
		w, ws = rowPtrs(4)
	} else {
		w, ws, ws3 = []GPVirtual{ld("w"), GP64()}, ld("ws"), GP64()
		LEAQ(Mem{Base: ws, Index: ws, Scale: 2}, ws3)
		LEAQ(Mem{Base: w[0], Index: ws, Scale: 4}, w[1])
	}
	rm := func(r, d int) Mem {
		if R == 4 {
			return Mem{Base: w[r], Disp: d}
		}
		m := Mem{Base: w[r/4], Disp: d}
		switch r % 4 {
		case 1, 2:
			m.Index, m.Scale = ws, uint8(r%4)
		case 3:
			m.Index, m.Scale = ws3, 1
		}
		return m
	}
	a, aux, nb := ld("a"), ld("aux"), ld("nb")
	bs := q.size()
	var mask, ones Op = c0F, ones16
	if q != quant50 {
		m, o := YMM(), YMM()
		VMOVDQU(c0F, m)
		VMOVDQU(ones16, o)
		mask, ones = m, o
	}
	accs := make([]VecVirtual, R/4)
	for i := range accs {
		accs[i] = YMM()
		VXORPS(accs[i], accs[i], accs[i])
	}

	// rowSums returns, for rows (2p, 2p+1) of the block at displacement
	// disp, [row 2p: 4 int32 | row 2p+1: 4 int32].
	type act struct{ lo, hi, y VecVirtual }
	loadAct := func(disp int) act {
		var y act
		if q == quant80 {
			y.lo, y.hi = YMM(), YMM()
			VPMOVSXBW(Mem{Base: a, Disp: disp + 2}, y.lo)
			VPMOVSXBW(Mem{Base: a, Disp: disp + 18}, y.hi)
			return y
		}
		y.lo, y.hi = YMM(), YMM()
		VBROADCASTI128(Mem{Base: a, Disp: disp + 2}, y.lo)
		VBROADCASTI128(Mem{Base: a, Disp: disp + 18}, y.hi)
		return y
	}
	// pairSums: Q4_0/Q5_0 rows paired in lanes.
	pairSums := func(p int, wd int, y act) VecVirtual {
		x0, x1 := 2*p, 2*p+1
		qo := 2
		if q == quant50 {
			qo = 6
		}
		t, h := YMM(), YMM()
		VBROADCASTI128(rm(x0, wd+qo), t)
		VPBLENDD(U8(0xf0), rm(x1, wd+qo-16), t, t)
		VPSRLW(U8(4), t, h)
		VPAND(mask, t, t)
		VPAND(mask, h, h)
		if q == quant50 {
			// fifth bits: qh of row 2p to the low lane, of row 2p+1 to the high
			b := YMM()
			for i, v := range []VecVirtual{t, h} {
				VBROADCASTI128(rm(x0, wd+2), b)
				VPBLENDD(U8(0xf0), rm(x1, wd+2-16), b, b)
				VPSHUFB(q50Shuf[i], b, b)
				VPAND(bitsSel, b, b)
				VPCMPEQB(bitsSel, b, b)
				VPAND(c10, b, b)
				VPOR(b, v, v)
			}
		}
		VPMADDUBSW(y.lo, t, t)
		VPMADDUBSW(y.hi, h, h)
		VPADDW(h, t, t)
		VPMADDWD(ones, t, t)
		return t
	}
	// rowSums8: Q8_0, one row: 8 int32.
	rowSums8 := func(x int, wd int, y act) VecVirtual {
		t, h := YMM(), YMM()
		VPMOVSXBW(rm(x, wd+2), t)
		VPMOVSXBW(rm(x, wd+18), h)
		VPMADDWD(y.lo, t, t)
		VPMADDWD(y.hi, h, h)
		VPADDD(h, t, t)
		return t
	}
	// unpack-add: [a.0 b.0 a.1 b.1]+[a.2 b.2 a.3 b.3] per lane
	zipD := func(x, y VecVirtual) VecVirtual {
		t := YMM()
		VPUNPCKHDQ(y, x, t)
		VPUNPCKLDQ(y, x, x)
		VPADDD(t, x, x)
		return x
	}
	zipQ := func(x, y VecVirtual) VecVirtual {
		t := YMM()
		VPUNPCKHQDQ(y, x, t)
		VPUNPCKLQDQ(y, x, x)
		VPADDD(t, x, x)
		return x
	}
	// blockSums returns the int32 partial sums of the 4 rows for the block at
	// weight displacement wd and activation displacement ad: for the paired
	// formats [r0 r2 r0 r2 | r1 r3 r1 r3], for Q8_0 [r0 r1 r2 r3 | r0 r1 r2 r3].
	blockSums := func(g, wd, ad int) VecVirtual {
		y := loadAct(ad)
		if q == quant80 {
			v := make([]VecVirtual, 4)
			for r := range v {
				v[r] = rowSums8(4*g+r, wd, y)
			}
			return zipQ(zipD(v[0], v[1]), zipD(v[2], v[3]))
		}
		p01 := pairSums(2*g, wd, y)
		p23 := pairSums(2*g+1, wd, y)
		return zipD(p01, p23)
	}
	// scales gathers the 8 weight scales of blocks b (displacement 0) and b1
	// (wd1) in the order of the sums and multiplies them by the activation's.
	scales := func(g, wd1 int) VecVirtual {
		order := [][4]int{{0, 2, 0, 2}, {1, 3, 1, 3}} // rows of halves 0..3 of each qword
		if q == quant80 {
			order = [][4]int{{0, 1, 2, 3}, {0, 1, 2, 3}}
		}
		x := XMM()
		for i, rs := range order {
			acc := GP64()
			for j, r := range rs {
				d := wd1 * (j / 2)
				if q == quant80 {
					d = wd1 * i
				}
				t := GP64()
				if j == 0 {
					t = acc
				}
				MOVWQZX(rm(4*g+r, d), t)
				if j > 0 {
					SHLQ(U8(16*j), t)
					ORQ(t, acc)
				}
			}
			if i == 0 {
				VMOVQ(acc, x)
			} else {
				VPINSRQ(U8(1), acc, x, x)
			}
		}
		d := YMM()
		VCVTPH2PS(x, d)
		VMULPS(Mem{Base: aux}, d, d)
		return d
	}
	body := func(g, wd1, ad1 int) {
		acc := accs[g]
		zb := blockSums(g, 0, 0)
		zb1 := blockSums(g, wd1, ad1)
		var z VecVirtual
		if q == quant80 {
			z = YMM()
			u := YMM()
			VPERM2I128(U8(0x20), zb1, zb, z)
			VPERM2I128(U8(0x31), zb1, zb, u)
			VPADDD(u, z, z)
		} else {
			z = zipQ(zb, zb1)
			VPSUBD(Mem{Base: aux, Disp: 32}, z, z)
		}
		VCVTDQ2PS(z, z)
		VFMADD231PS(z, scales(g, wd1), acc)
	}
	cnt := GP64()
	MOVQ(nb, cnt)
	SHRQ(U8(1), cnt)
	var pf GPVirtual
	if R == 4 {
		pf = nextRows(w[3], ws)
	} else {
		pf = GP64()
		LEAQ(Mem{Base: w[1], Index: ws, Scale: 4}, pf)
	}
	TESTQ(cnt, cnt)
	JZ(LabelRef("tail"))
	Label("loop")
	prefetchStep(pf, 2*R*bs) // the next R rows, as far as this iteration reads
	for g := range accs {
		body(g, bs, 34)
	}
	for _, p := range w {
		ADDQ(U32(2*bs), p)
	}
	ADDQ(U32(68), a)
	ADDQ(U32(64), aux)
	DECQ(cnt)
	JNZ(LabelRef("loop"))
	Label("tail")
	TESTQ(U32(1), nb)
	JZ(LabelRef("done"))
	for g := range accs { // the phantom second block has scale 0
		body(g, 0, 0)
	}
	Label("done")
	out := ld("out")
	for g, acc := range accs {
		hi := XMM()
		VEXTRACTF128(U8(1), acc, hi)
		if q == quant80 {
			VADDPS(hi, acc.AsX(), hi)
		} else {
			// [r0 r2 r0 r2] and [r1 r3 r1 r3] to [r0 r1 r2 r3]
			t := XMM()
			VUNPCKHPS(hi, acc.AsX(), t)
			VUNPCKLPS(hi, acc.AsX(), hi)
			VADDPS(t, hi, hi)
		}
		VMOVUPS(hi, Mem{Base: out, Disp: 16 * g})
	}
	VZEROUPPER()
	RET()
}

func q8sums() {
	TEXT("q8SumsAVX2", NOSPLIT, "func(a *byte, nb int, dst *int32)")
	Pragma("noescape")
	Doc("q8SumsAVX2 stores the sum of the 32 quants of each of nb Q8_0 blocks at a.")
	a, nb, dst := ld("a"), ld("nb"), ld("dst")
	ones, ones16v := YMM(), YMM()
	VMOVDQU(onesU8, ones)
	VMOVDQU(ones16, ones16v)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	t := YMM()
	VMOVDQU(Mem{Base: a, Disp: 2}, t)
	VPMADDUBSW(t, ones, t)
	VPMADDWD(ones16v, t, t)
	h := XMM()
	VEXTRACTI128(U8(1), t, h)
	VPADDD(t.AsX(), h, h)
	VPSHUFD(U8(0x4e), h, t.AsX())
	VPADDD(t.AsX(), h, h)
	VPSHUFD(U8(0xb1), h, t.AsX())
	VPADDD(t.AsX(), h, h)
	VMOVD(h, Mem{Base: dst})
	ADDQ(U32(34), a)
	ADDQ(U32(4), dst)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	VZEROUPPER()
	RET()
}

// ---- shared pieces

// rowPtrs loads w and ws and returns pointers to rows 0..R-1 (w + r*ws)
// with ws.
func rowPtrs(R int) ([]GPVirtual, GPVirtual) {
	w := []GPVirtual{ld("w")}
	ws := ld("ws")
	for r := 1; r < R; r++ {
		p := GP64()
		LEAQ(Mem{Base: w[r-1], Index: ws, Scale: 1}, p)
		w = append(w, p)
	}
	return w, ws
}

// nextRows returns a pointer to the group of rows after the one starting at
// w[0] (w[last] + ws: the groups are contiguous). The decode and tile
// kernels prefetch it as fast as they read their own rows (prefetchStep),
// so the caller's next call finds its rows in cache: a row of a few cache
// lines ends before the hardware prefetcher ramps up.
func nextRows(last, ws GPVirtual) GPVirtual {
	pf := GP64()
	LEAQ(Mem{Base: last, Index: ws, Scale: 1}, pf)
	return pf
}

// prefetchStep prefetches the next n bytes at pf and advances it. The lines
// go to L2 (PREFETCHT1), not L1: on Intel cores a PREFETCHT0 that misses
// holds one of the core's few L1 fill buffers until the line arrives from
// DRAM, which caps one core's stream near 10 GB/s (Q8_0 decode on one
// thread, Xeon with AVX-512 BF16: 9.3 -> 12.7 GB/s with T1). T0 was the
// hint measured on the AMD EPYC hosts of earlier sessions.
//
// The decode kernels are also generated with PREFETCHT0 (name suffix T0,
// while prefetchT0 is set): on the AMD EPYC hosts one thread decodes faster
// with it (TinyLlama Q4_K_M 33 -> 38 tok/s, Qwen-shaped Q8_0 48.6 -> 53).
func prefetchStep(pf GPVirtual, n int) {
	for i := 0; i < n; i += 64 {
		if prefetchT0 {
			PREFETCHT0(Mem{Base: pf, Disp: i})
		} else {
			PREFETCHT1(Mem{Base: pf, Disp: i})
		}
	}
	ADDQ(U32(n), pf)
}

// q4kScales unpacks the 12 packed 6-bit scales and mins of the Q4_K (or
// Q5_K) block at x into bytes: scales 0..7 then mins 0..7 (ggml's "utmp"
// shuffle, in general registers).
func q4kScales(x GPVirtual) VecVirtual {
	u0, u1, u2, u3, t := GP32(), GP32(), GP32(), GP32(), GP32()
	MOVL(Mem{Base: x, Disp: 4}, u0)
	MOVL(Mem{Base: x, Disp: 8}, u1)
	MOVL(Mem{Base: x, Disp: 12}, u2)
	// u3 = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)
	MOVL(u2, u3)
	SHRL(U8(4), u3)
	ANDL(U32(0x0f0f0f0f), u3)
	MOVL(u1, t)
	SHRL(U8(6), t)
	ANDL(U32(0x03030303), t)
	SHLL(U8(4), t)
	ORL(t, u3)
	// mins 0..3 = u1 & 0x3f3f3f3f
	ANDL(U32(0x3f3f3f3f), u1)
	// scales 4..7 = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)
	ANDL(U32(0x0f0f0f0f), u2)
	MOVL(u0, t)
	SHRL(U8(6), t)
	ANDL(U32(0x03030303), t)
	SHLL(U8(4), t)
	ORL(t, u2)
	ANDL(U32(0x3f3f3f3f), u0)
	xs := XMM()
	VMOVD(u0, xs)
	VPINSRD(U8(1), u2, xs, xs)
	VPINSRD(U8(2), u1, xs, xs)
	VPINSRD(U8(3), u3, xs, xs)
	return xs
}

// q4kScalesVec is q4kScales in vector registers, for the AVX2 kernels
// (VEX forms only). It takes 10 instructions where q4kScales takes about
// 30 micro-ops; the AVX2 Q4_K decode kernel reads a cached matrix at 16.5
// GB/s on one Zen 3 core, slower than that core reads memory, so its
// instructions count.
//
//	A = bytes [q0-3 q8-11 q4-7 q8-11] of the 12 scale bytes q
//	B = bytes [0 q0-3 0 q4-7]
//	scales 0-3, mins 0-3 = q & 63; scales 4-7 = (q8-11 & 15) | (q0-3 >> 6) << 4;
//	mins 4-7 = (q8-11 >> 4) | (q4-7 >> 6) << 4
func q4kScalesVec(x GPVirtual) VecVirtual {
	v, a, b, t := XMM(), XMM(), XMM(), XMM()
	VMOVDQU(Mem{Base: x}, v)
	VPSHUFB(q4kShufA, v, a)
	VPSHUFB(q4kShufB, v, b)
	VPSRLW(U8(4), a, t)
	VPAND(q4kMaskA2, t, t)
	VPAND(q4kMaskA1, a, a)
	VPOR(t, a, a)
	VPSRLW(U8(2), b, b)
	VPAND(c30, b, b)
	VPOR(b, a, a)
	return a
}

// storeSum512 stores the sum of the 16 floats of acc (plus the 8 of extra,
// if given) at m, with EVEX forms only (AVX-512 kernels may hold it in
// registers 16-31).
func storeSum512(acc VecVirtual, extra VecVirtual, m Mem) {
	y := YMM()
	VEXTRACTF64X4(U8(1), acc, y)
	VADDPS(acc.AsY(), y, y)
	if extra != nil {
		VADDPS(extra, y, y)
	}
	x := XMM()
	VEXTRACTF32X4(U8(1), y, x)
	VADDPS(y.AsX(), x, x)
	t := XMM()
	VPERMILPS(U8(0xb1), x, t)
	VADDPS(t, x, x)
	VPERMILPS(U8(0x4e), x, t)
	VADDPS(t, x, x)
	VMOVSS(x, m)
}
