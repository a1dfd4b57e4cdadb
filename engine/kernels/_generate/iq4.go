package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- IQ4_NL · Q8_0 and IQ4_XS · Q8_K (AVX2 decode kernels)
//
// The 16 nibbles of a group of 32 weights are split into one ymm, low
// nibbles (weights 0..15) in the low lane and high nibbles (16..31) in the
// high lane, and VPSHUFB looks them up in the table of the 16 signed levels
// (in both lanes): 32 int8 weights in element order. The signed-by-signed
// byte products go through VPMADDUBSW with |y| (once per activation block,
// for all rows; -128 gives 128 as an unsigned byte) and the weights given
// y's sign (VPSIGNB; a level is at least -127, so its negation fits): a
// pair of products is at most 2·128·127, which fits int16. IQ4_XS unpacks
// the 8 sub-block scales of each row's block with vector shifts into a
// stack slot, multiplies each sub-block's pair sums by its scale - 32
// (VPMADDWD with the scale broadcast to every word) and adds the 8
// sub-blocks of a super-block in int32 (at most 8·32·2·128·127 in
// magnitude, exact) before the one float scale d_x·d_y.

var iq4Table, iq4ShiftH, iq4ShiftL, iq4Three, iq4Fifteen, iq4ThirtyTwo Mem

func constsIQ4() {
	iq4Table = GLOBL("iq4Table", RODATA|NOPTR)
	levels := []int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	for i := 0; i < 32; i++ {
		DATA(i, U8(uint8(levels[i%16])))
	}
	// (DATA fills the last GLOBL.)
	iq4ShiftH = GLOBL("iq4ShiftH", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(uint32(2*i)))
	}
	iq4ShiftL = GLOBL("iq4ShiftL", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(uint32(4*i)))
	}
	iq4Three = splat32("iq4Three", 3)
	iq4Fifteen = splat32("iq4Fifteen", 15)
	iq4ThirtyTwo = splat32("iq4ThirtyTwo", 32)
}

// iq4Levels returns the 32 levels of the 16 nibble bytes at m (tbl: the
// table register).
func iq4Levels(m Mem, tbl VecVirtual) VecVirtual {
	t, h := YMM(), YMM()
	VBROADCASTI128(m, t)
	VPSRLW(U8(4), t, h)
	VPBLENDD(U8(0xf0), h, t, t)
	VPAND(c0F, t, t)
	VPSHUFB(t, tbl, t)
	return t
}

// iq4Abs returns |y| of the int8 activations y (shared by the rows).
func iq4Abs(y VecVirtual) VecVirtual {
	a := YMM()
	VPSIGNB(y, y, a)
	return a
}

// iq4Pairs returns the 16 int16 sums of adjacent products of the int8
// weights w and activations y (ay: |y|): |y| times w with y's sign.
func iq4Pairs(w, y, ay VecVirtual) VecVirtual {
	VPSIGNB(y, w, w)
	VPMADDUBSW(w, ay, w)
	return w
}

func iq4nl(name string, R int) {
	lut4(name, "IQ4_NL weights, Q8_0 activations", R, iq4Table, 18, 2, func() func(Mem) VecVirtual { return halfScale })
}

// lut4 is the decode kernel of R rows of a format of 32 4-bit indexes into
// a table of levels (table: 32 bytes, the 16 levels twice) against Q8_0
// activations: blocks of bx bytes, the nibbles from byte off; scales,
// called once the table is loaded, gives the function that broadcasts a
// block's scale from the block's address.
func lut4(name, what string, R int, table Mem, bx, off int, scales func() func(Mem) VecVirtual) {
	k := begin(name, R, 1, what)
	tbl := YMM()
	VMOVDQU(table, tbl)
	scale := scales()
	acc := grid(R, 1)
	k.loop(bx, 34, func() {
		y := YMM()
		VMOVDQU(Mem{Base: k.a[0], Disp: 2}, y)
		ay := iq4Abs(y)
		da := halfScale(Mem{Base: k.a[0]})
		for r := 0; r < R; r++ {
			p := iq4Pairs(iq4Levels(Mem{Base: k.w[r], Disp: off}, tbl), y, ay)
			VPMADDWD(ones16, p, p)
			VCVTDQ2PS(p, p)
			d := scale(Mem{Base: k.w[r]})
			VMULPS(da, d, d)
			VFMADD231PS(p, d, acc[r][0])
		}
	})
	k.storeRows(acc)
}

// iq4nlPairs is the IQ4_NL decode kernel for R (even) rows taken in pairs,
// as the Q4_0 kernels take them: one ymm holds the low nibbles' levels of a
// block of row 2p in its low lane and of row 2p+1 in its high lane,
// another the high nibbles'; the activation halves are broadcast to both
// lanes. The pair shares one conversion, scale product and FMA a block.
func iq4nlPairs(name string, R int) {
	k := begin(name, R, 1, "IQ4_NL weights, Q8_0 activations")
	P := R / 2
	tbl := YMM()
	VMOVDQU(iq4Table, tbl)
	acc := grid(P, 1)
	k.loop(18, 34, func() {
		lo, hi := YMM(), YMM()
		VBROADCASTI128(Mem{Base: k.a[0], Disp: 2}, lo)
		VBROADCASTI128(Mem{Base: k.a[0], Disp: 18}, hi)
		alo, ahi := iq4Abs(lo), iq4Abs(hi)
		da := halfScale(Mem{Base: k.a[0]})
		for p := 0; p < P; p++ {
			wa, wb := k.w[2*p], k.w[2*p+1]
			l, h := YMM(), YMM()
			VBROADCASTI128(Mem{Base: wa, Disp: 2}, l)
			VINSERTI128(U8(1), Mem{Base: wb, Disp: 2}, l, l)
			VPSRLW(U8(4), l, h)
			VPAND(c0F, l, l)
			VPAND(c0F, h, h)
			VPSHUFB(l, tbl, l)
			VPSHUFB(h, tbl, h)
			pl := iq4Pairs(l, lo, alo)
			ph := iq4Pairs(h, hi, ahi)
			VPMADDWD(ones16, pl, pl)
			VPMADDWD(ones16, ph, ph)
			VPADDD(ph, pl, pl)
			VCVTDQ2PS(pl, pl)
			x0, x1 := XMM(), XMM()
			VPBROADCASTW(Mem{Base: wa}, x0)
			VPBROADCASTW(Mem{Base: wb}, x1)
			VPUNPCKLQDQ(x1, x0, x0)
			dw := YMM()
			VCVTPH2PS(x0, dw)
			VMULPS(da, dw, dw)
			VFMADD231PS(pl, dw, acc[p][0])
		}
	})
	parts := make([]Op, 0, R)
	for p := 0; p < P; p++ {
		h := XMM()
		VEXTRACTF128(U8(1), acc[p][0], h)
		parts = append(parts, acc[p][0].AsX(), h)
	}
	k.store([][]Op{parts})
}

// iq4xsScales stores scale - 32 of the 8 sub-blocks of the IQ4_XS block at
// w as int32 at slot (32 bytes): the 2 high bits of sub-block i are bits
// 2i of scales_h, the 4 low bits are bits 4i of scales_l (the bytes after
// it), each taken in dword i by a variable shift.
func iq4xsScales(w GPVirtual, slot Mem) {
	h, l := YMM(), YMM()
	VPBROADCASTD(Mem{Base: w, Disp: 2}, h)
	VPSRLVD(iq4ShiftH, h, h)
	VPAND(iq4Three, h, h)
	VPSLLD(U8(4), h, h)
	VPBROADCASTD(Mem{Base: w, Disp: 4}, l)
	VPSRLVD(iq4ShiftL, l, l)
	VPAND(iq4Fifteen, l, l)
	VPOR(h, l, l)
	VPSUBD(iq4ThirtyTwo, l, l)
	VMOVDQU(l, slot)
}

func iq4xs(name string, R int) {
	k := begin(name, R, 1, "IQ4_XS weights, Q8_K activations")
	tbl := YMM()
	VMOVDQU(iq4Table, tbl)
	acc := grid(R, 1)
	slot := AllocLocal(32 * R)
	k.loop(136, 292, func() {
		for r := 0; r < R; r++ {
			iq4xsScales(k.w[r], slot.Offset(32*r))
		}
		isum := make([]VecVirtual, R)
		for ib := 0; ib < 8; ib++ {
			y := YMM()
			VMOVDQU(Mem{Base: k.a[0], Disp: 4 + 32*ib}, y)
			ay := iq4Abs(y)
			for r := 0; r < R; r++ {
				p := iq4Pairs(iq4Levels(Mem{Base: k.w[r], Disp: 8 + 16*ib}, tbl), y, ay)
				sc := YMM()
				VPBROADCASTW(slot.Offset(32*r+4*ib), sc)
				VPMADDWD(sc, p, p)
				if ib == 0 {
					isum[r] = p
				} else {
					VPADDD(p, isum[r], isum[r])
				}
			}
		}
		dy := YMM()
		VBROADCASTSS(Mem{Base: k.a[0]}, dy)
		for r := 0; r < R; r++ {
			VCVTDQ2PS(isum[r], isum[r])
			d := halfScale(Mem{Base: k.w[r]})
			VMULPS(dy, d, d)
			VFMADD231PS(isum[r], d, acc[r][0])
		}
	})
	k.storeRows(acc)
}

// iq4Kernels generates the IQ4 kernels (T0: the decode kernels prefetching
// to L1, see prefetchStep).
func iq4Kernels(t0 bool) {
	sfx := ""
	if t0 {
		sfx = "T0"
	} else {
		iq4nl("dotIQ4_NLR1C1", 1)
		iq4xs("dotIQ4_XSR1C1", 1)
	}
	iq4nlPairs(fmt.Sprintf("dotIQ4_NLR4C1%s", sfx), 4)
	iq4xs(fmt.Sprintf("dotIQ4_XSR4C1%s", sfx), 4)
}
