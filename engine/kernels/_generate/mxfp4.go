package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- MXFP4 · Q8_0 (AVX2 decode kernels)
//
// As IQ4_NL's (iq4.go): the 16 nibble bytes of a block split into the
// lanes, VPSHUFB looks them up in the table of the doubled E2M1 levels
// (0..12 and their negations), and the signed byte products go through
// VPMADDUBSW with |y|. The block's scale is a byte, E8M0: its halved power
// of two comes from a table of the 256 floats (ggml's, the two smallest
// subnormal).

var mxfp4Table, mxfp4Scales Mem

func constsMXFP4() {
	mxfp4Table = GLOBL("mxfp4Table", RODATA|NOPTR)
	levels := []int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	for i := 0; i < 32; i++ {
		DATA(i, U8(uint8(levels[i%16])))
	}
	mxfp4Scales = GLOBL("mxfp4Scales", RODATA|NOPTR)
	for e := 0; e < 256; e++ {
		bits := uint32(e-1) << 23
		if e < 2 {
			bits = uint32(0x00200000) << e
		}
		DATA(4*e, U32(bits))
	}
}

// e8m0Scale broadcasts the halved power of two of the E8M0 byte at m
// (tab: the address of mxfp4Scales).
func e8m0Scale(m Mem, tab GPVirtual) VecVirtual {
	e := GP64()
	MOVBQZX(m, e)
	y := YMM()
	VBROADCASTSS(Mem{Base: tab, Index: e, Scale: 4}, y)
	return y
}

func mxfp4(name string, R int) {
	lut4(name, "MXFP4 weights, Q8_0 activations", R, mxfp4Table, 17, 1, func() func(Mem) VecVirtual {
		tab := GP64()
		LEAQ(mxfp4Scales, tab)
		return func(m Mem) VecVirtual { return e8m0Scale(m, tab) }
	})
}

// mxfp4Kernels generates the MXFP4 kernels (T0: the decode kernel
// prefetching to L1, see prefetchStep).
func mxfp4Kernels(t0 bool) {
	sfx := ""
	if t0 {
		sfx = "T0"
	} else {
		mxfp4("dotMXFP4R1C1", 1)
	}
	mxfp4(fmt.Sprintf("dotMXFP4R4C1%s", sfx), 4)
}
