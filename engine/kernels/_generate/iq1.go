package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- IQ1_S and IQ1_M · Q8_K (AVX2 decode kernels)
//
// A group of 8 weights is a point of a codebook of values -1, 0, +1 plus a
// delta of ±1/8. The kernels look the points up in ·iq1Grid8, the codebook
// as 8v+1 for every value v (2048 x 8 bytes, filled by the Go side from
// shoal/engine/quant: the weights times 8/(d·(2s+1)) for delta +1/8), a
// 64-bit load each, four groups (32 weights) to a ymm, and take 2 off the
// bytes whose delta is -1/8: the bytes are -9, -7, -1, 1, 7, 9. They get y's signs (VPSIGNB)
// and go through VPMADDUBSW with |y| (-128 gives 128 as an unsigned byte):
// a pair of products is at most 2·128·9, which fits int16. VPMADDWD
// applies the odd multipliers 2s+1 (IQ1_S: one per 32 weights; IQ1_M: one
// per 16, the low lane's and the high lane's) and adds pairs; the 8
// sub-blocks add in int32 (exact) before the one float scale d_x·d_y/8.
// The kernels go sub-block by sub-block, the R rows in each, so that the
// activations of a sub-block are loaded once. IQ1_S's delta is one sign
// bit per 32 weights (bit 15 of qh, spread by an arithmetic shift of the
// broadcast word); IQ1_M's are bits 3 and 7 of the two qh bytes of the 32
// weights, spread to bytes in a vector register (as IQ2_S's signs). IQ1_M's
// d is gathered from the top nibbles of its 4 scale words.

var iq1mDeltaSpread, iq1mDeltaBit, iq1mScaleSel Mem

func constsIQ1() {
	// qh bytes 0 and 1 of a sub-block (broadcast as a word) to the bytes
	// of groups 0, 1 (byte 0) and 2, 3 (byte 1)
	iq1mDeltaSpread = GLOBL("iq1mDeltaSpread", RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		DATA(i, U8(uint8(i/16)))
	}
	// the delta bit of each group: bit 3 (even groups), bit 7 (odd)
	iq1mDeltaBit = GLOBL("iq1mDeltaBit", RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		DATA(i, U8(uint8(0x08<<(4*(i/8%2)))))
	}
	// a dword ls1 | ls2<<16 (broadcast) to ls1 in every word of the low
	// lane, ls2 in every word of the high lane
	iq1mScaleSel = GLOBL("iq1mScaleSel", RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		v := uint8(0x80)
		if i%2 == 0 {
			v = uint8(2 * (i / 16))
		}
		DATA(i, U8(v))
	}
}

// iq1Gather returns the 4 points (32 bytes) whose indices idx(l) computes
// into a general register.
func iq1Gather(points GPVirtual, idx func(l int) GPVirtual) VecVirtual {
	var g [2]VecVirtual
	for half := 0; half < 2; half++ {
		g[half] = YMM()
		for l := 0; l < 2; l++ {
			m := Mem{Base: points, Index: idx(2*half + l), Scale: 8}
			if l == 0 {
				VPBROADCASTQ(m, g[half])
			} else {
				VPINSRQ(U8(1), m, g[half].AsX(), g[half].AsX())
			}
		}
	}
	VINSERTI128(U8(1), g[1].AsX(), g[0], g[0])
	return g[0]
}

// iq1sPoints returns the 32 values (times 8, plus 8·delta) of sub-block ib
// of the IQ1_S block at w and the multiplier 2s+1 in every word of a ymm.
func iq1sPoints(w GPVirtual, ib int, points GPVirtual) (VecVirtual, VecVirtual) {
	qh := GP32()
	MOVWLZX(Mem{Base: w, Disp: 34 + 2*ib}, qh)
	g := iq1Gather(points, func(l int) GPVirtual {
		r, hi := GP64(), GP32()
		MOVBQZX(Mem{Base: w, Disp: 2 + 4*ib + l}, r)
		MOVL(qh, hi)
		if l < 3 {
			SHLL(U8(8-3*l), hi)
		} else {
			SHRL(U8(1), hi)
		}
		ANDL(U32(0x700), hi)
		ORQ(hi.As64(), r)
		return r
	})
	// delta: ·iq1Grid8 holds 8v+1; bit 15 set (qh's word shifted
	// arithmetically: -1) takes 2 off every byte
	dv := YMM()
	VPBROADCASTW(Mem{Base: w, Disp: 34 + 2*ib}, dv)
	VPSRAW(U8(15), dv, dv)
	VPADDB(dv, dv, dv)
	VPADDB(dv, g, g)
	SHRL(U8(12), qh)
	ANDL(U32(7), qh)
	return g, iq3Mult(qh)
}

// iq1mPoints returns the 32 values (times 8, plus 8·delta) of sub-block ib
// of the IQ1_M block at w and the multipliers, 2s+1 of the first 16
// weights in the low lane's words and of the second 16 in the high lane's.
func iq1mPoints(w GPVirtual, ib int, points GPVirtual) (VecVirtual, VecVirtual) {
	qh := GP32()
	MOVWLZX(Mem{Base: w, Disp: 32 + 2*ib}, qh)
	g := iq1Gather(points, func(l int) GPVirtual {
		r, hi := GP64(), GP32()
		MOVBQZX(Mem{Base: w, Disp: 4*ib + l}, r)
		MOVL(qh, hi)
		switch l {
		case 0:
			SHLL(U8(8), hi)
		case 1:
			SHLL(U8(4), hi)
		case 3:
			SHRL(U8(4), hi)
		}
		ANDL(U32(0x700), hi)
		ORQ(hi.As64(), r)
		return r
	})
	dv := YMM()
	VPBROADCASTW(Mem{Base: w, Disp: 32 + 2*ib}, dv)
	VPSHUFB(iq1mDeltaSpread, dv, dv)
	VPAND(iq1mDeltaBit, dv, dv)
	VPCMPEQB(iq1mDeltaBit, dv, dv)
	VPADDB(dv, dv, dv)
	VPADDB(dv, g, g)
	// the two 3-bit scales at bits 6(ib%2) of scales[ib/2]: 2s+1 each, as
	// ls1 | ls2<<16
	sc, s2 := GP32(), GP32()
	MOVWLZX(Mem{Base: w, Disp: 48 + 2*(ib/2)}, sc)
	if ib%2 == 1 {
		SHRL(U8(6), sc)
	}
	MOVL(sc, s2)
	ANDL(U32(7), sc)
	SHLL(U8(13), s2)
	ANDL(U32(7<<16), s2)
	ORL(s2, sc)
	// 2s+1 in both words
	LEAL(Mem{Base: sc, Index: sc, Scale: 1, Disp: 0x10001}, sc)
	m := YMM()
	VMOVD(sc, m.AsX())
	VPBROADCASTD(m.AsX(), m)
	VPSHUFB(iq1mScaleSel, m, m)
	return g, m
}

// iq1mScale returns 8 copies of d of the IQ1_M block at w as float32: the
// f16 whose nibbles are the top 4 bits of scales[0..3].
func iq1mScale(w GPVirtual) VecVirtual {
	h := GP32()
	MOVWLZX(Mem{Base: w, Disp: 54}, h)
	ANDL(U32(0xf000), h)
	for k := 0; k < 3; k++ {
		t := GP32()
		MOVWLZX(Mem{Base: w, Disp: 48 + 2*k}, t)
		SHRL(U8(12-4*k), t)
		ANDL(U32(0xf<<(4*k)), t)
		ORL(t, h)
	}
	x := XMM()
	VMOVD(h, x)
	VPBROADCASTW(x, x)
	y := YMM()
	VCVTPH2PS(x, y)
	return y
}

func iq1Dot(name string, m bool, R int) {
	tn, size := "IQ1_S", 50
	if m {
		tn, size = "IQ1_M", 56
	}
	k := begin(name, R, 1, fmt.Sprintf("%s weights, Q8_K activations", tn))
	points := GP64()
	LEAQ(NewDataAddr(Symbol{Name: "·iq1Grid8"}, 0), points)
	acc := grid(R, 1)
	k.loop(size, 292, func() {
		// sub-block by sub-block, each activation load for the R rows
		isum := make([]VecVirtual, R)
		for ib := 0; ib < 8; ib++ {
			y, ay := YMM(), YMM()
			VMOVDQU(Mem{Base: k.a[0], Disp: 4 + 32*ib}, y)
			VPSIGNB(y, y, ay)
			for r := 0; r < R; r++ {
				var p, mul VecVirtual
				if m {
					p, mul = iq1mPoints(k.w[r], ib, points)
				} else {
					p, mul = iq1sPoints(k.w[r], ib, points)
				}
				VPSIGNB(y, p, p)
				VPMADDUBSW(p, ay, p)
				VPMADDWD(mul, p, p)
				if ib == 0 {
					isum[r] = p
				} else {
					VPADDD(p, isum[r], isum[r])
				}
			}
		}
		dy := YMM()
		VBROADCASTSS(Mem{Base: k.a[0]}, dy)
		VMULPS(iq2Eighth, dy, dy)
		for r := 0; r < R; r++ {
			VCVTDQ2PS(isum[r], isum[r])
			var d VecVirtual
			if m {
				d = iq1mScale(k.w[r])
			} else {
				d = halfScale(Mem{Base: k.w[r]})
			}
			VMULPS(dy, d, d)
			VFMADD231PS(isum[r], d, acc[r][0])
		}
	})
	k.storeRows(acc)
}

// iq1Kernels generates the IQ1 kernels (T0: the decode kernels prefetching
// to L1, see prefetchStep).
func iq1Kernels(t0 bool) {
	for _, m := range []bool{false, true} {
		n := "IQ1_S"
		if m {
			n = "IQ1_M"
		}
		if !t0 {
			iq1Dot(fmt.Sprintf("dot%sR1C1", n), m, 1)
			iq1Dot(fmt.Sprintf("dot%sR4C1", n), m, 4)
		} else {
			iq1Dot(fmt.Sprintf("dot%sR4C1T0", n), m, 4)
		}
	}
}
