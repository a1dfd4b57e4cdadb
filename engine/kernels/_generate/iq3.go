package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- IQ3_XXS and IQ3_S · Q8_K (AVX2 decode kernels, with iq2Dot)
//
// As the IQ2 kernels, but a group of 8 weights is two points of 4
// magnitudes (up to 62: a pair of products is at most 2·128·62, which
// fits int16), a 32-bit load each from ·iq3xxsGrid or ·iq3sGrid, eight to
// a ymm; IQ3_XXS's signs are IQ2_XXS's (7-bit indices in the uint32 that
// also holds the scale), IQ3_S's are bytes as IQ2_S's. Every 32 weights
// have one multiplier 2s+1.

// iq3Gather returns the 8 points (32 magnitudes) whose indices idx(p)
// computes into a general register.
func iq3Gather(points GPVirtual, idx func(p int) GPVirtual) VecVirtual {
	var g [2]VecVirtual
	for half := 0; half < 2; half++ {
		g[half] = YMM()
		for q := 0; q < 4; q++ {
			m := Mem{Base: points, Index: idx(4*half + q), Scale: 4}
			if q == 0 {
				VPBROADCASTD(m, g[half])
			} else {
				VPINSRD(U8(q), m, g[half].AsX(), g[half].AsX())
			}
		}
	}
	VINSERTI128(U8(1), g[1].AsX(), g[0], g[0])
	return g[0]
}

// iq3Mult returns 2s+1 (s in the general register s, 0..15) in every word
// of a ymm.
func iq3Mult(s GPVirtual) VecVirtual {
	LEAL(Mem{Base: s, Index: s, Scale: 1, Disp: 1}, s)
	m := YMM()
	VMOVD(s, m.AsX())
	VPBROADCASTW(m.AsX(), m)
	return m
}

// iq3xxsPoints returns the 32 signed magnitudes of sub-block ib of the
// IQ3_XXS block at w and the multiplier.
func iq3xxsPoints(w GPVirtual, ib int, points, signs GPVirtual) (VecVirtual, VecVirtual) {
	g := iq3Gather(points, func(p int) GPVirtual {
		r := GP64()
		MOVBQZX(Mem{Base: w, Disp: 2 + 8*ib + p}, r)
		return r
	})
	aux := GP32()
	MOVL(Mem{Base: w, Disp: 66 + 4*ib}, aux)
	var s [2]VecVirtual
	for half := 0; half < 2; half++ {
		s[half] = YMM()
		for l := 0; l < 2; l++ {
			q := 2*half + l
			si := GP32()
			MOVL(aux, si)
			if q > 0 {
				SHRL(U8(7*q), si)
			}
			ANDL(U32(127), si)
			sm := Mem{Base: signs, Index: si.As64(), Scale: 8}
			if l == 0 {
				VPBROADCASTQ(sm, s[half])
			} else {
				VPINSRQ(U8(1), sm, s[half].AsX(), s[half].AsX())
			}
		}
	}
	VINSERTI128(U8(1), s[1].AsX(), s[0], s[0])
	VPSIGNB(s[0], g, g)
	SHRL(U8(28), aux)
	return g, iq3Mult(aux)
}

// iq3sPoints returns the 32 signed magnitudes of sub-block ib of the IQ3_S
// block at w and the multiplier.
func iq3sPoints(w GPVirtual, ib int, points GPVirtual) (VecVirtual, VecVirtual) {
	qh := GP32()
	MOVBLZX(Mem{Base: w, Disp: 66 + ib}, qh)
	g := iq3Gather(points, func(p int) GPVirtual {
		r, hi := GP64(), GP32()
		MOVBQZX(Mem{Base: w, Disp: 2 + 8*ib + p}, r)
		MOVL(qh, hi)
		SHLL(U8(8-p), hi)
		ANDL(U32(0x100), hi)
		ORQ(hi.As64(), r)
		return r
	})
	s := YMM()
	VPBROADCASTD(Mem{Base: w, Disp: 74 + 4*ib}, s)
	VPSHUFB(iq2SignSpread, s, s)
	VPAND(iq2SignBit, s, s)
	VPCMPEQB(iq2SignBit, s, s)
	VPOR(onesU8, s, s)
	VPSIGNB(s, g, g)
	sc := GP32()
	MOVBLZX(Mem{Base: w, Disp: 106 + ib/2}, sc)
	if ib%2 == 1 {
		SHRL(U8(4), sc)
	}
	ANDL(U32(15), sc)
	return g, iq3Mult(sc)
}
