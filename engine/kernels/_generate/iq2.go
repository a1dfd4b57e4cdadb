package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- IQ2_XXS, IQ2_XS and IQ2_S · Q8_K (AVX2 decode kernels)
//
// A group of 8 weights is an index into the codebook and (IQ2_XXS, IQ2_XS)
// a 7-bit index into the sign patterns of even parity or (IQ2_S) 8 sign
// bits. The kernels look the points and sign patterns up in tables that
// the Go side of the package fills from shoal/engine/quant (so the
// codebooks are written down once): ·iq2xxsGrid, ·iq2xsGrid, ·iq2sGrid
// (256, 512 and 1024 x 8 magnitudes) and ·iq2Signs64 (128 x 8 bytes, -1
// for a negative weight, +1 otherwise), a 64-bit load each, four groups
// (32 weights) to a ymm; IQ2_S's sign bytes are spread to bytes in vector
// registers. The magnitudes (8 to
// 43) get their signs and then y's (VPSIGNB twice) and go through
// VPMADDUBSW with |y| (-128 gives 128 as an unsigned byte): a pair of
// products is at most 2·128·43, which fits int16. Each 16 weights (IQ2_XXS:
// 32) have a 4-bit scale s; the odd multiplier 2s+1 is put in every word of
// its half of a ymm (VPSHUFB of the block's 8 scale bytes, low nibbles in
// the low lane and high nibbles in the high lane; IQ2_XXS: broadcast from
// a general register) and VPMADDWD applies it and adds pairs. The 8 sub-blocks of 32 add in int32 (at most 8·2·2·128·43·31 in
// magnitude, exact) before the one float scale d_x·d_y/8.

var iq2ScaleSel [8]Mem
var iq2Eighth, iq3Quarter, iq2SignSpread, iq2SignBit Mem

func constsIQ2() {
	for ib := range iq2ScaleSel {
		iq2ScaleSel[ib] = GLOBL(fmt.Sprintf("iq2ScaleSel%d", ib), RODATA|NOPTR)
		for i := 0; i < 16; i++ {
			DATA(2*i, U8(uint8(ib)))
			DATA(2*i+1, U8(0x80))
		}
	}
	iq2Eighth = splat32("iq2Eighth", math.Float32bits(0.125))
	iq3Quarter = splat32("iq3Quarter", math.Float32bits(0.25))
	iq2SignSpread = GLOBL("iq2SignSpread", RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		DATA(i, U8(uint8(i/8)))
	}
	iq2SignBit = GLOBL("iq2SignBit", RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		DATA(i, U8(uint8(1<<(i%8))))
	}
}

// iq2xsScales returns the multipliers 2s+1 of the IQ2_XS (or IQ2_S) block
// at w, its scales at w+off, as bytes: byte ib of the low lane for weights
// 32ib..32ib+15 (low nibble of scales[ib]), byte ib of the high lane for
// weights 32ib+16..32ib+31 (high nibble).
func iq2xsScales(w GPVirtual, off int) VecVirtual {
	t, h := YMM(), YMM()
	VPBROADCASTQ(Mem{Base: w, Disp: off}, t)
	VPSRLW(U8(4), t, h)
	VPBLENDD(U8(0xf0), h, t, t)
	VPAND(c0F, t, t)
	VPADDB(t, t, t)
	VPADDB(onesU8, t, t)
	return t
}

// iq2xsPoints returns the 32 signed magnitudes of sub-block ib of the
// IQ2_XS block at w (points, signs: the tables' addresses).
func iq2xsPoints(w GPVirtual, ib int, points, signs GPVirtual) VecVirtual {
	var g, s [2]VecVirtual
	for half := 0; half < 2; half++ {
		g[half], s[half] = YMM(), YMM()
		for l := 0; l < 2; l++ {
			idx, si := GP64(), GP64()
			MOVWQZX(Mem{Base: w, Disp: 2 + 2*(4*ib+2*half+l)}, idx)
			MOVQ(idx, si)
			SHRQ(U8(9), si)
			ANDQ(U32(511), idx)
			gm, sm := Mem{Base: points, Index: idx, Scale: 8}, Mem{Base: signs, Index: si, Scale: 8}
			if l == 0 {
				// (a full-width write: avo would take a VMOVQ to the
				// low lane as leaving the high lane live from before)
				VPBROADCASTQ(gm, g[half])
				VPBROADCASTQ(sm, s[half])
			} else {
				VPINSRQ(U8(1), gm, g[half].AsX(), g[half].AsX())
				VPINSRQ(U8(1), sm, s[half].AsX(), s[half].AsX())
			}
		}
	}
	VINSERTI128(U8(1), g[1].AsX(), g[0], g[0])
	VINSERTI128(U8(1), s[1].AsX(), s[0], s[0])
	VPSIGNB(s[0], g[0], g[0])
	return g[0]
}

// iq2xxsPoints is iq2xsPoints for IQ2_XXS: the 8 bytes of sub-block ib
// hold 4 grid indices and a uint32 (aux) of 4 sign indices of 7 bits and
// the scale in its top 4 bits. It also returns the multiplier 2s+1 in
// every word of a ymm.
func iq2xxsPoints(w GPVirtual, ib int, points, signs GPVirtual) (VecVirtual, VecVirtual) {
	aux := GP32()
	MOVL(Mem{Base: w, Disp: 2 + 8*ib + 4}, aux)
	var g, s [2]VecVirtual
	for half := 0; half < 2; half++ {
		g[half], s[half] = YMM(), YMM()
		for l := 0; l < 2; l++ {
			q := 2*half + l
			idx, si := GP64(), GP32()
			MOVBQZX(Mem{Base: w, Disp: 2 + 8*ib + q}, idx)
			MOVL(aux, si)
			if q > 0 {
				SHRL(U8(7*q), si)
			}
			ANDL(U32(127), si)
			gm, sm := Mem{Base: points, Index: idx, Scale: 8}, Mem{Base: signs, Index: si.As64(), Scale: 8}
			if l == 0 {
				VPBROADCASTQ(gm, g[half])
				VPBROADCASTQ(sm, s[half])
			} else {
				VPINSRQ(U8(1), gm, g[half].AsX(), g[half].AsX())
				VPINSRQ(U8(1), sm, s[half].AsX(), s[half].AsX())
			}
		}
	}
	VINSERTI128(U8(1), g[1].AsX(), g[0], g[0])
	VINSERTI128(U8(1), s[1].AsX(), s[0], s[0])
	VPSIGNB(s[0], g[0], g[0])
	SHRL(U8(28), aux)
	LEAL(Mem{Base: aux, Index: aux, Scale: 1, Disp: 1}, aux)
	m := YMM()
	VMOVD(aux, m.AsX())
	VPBROADCASTW(m.AsX(), m)
	return g[0], m
}

// iq2sPoints is iq2xsPoints for IQ2_S: the grid index of group q of
// sub-block ib is qs[4ib+q] and bits 2q, 2q+1 of qh[ib] above it; its 8
// sign bits are the byte qs[32+4ib+q], spread to bytes (the 4 bytes
// broadcast, byte q to bytes 8q..8q+7, each tested for its bit) instead
// of looked up.
func iq2sPoints(w GPVirtual, ib int, points GPVirtual) VecVirtual {
	qh := GP32()
	MOVBLZX(Mem{Base: w, Disp: 66 + ib}, qh)
	var g [2]VecVirtual
	for half := 0; half < 2; half++ {
		g[half] = YMM()
		for l := 0; l < 2; l++ {
			q := 2*half + l
			idx, hi := GP64(), GP32()
			MOVBQZX(Mem{Base: w, Disp: 2 + 4*ib + q}, idx)
			MOVL(qh, hi)
			SHLL(U8(8-2*q), hi)
			ANDL(U32(0x300), hi)
			ORQ(hi.As64(), idx)
			gm := Mem{Base: points, Index: idx, Scale: 8}
			if l == 0 {
				VPBROADCASTQ(gm, g[half])
			} else {
				VPINSRQ(U8(1), gm, g[half].AsX(), g[half].AsX())
			}
		}
	}
	VINSERTI128(U8(1), g[1].AsX(), g[0], g[0])
	s := YMM()
	VPBROADCASTD(Mem{Base: w, Disp: 34 + 4*ib}, s)
	VPSHUFB(iq2SignSpread, s, s)
	VPAND(iq2SignBit, s, s)
	VPCMPEQB(iq2SignBit, s, s)
	VPOR(onesU8, s, s)
	VPSIGNB(s, g[0], g[0])
	return g[0]
}

// iq2Fmt is one IQ2 format as its kernel reads it.
type iq2Fmt int

const (
	iq2XXS iq2Fmt = iota
	iq2XS
	iq2S
	iq3XXS
	iq3S
)

func (f iq2Fmt) size() int { return [...]int{66, 74, 82, 98, 110}[f] }

func (f iq2Fmt) name() string {
	return [...]string{"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}[f]
}

func iq2Dot(name string, f iq2Fmt, R int) {
	k := begin(name, R, 1, fmt.Sprintf("%s weights, Q8_K activations", f.name()))
	points, signs := GP64(), GP64()
	LEAQ(NewDataAddr(Symbol{Name: [...]string{"·iq2xxsGrid", "·iq2xsGrid", "·iq2sGrid", "·iq3xxsGrid", "·iq3sGrid"}[f]}, 0), points)
	if f != iq2S && f != iq3S {
		LEAQ(NewDataAddr(Symbol{Name: "·iq2Signs64"}, 0), signs)
	}
	acc := grid(R, 1)
	k.loop(f.size(), 292, func() {
		dy := YMM()
		VBROADCASTSS(Mem{Base: k.a[0]}, dy)
		// the multipliers' denominators: 8 (IQ2), 4 (IQ3_XXS), 1 (IQ3_S)
		switch f {
		case iq3XXS:
			VMULPS(iq3Quarter, dy, dy)
		case iq3S:
		default:
			VMULPS(iq2Eighth, dy, dy)
		}
		for r := 0; r < R; r++ {
			var sc VecVirtual
			switch f {
			case iq2XS:
				sc = iq2xsScales(k.w[r], 66)
			case iq2S:
				sc = iq2xsScales(k.w[r], 74)
			}
			var isum VecVirtual
			for ib := 0; ib < 8; ib++ {
				var p, m VecVirtual
				switch f {
				case iq2XXS:
					p, m = iq2xxsPoints(k.w[r], ib, points, signs)
				case iq2XS:
					p = iq2xsPoints(k.w[r], ib, points, signs)
				case iq2S:
					p = iq2sPoints(k.w[r], ib, points)
				case iq3XXS:
					p, m = iq3xxsPoints(k.w[r], ib, points, signs)
				case iq3S:
					p, m = iq3sPoints(k.w[r], ib, points)
				}
				y, ay := YMM(), YMM()
				VMOVDQU(Mem{Base: k.a[0], Disp: 4 + 32*ib}, y)
				VPSIGNB(y, y, ay)
				VPSIGNB(y, p, p)
				VPMADDUBSW(p, ay, p)
				if m == nil {
					m = YMM()
					VPSHUFB(iq2ScaleSel[ib], sc, m)
				}
				VPMADDWD(m, p, p)
				if ib == 0 {
					isum = p
				} else {
					VPADDD(p, isum, isum)
				}
			}
			VCVTDQ2PS(isum, isum)
			d := halfScale(Mem{Base: k.w[r]})
			VMULPS(dy, d, d)
			VFMADD231PS(isum, d, acc[r][0])
		}
	})
	k.storeRows(acc)
}

// iq2Kernels generates the IQ2 and IQ3 kernels (T0: the decode kernels prefetching
// to L1, see prefetchStep).
func iq2Kernels(t0 bool) {
	sfx := ""
	for _, f := range []iq2Fmt{iq2XXS, iq2XS, iq2S, iq3XXS, iq3S} {
		n := f.name()
		if !t0 {
			iq2Dot(fmt.Sprintf("dot%sR1C1", n), f, 1)
		} else {
			sfx = "T0"
		}
		iq2Dot(fmt.Sprintf("dot%sR4C1%s", n, sfx), f, 4)
	}
}
