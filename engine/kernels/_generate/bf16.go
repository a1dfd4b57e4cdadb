package main

import (
	"fmt"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- AVX-512 BF16 prefill tiles: BF16 weights x BF16 activations
//
// VDPBF16PS (AVX512_BF16) multiplies the bf16 pairs of two zmm lane by lane
// and adds both products to the float32 lane of the accumulator: 32 products
// per instruction, twice the float tiles' VFMADD231PS on widened halves. A
// zmm holds 32 elements (two 16-element blocks) of one weight row or one
// activation row; there is one accumulator per (row, activation), summed
// across its lanes at the end. The activations are the BF16 rows of
// QuantizeActs, read in place. (The products of two bf16 are exact in
// float32; VDPBF16PS treats denormal inputs as zero, as llama.cpp's BF16
// path on such CPUs does.)
//
// Neither the Go assembler nor avo knows VDPBF16PS, so it is emitted as raw
// bytes, and these kernels name their vector registers (Z0..Z31) instead of
// leaving them to avo's allocator.

// zreg is the physical zmm register i.
func zreg(i int) VecPhysical {
	return []VecPhysical{
		Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15,
		Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23, Z24, Z25, Z26, Z27, Z28, Z29, Z30, Z31,
	}[i]
}

// vdpbf16psBytes encodes VDPBF16PS zmm(dst), zmm(src1), zmm(src2) (Intel
// operand order): EVEX.512.F3.0F38.W0 52 /r, dst in ModRM.reg, src1 in
// EVEX.vvvv, src2 in ModRM.rm; no masking, no broadcast.
func vdpbf16psBytes(dst, src1, src2 int) []byte {
	inv := func(b int) byte { return byte(^b & 1) }
	p0 := inv(dst>>3)<<7 | inv(src2>>4)<<6 | inv(src2>>3)<<5 | inv(dst>>4)<<4 | 0b10 // map 0F38
	p1 := byte(^src1&15)<<3 | 1<<2 | 0b10                                            // W0, vvvv, pp = F3
	p2 := byte(0b10)<<5 | inv(src1>>4)<<3                                            // L'L = 512, V'
	modrm := byte(0xc0) | byte(dst&7)<<3 | byte(src2&7)
	return []byte{0x62, p0, p1, p2, 0x52, modrm}
}

// vdpbf16ps adds to each float32 lane of dst the two products of the bf16
// pairs of that lane of x and y (Go operand order: VDPBF16PS y, x, dst). It
// is one line of BYTE directives, with the instruction in a comment.
func vdpbf16ps(y, x, dst VecPhysical) {
	yi, xi, di := int(y.PhysicalIndex()), int(x.PhysicalIndex()), int(dst.PhysicalIndex())
	var s []string
	for _, b := range vdpbf16psBytes(di, xi, yi) {
		s = append(s, fmt.Sprintf("BYTE $0x%02x", b))
	}
	Instruction(&ir.Instruction{
		Opcode:  fmt.Sprintf("%s // VDPBF16PS %s, %s, %s", strings.Join(s, "; "), y.Asm(), x.Asm(), dst.Asm()),
		Inputs:  []Op{y, x, dst},
		Outputs: []Op{dst},
		ISA:     []string{"AVX512BF16"},
	})
}

// bf16V4 generates a 4-row x C-activation tile for BF16 weights against BF16
// activations (C <= 6): accumulators Z0..Z4C-1 (activation c, row r in
// Z(4c+r)), weights Z24..Z27, activations Z28/Z29. Each iteration takes 32
// elements (two blocks); an odd last block goes through the same
// instructions with ymm loads, whose zeroed upper halves add nothing.
func bf16V4(name string, C int) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(name + ": 4 BF16 weight rows x C BF16 activation rows, AVX-512 BF16 (VDPBF16PS), 16 elements per block.")
	const R = 4
	if R*C > 24 {
		panic("bf16V4: too many accumulators")
	}
	w, ws := rowPtrs(R)
	actMem, a := actAddrs(C)
	nb := ld("nb")
	acc := func(r, c int) VecPhysical { return zreg(R*c + r) }
	for i := 0; i < R*C; i++ {
		VPXORD(zreg(i), zreg(i), zreg(i))
	}
	wz := []VecPhysical{Z24, Z25, Z26, Z27}
	az := []VecPhysical{Z28, Z29}

	// step multiplies 32 elements (full) or 16 (the odd last block).
	step := func(full bool) {
		load := func(m Mem, z VecPhysical) {
			if full {
				VMOVDQU64(m, z)
			} else {
				VMOVDQU64(m, z.AsY()) // zeroes the upper half
			}
		}
		for r := 0; r < R; r++ {
			load(Mem{Base: w[r]}, wz[r])
		}
		for c := 0; c < C; c++ {
			y := az[c%2]
			load(actMem(c), y)
			for r := 0; r < R; r++ {
				vdpbf16ps(y, wz[r], acc(r, c))
			}
		}
	}

	pf := nextRows(w[3], ws)
	cnt := GP64()
	MOVQ(nb, cnt)
	SHRQ(U8(1), cnt)
	JZ(LabelRef("half"))
	Label("loop")
	prefetchStep(pf, R*64)
	step(true)
	for _, p := range w {
		ADDQ(U32(64), p)
	}
	for _, p := range a {
		ADDQ(U32(64), p)
	}
	DECQ(cnt)
	JNZ(LabelRef("loop"))
	Label("half")
	TESTQ(U32(1), nb)
	JZ(LabelRef("done"))
	step(false)
	Label("done")

	// Per activation: the four row accumulators to [r0 r1 r2 r3], halving
	// across them (256-bit halves, then 128-bit lanes), then within lanes.
	out, os := ld("out"), ld("os")
	SHLQ(U8(2), os)
	pidx := Z31
	VMOVDQU32(pickIdx, pidx)
	for c := 0; c < C; c++ {
		// [a.lo+a.hi | b.lo+b.hi] for rows (0,1) in Z24, rows (2,3) in Z26
		for i, t := range [][2]VecPhysical{{Z24, Z25}, {Z26, Z27}} {
			x, y := acc(2*i, c), acc(2*i+1, c)
			VINSERTF64X4(U8(1), y.AsY(), x, t[0])
			VSHUFF64X2(U8(0xee), y, x, t[1])
			VADDPS(t[1], t[0], t[0])
		}
		// 128-bit lanes: rows 0..3 in lanes 0..3 of Z25
		VSHUFF32X4(U8(0x88), Z26, Z24, Z25)
		VSHUFF32X4(U8(0xdd), Z26, Z24, Z27)
		VADDPS(Z27, Z25, Z25)
		VPERMILPS(U8(0xb1), Z25, Z24)
		VADDPS(Z24, Z25, Z25)
		VPERMILPS(U8(0x4e), Z25, Z24)
		VADDPS(Z24, Z25, Z25)
		VPERMPS(Z25, pidx, Z25)
		VMOVUPS(X25, Mem{Base: out})
		if c+1 < C {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}
