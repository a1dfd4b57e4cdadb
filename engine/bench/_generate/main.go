// Command _generate writes the bandwidth probe's AVX2 triad with avo:
//
//	cd engine/bench/_generate && go run . -out ../triad_amd64.s -pkg bench
//
// (go generate ./engine/bench runs it.) The Go declaration and the CPU check
// are in triad_amd64.go.
package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

func main() {
	ConstraintExpr("!noasm")
	triad()
	Generate()
}

// triad sets a[i] = b[i] + s*c[i] for n elements, n a multiple of 16: four
// ymm of 4 float64 a step, the loads of c and the FMAs reading b from memory
// as a compiled STREAM does.
func triad() {
	TEXT("triadAVX2", NOSPLIT, "func(a, b, c *float64, n int, s float64)")
	a, b, c, n := GP64(), GP64(), GP64(), GP64()
	Load(Param("a"), a)
	Load(Param("b"), b)
	Load(Param("c"), c)
	Load(Param("n"), n)
	sp, err := Param("s").Resolve()
	if err != nil {
		panic(err)
	}
	s := YMM()
	VBROADCASTSD(sp.Addr, s)
	SHRQ(U8(4), n)
	JZ(LabelRef("done"))

	Label("loop")
	x := []VecVirtual{YMM(), YMM(), YMM(), YMM()}
	for i, v := range x {
		VMOVUPD(Mem{Base: c, Disp: 32 * i}, v)
	}
	for i, v := range x {
		VFMADD213PD(Mem{Base: b, Disp: 32 * i}, s, v)
	}
	for i, v := range x {
		VMOVUPD(v, Mem{Base: a, Disp: 32 * i})
	}
	for _, p := range []GPVirtual{a, b, c} {
		ADDQ(U32(128), p)
	}
	DECQ(n)
	JNZ(LabelRef("loop"))

	Label("done")
	VZEROUPPER()
	RET()
}
