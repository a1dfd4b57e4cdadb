package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// ---- AVX-512 VNNI prefill tiles for the 32-element legacy formats
//
// The tile kernels take activations prepared once per matmul ("u8 rows"):
// per 32-element block a float32 scale then the 32 quants plus 128 as
// unsigned bytes (36 bytes). Weights become signed bytes (Q4_0: nibble-8;
// Q8_0: as stored), so VPDPBUSD multiplies unsigned activations by signed
// weights directly, and
//
//	sum (a+128)·w − 128·sum w = sum a·w
//
// where the 128·sum w term is per weight block, shared by all C activations.
// A zmm holds one block of each of 4 weight rows, a 128-bit lane per row:
// the activation's half-block is broadcast to all four lanes. Each lane ends
// with 4 partial sums of its row, reduced at the store.

// u8Block is the size of one prepared activation block.
const u8Block = 36

// vpdpbusd adds to each dword of acc the four products of the unsigned bytes
// of u with the signed bytes of s (AVX512_VNNI; avo's table lacks it).
func vpdpbusd(s, u Op, acc VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPBUSD",
		Operands: []Op{s, u, acc},
		Inputs:   []Op{s, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512VNNI"},
	})
}

var laneIdx, pickIdx, c80m, scaleShuf, blockPick Mem

func consts512() {
	c80m = splat8("c80", 0x80)
	// VPERMPS control: float i of the source to lane i (4 copies each).
	laneIdx = GLOBL("laneIdx", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(4*i, U32(i/4))
	}
	// element 0 of each 128-bit lane to the low 4 floats
	pickIdx = GLOBL("pickIdx", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(4*i, U32(4*(i%4)))
	}
	// VPSHUFB control on the 4 half-float scales of a packed group (8
	// bytes, broadcast to both 128-bit lanes): scale r to halves 4r..4r+3
	// (rows 0, 1 from the low lane, 2, 3 from the high one).
	// VPERMPS controls, one per block k of 4: the float of row r of block
	// k (4k+r) to the 4 floats of lane r.
	blockPick = GLOBL("blockPick", RODATA|NOPTR)
	for k := 0; k < 4; k++ {
		for i := 0; i < 16; i++ {
			DATA(64*k+4*i, U32(4*k+i/4))
		}
	}
	scaleShuf = GLOBL("scaleShuf", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		r := i / 4 // the same 8 bytes are in both lanes
		DATA(2*i, U8(2*r))
		DATA(2*i+1, U8(2*r+1))
	}
}

// packedPtrs loads the group pointer "w" of a packed 4-row group (see
// kernels.Pack) and returns it with the address of its scales: nb blocks of
// quants (qb bytes a block for the four rows) come first, then the 8 bytes
// of scales per block.
func packedPtrs(qb int, nb GPVirtual) (w, s GPVirtual) {
	w, s = ld("w"), GP64()
	MOVQ(nb, s)
	switch qb {
	case 64:
		SHLQ(U8(6), s)
	case 128:
		SHLQ(U8(7), s)
	default:
		panic("packedPtrs: quant bytes per block must be 64 or 128")
	}
	ADDQ(w, s)
	return w, s
}

// packedScales loads the 4 half-float scales of a packed block at s and
// returns them as float32, each in the 4 floats of its row's 128-bit lane.
func packedScales(s GPVirtual) VecVirtual {
	y, z := YMM(), ZMM()
	VPBROADCASTQ(Mem{Base: s}, y)
	VPSHUFB(scaleShuf, y, y)
	VCVTPH2PS(y, z)
	return z
}

// legacyV4 generates a 4-row x C-activation VNNI tile for Q4_0 (bs 18),
// Q5_0 (bs 22) or Q8_0 (bs 34) weights against u8 activation rows.
//
// With packed (Q4_0 and Q8_0 only), w is a group of 4 rows in the packed
// layout (see kernels.Pack): each vector of quants is one aligned load and
// the 4 rows' scales one 8-byte load.
func legacyV4(name string, q legacy, C int, packed bool) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	if packed {
		Doc(name + ": a packed group of 4 weight rows x C prepared (u8) activation rows, AVX-512 VNNI.")
	} else {
		Doc(name + ": 4 weight rows x C prepared (u8) activation rows, AVX-512 VNNI.")
	}
	const R = 4
	bs := q.size()
	qb := 4 * (bs - 2) // packed: quant bytes of a block, 4 rows
	var w []GPVirtual
	var ws, s GPVirtual
	if packed {
		ws = ld("ws")
	} else {
		w, ws = rowPtrs(R)
	}
	// activation c is at base[c/3] + (c%3)*as
	as := ld("as")
	a := []GPVirtual{ld("a")}
	for i := 1; i*3 < C; i++ {
		p := GP64()
		LEAQ(Mem{Base: a[i-1], Index: as, Scale: 2}, p)
		LEAQ(Mem{Base: p, Index: as, Scale: 1}, p)
		a = append(a, p)
	}
	actMem := func(c, disp int) Mem {
		m := Mem{Base: a[c/3], Disp: disp}
		if c%3 > 0 {
			m.Index, m.Scale = as, uint8(c%3)
		}
		return m
	}
	nb := ld("nb")
	if packed {
		var g GPVirtual
		g, s = packedPtrs(qb, nb)
		w = []GPVirtual{g}
	}

	mask, eights, c80, lidx := ZMM(), ZMM(), ZMM(), ZMM()
	VPBROADCASTB(c0F, mask)
	VPBROADCASTB(c08, eights)
	var c10m VecVirtual
	if q == quant50 {
		c10m = ZMM()
		VPBROADCASTB(c10, c10m)
	}
	VPBROADCASTB(c80m, c80)
	VMOVDQU32(laneIdx, lidx)
	acc := zeros512(C)

	// The next 4 rows are prefetched: in a batch of a few sequences each
	// weight row is used by few tiles.
	var pf GPVirtual
	if packed {
		pf = GP64()
		LEAQ(Mem{Base: w[0], Index: ws, Scale: 4}, pf)
	} else {
		pf = nextRows(w[3], ws)
	}
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	prefetchStep(pf, R*bs)
	// weights: lo/hi halves of the block of each row as signed bytes
	load := func(disp int) VecVirtual {
		z := ZMM()
		if packed { // the quants of packed vector disp/16
			VMOVDQU32(Mem{Base: w[0], Disp: disp / 16 * 64}, z)
			return z
		}
		VMOVDQU32(Mem{Base: w[0], Disp: disp}, z.AsX())
		for r := 1; r < R; r++ {
			VINSERTI32X4(U8(r), Mem{Base: w[r], Disp: disp}, z, z)
		}
		return z
	}
	var lo, hi VecVirtual
	switch q {
	case quant40:
		lo = load(2)
		hi = ZMM()
		VPSRLW(U8(4), lo, hi)
		VPANDD(mask, lo, lo)
		VPANDD(mask, hi, hi)
		VPSUBB(eights, lo, lo)
		VPSUBB(eights, hi, hi)
	case quant50:
		// nibbles at 6, fifth bits in the 32-bit qh at 2: bits 0-15 of each
		// row's qh go to its lane of lo, bits 16-31 to hi, through a 64-bit
		// mask (16 bits per row) and VPMOVM2B; then value − 16.
		lo = load(6)
		hi = ZMM()
		VPSRLW(U8(4), lo, hi)
		VPANDD(mask, lo, lo)
		VPANDD(mask, hi, hi)
		for i, v := range []VecVirtual{lo, hi} {
			bits, t := GP64(), GP64()
			for r := R - 1; r >= 0; r-- {
				if r == R-1 {
					MOVWQZX(Mem{Base: w[r], Disp: 2 + 2*i}, bits)
					continue
				}
				SHLQ(U8(16), bits)
				MOVWQZX(Mem{Base: w[r], Disp: 2 + 2*i}, t)
				ORQ(t, bits)
			}
			k, b := K(), ZMM()
			KMOVQ(bits, k)
			VPMOVM2B(k, b)
			VPANDD(c10m, b, b)
			VPORD(b, v, v)
			VPSUBB(c10m, v, v)
		}
	default:
		lo, hi = load(2), load(18)
	}
	// −128·sum w per dword
	corr := ZMM()
	VPXORD(corr, corr, corr)
	vpdpbusd(lo, c80, corr)
	vpdpbusd(hi, c80, corr)
	neg := ZMM()
	VPXORD(neg, neg, neg)
	VPSUBD(corr, neg, neg)
	var dw VecVirtual
	if packed {
		dw = packedScales(s)
	} else {
		dw = laneScales(w, lidx)
	}
	for c := 0; c < C; c++ {
		t, al, ah := ZMM(), ZMM(), ZMM()
		VMOVDQA32(neg, t)
		VBROADCASTI32X4(actMem(c, 4), al)
		VBROADCASTI32X4(actMem(c, 20), ah)
		vpdpbusd(lo, al, t)
		vpdpbusd(hi, ah, t)
		VCVTDQ2PS(t, t)
		VMULPS_BCST(actMem(c, 0), t, t)
		VFMADD231PS(dw, t, acc[c])
	}
	if packed {
		ADDQ(U32(qb), w[0])
		ADDQ(U32(8), s)
	} else {
		for _, p := range w {
			ADDQ(U32(bs), p)
		}
	}
	for _, p := range a {
		ADDQ(U32(u8Block), p)
	}
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")

	out, os := ld("out"), ld("os")
	SHLQ(U8(2), os)
	pidx := ZMM()
	VMOVDQU32(pickIdx, pidx)
	for c := 0; c < C; c++ {
		storeLanes(acc[c], pidx, Mem{Base: out})
		if c+1 < C {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}

// fdot512 generates a 4-row x C-activation float tile: weights of format wf
// (16 per block) against float32 activations, one zmm accumulator per (row,
// activation); each activation block is loaded once for all four rows.
func fdot512(name string, wf ffmt, C int) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(name + ": 4 float weight rows x C float32 activation rows, AVX-512, 16 elements per block.")
	const R = 4
	w, ws := rowPtrs(R)
	actMem, a := actAddrs(C)
	nb := ld("nb")
	acc := make([][]VecVirtual, R)
	for r := range acc {
		for c := 0; c < C; c++ {
			z := ZMM()
			VPXORD(z, z, z)
			acc[r] = append(acc[r], z)
		}
	}
	pf := nextRows(w[3], ws)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	prefetchStep(pf, R*16*wf.size())
	xs := make([]VecVirtual, R)
	for r := range xs {
		xs[r] = ZMM()
		m := Mem{Base: w[r]}
		switch wf {
		case fF32:
			VMOVUPS(m, xs[r])
		case fF16:
			VCVTPH2PS(m, xs[r])
		case fBF16:
			VPMOVZXWD(m, xs[r])
			VPSLLD(U8(16), xs[r], xs[r])
		}
	}
	for c := 0; c < C; c++ {
		y := ZMM()
		VMOVUPS(actMem(c), y)
		for r := 0; r < R; r++ {
			VFMADD231PS(y, xs[r], acc[r][c])
		}
	}
	for _, p := range w {
		ADDQ(U32(16*wf.size()), p)
	}
	for _, p := range a {
		ADDQ(U32(64), p)
	}
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")

	out, os := ld("out"), ld("os")
	SHLQ(U8(2), os)
	// (EVEX forms only: the accumulators may sit in registers 16-31)
	for c := 0; c < C; c++ {
		for r := 0; r < R; r++ {
			storeSum512(acc[r][c], nil, Mem{Base: out, Disp: 4 * r})
		}
		if c+1 < C {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}

// vpdpwssd adds to each dword of acc the two products of the signed words
// of a and b (AVX512_VNNI; avo's table lacks it).
func vpdpwssd(a, b Op, acc VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPWSSD",
		Operands: []Op{a, b, acc},
		Inputs:   []Op{a, b, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512VNNI"},
	})
}

var q4kScaleIdx, q5kShift [4]Mem
var q4kMinIdx, c01 Mem

func constsQ4K512() {
	// Words of the unpacked scales (0..7) and mins (8..15): vector k of a
	// block's nibbles holds sub-blocks (lo, hi) = (0,2), (1,3), (4,6), (5,7)
	// in its two 256-bit halves; its scale vector repeats scale lo 16 times,
	// then scale hi.
	for k, sb := range [][2]int{{0, 2}, {1, 3}, {4, 6}, {5, 7}} {
		q4kScaleIdx[k] = GLOBL(fmt.Sprintf("q4kScaleIdx%d", k), RODATA|NOPTR)
		for i := 0; i < 32; i++ {
			DATA(2*i, U16(sb[i/16]))
		}
	}
	// Q5_K fifth bits: qh byte l holds bit j for element l of sub-block j;
	// vector k shifts [qh | qh] right by its two sub-blocks (word counts).
	for k, sb := range [][2]int{{0, 2}, {1, 3}, {4, 6}, {5, 7}} {
		q5kShift[k] = GLOBL(fmt.Sprintf("q5kShift%d", k), RODATA|NOPTR)
		for i := 0; i < 32; i++ {
			DATA(2*i, U16(sb[i/16]))
		}
	}
	c01 = splat8("c01", 0x01)
	// min j for Q8_K bsums 2j and 2j+1
	q4kMinIdx = GLOBL("q4kMinIdx", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(2*i, U16(8+i/2))
	}
}

// q4kV4 generates the AVX-512 Q4_K (withHigh: Q5_K) decode kernel: 4
// weight rows x 1 Q8_K activation. Per block the activation's sub-blocks are
// paired into zmm halves once for the 4 rows; per row the nibbles (with
// their fifth bits for Q5_K) meet them in VPMADDUBSW and the 6-bit scales in
// VPDPWSSD (one int32 accumulator per block), the mins meet the pairwise
// bsums in one VPMADDWD.
func q4kV4(name string, withHigh bool) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	bx, qoff, what := 144, 16, "Q4_K"
	if withHigh {
		bx, qoff, what = 176, 48, "Q5_K"
	}
	Doc(name + ": 4 " + what + " weight rows x 1 Q8_K activation, AVX-512 VNNI.")
	const R = 4
	w, ws := rowPtrs(R)
	a, nb := ld("a"), ld("nb")
	mask, midx := ZMM(), YMM()
	VPBROADCASTB(c0F, mask)
	VMOVDQU32(q4kMinIdx, midx)
	var c01m VecVirtual
	if withHigh {
		c01m = ZMM()
		VPBROADCASTB(c01, c01m)
	}
	sidx := make([]VecVirtual, 4)
	for k := range sidx {
		sidx[k] = ZMM()
		VMOVDQU64(q4kScaleIdx[k], sidx[k])
	}
	accS, accM := make([]VecVirtual, R), make([]VecVirtual, R)
	for r := 0; r < R; r++ {
		accS[r], accM[r] = ZMM(), YMM()
		VPXORD(accS[r], accS[r], accS[r])
		VXORPS(accM[r], accM[r], accM[r])
	}
	pf := nextRows(w[3], ws)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	prefetchStep(pf, R*bx)
	// activation sub-blocks paired as the nibble vectors pair them
	act := make([]VecVirtual, 4)
	for k, sb := range [][2]int{{0, 2}, {1, 3}, {4, 6}, {5, 7}} {
		act[k] = ZMM()
		VMOVDQU32(Mem{Base: a, Disp: 4 + 32*sb[0]}, act[k].AsY())
		VINSERTI64X4(U8(1), Mem{Base: a, Disp: 4 + 32*sb[1]}, act[k], act[k])
	}
	bs := YMM()
	VMOVDQU32(Mem{Base: a, Disp: 260}, bs)
	da := XMM()
	VBROADCASTSS(Mem{Base: a}, da)
	for r := 0; r < R; r++ {
		x := w[r]
		xs := q4kScales(x)
		wds := YMM()
		VPMOVZXBW(xs, wds) // scales 0..7, mins 8..15 as words
		sumi := ZMM()
		VPXORD(sumi, sumi, sumi)
		for k, q := range q4kNibbles512(x, qoff, mask, c01m) {
			p, s := ZMM(), ZMM()
			VPMADDUBSW(act[k], q, p)
			VPERMW(wds.AsZ(), sidx[k], s)
			vpdpwssd(p, s, sumi)
		}
		mins := YMM()
		VPERMW(wds, midx, mins)
		VPMADDWD(bs, mins, mins)
		// d·da and dmin·da
		dd := XMM()
		VPBROADCASTD(Mem{Base: x}, dd)
		VCVTPH2PS(dd, dd)
		VMULPS(da, dd, dd)
		dv, dm := ZMM(), YMM()
		VBROADCASTSS(dd, dv)
		VPERMILPS(U8(0x55), dd, dd)
		VBROADCASTSS(dd, dm)
		VCVTDQ2PS(sumi, sumi)
		VFMADD231PS(sumi, dv, accS[r])
		VCVTDQ2PS(mins, mins)
		VFNMADD231PS(mins, dm, accM[r])
	}
	for _, p := range w {
		ADDQ(U32(bx), p)
	}
	ADDQ(U32(292), a)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	out := ld("out")
	for r := 0; r < R; r++ {
		storeSum512(accS[r], accM[r], Mem{Base: out, Disp: 4 * r})
	}
	VZEROUPPER()
	RET()
}

var q6kIdx [4]Mem
var c03 Mem

func constsQ6K512() {
	c03 = splat8("c03", 0x03)
	// Vector (half h, part p) of a block holds groups 8h+4p .. 8h+4p+3 of 16
	// values; after VPMADDUBSW each group is 8 words.
	for i := range q6kIdx {
		q6kIdx[i] = GLOBL(fmt.Sprintf("q6kIdx%d", i), RODATA|NOPTR)
		for j := 0; j < 32; j++ {
			DATA(2*j, U16(4*i+j/8))
		}
	}
}

// q6kV4 generates the AVX-512 Q6_K decode kernel: 4 weight rows x 1 Q8_K
// activation. The 6-bit values are used unsigned (q+32) in VPMADDUBSW
// against the activation in its natural order, the int8 group scales meet
// the products in VPDPWSSD, and the +32 offset is taken back once per block
// as 32·Σ scale_g·bsum_g.
func q6kV4(name string) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(name + ": 4 Q6_K weight rows x 1 Q8_K activation, AVX-512 VNNI.")
	const R, bx = 4, 210
	w, ws := rowPtrs(R)
	a, nb := ld("a"), ld("nb")
	mask, m3 := ZMM(), ZMM()
	VPBROADCASTB(c0F, mask)
	VPBROADCASTB(c03, m3)
	idx := make([]VecVirtual, 4)
	for i := range idx {
		idx[i] = ZMM()
		VMOVDQU64(q6kIdx[i], idx[i])
	}
	acc := zeros512(R)
	pf := nextRows(w[3], ws)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	prefetchStep(pf, R*bx)
	bs := YMM()
	VMOVDQU32(Mem{Base: a, Disp: 260}, bs)
	da := XMM()
	VBROADCASTSS(Mem{Base: a}, da)
	for r := 0; r < R; r++ {
		x := w[r]
		sc := YMM()
		VPMOVSXBW(Mem{Base: x, Disp: 192}, sc) // 16 group scales as words
		sumi := ZMM()
		VPXORD(sumi, sumi, sumi)
		q6kValues512(x, mask, m3, func(i int, q VecVirtual) {
			pr, s := ZMM(), ZMM()
			VPMADDUBSW(Mem{Base: a, Disp: 4 + 64*i}, q, pr)
			VPERMW(sc.AsZ(), idx[i], s)
			vpdpwssd(pr, s, sumi)
		})
		// 32·Σ scale_g·bsum_g, per pair of groups
		cor := YMM()
		VPMADDWD(bs, sc, cor)
		VPSLLD(U8(5), cor, cor)
		VPSUBD(cor.AsZ(), sumi, sumi) // only the low 8 dwords: the upper half of cor.AsZ() is zero
		dd := XMM()
		VPBROADCASTW(Mem{Base: x, Disp: 208}, dd)
		VCVTPH2PS(dd, dd)
		VMULPS(da, dd, dd)
		dv := ZMM()
		VBROADCASTSS(dd, dv)
		VCVTDQ2PS(sumi, sumi)
		VFMADD231PS(sumi, dv, acc[r])
	}
	for _, p := range w {
		ADDQ(U32(bx), p)
	}
	ADDQ(U32(292), a)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	out := ld("out")
	for r := 0; r < R; r++ {
		storeSum512(acc[r], nil, Mem{Base: out, Disp: 4 * r})
	}
	VZEROUPPER()
	RET()
}

// actAddrs loads the activation pointer "a" and stride "as" and returns the
// address of activation row c (c < C) and the base registers (one per three
// rows, the rest reached by a scaled index), which the loop advances.
func actAddrs(C int) (func(c int) Mem, []GPVirtual) {
	as := ld("as")
	a := []GPVirtual{ld("a")}
	for i := 1; i*3 < C; i++ {
		p := GP64()
		LEAQ(Mem{Base: a[i-1], Index: as, Scale: 2}, p)
		LEAQ(Mem{Base: p, Index: as, Scale: 1}, p)
		a = append(a, p)
	}
	return func(c int) Mem {
		m := Mem{Base: a[c/3]}
		if c%3 > 0 {
			m.Index, m.Scale = as, uint8(c%3)
		}
		return m
	}, a
}

// q40s generates the AVX-512 VNNI Q4_0 decode kernel: 4 weight rows x one
// Q8_0 activation row, one block per iteration, a 128-bit lane per row.
// The nibbles (0..15) are the unsigned operand of VPDPBUSD and the
// activation's quants the signed one, so neither needs converting; the −8
// offset of Q4_0 becomes a per-dword correction −8·(sum of the activation
// bytes that dword multiplies), which aux holds per block with the
// activation's scale (auxQ4_0S: int32 x4, float32, padding; 32 bytes).
func q40s(name string) {
	TEXT(name, NOSPLIT, sigX)
	Pragma("noescape")
	Doc(name + ": 4 Q4_0 weight rows x 1 Q8_0 activation row, AVX-512 VNNI.")
	const R = 4
	w, ws := rowPtrs(R)
	a, aux, nb := ld("a"), ld("aux"), ld("nb")
	mask, lidx, acc := ZMM(), ZMM(), ZMM()
	VPBROADCASTB(c0F, mask)
	VMOVDQU32(laneIdx, lidx)
	VPXORD(acc, acc, acc)
	pf := nextRows(w[3], ws)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
	prefetchStep(pf, R*18)
	lo, hi := ZMM(), ZMM()
	VMOVDQU32(Mem{Base: w[0], Disp: 2}, lo.AsX())
	for r := 1; r < R; r++ {
		VINSERTI32X4(U8(r), Mem{Base: w[r], Disp: 2}, lo, lo)
	}
	VPSRLW(U8(4), lo, hi)
	VPANDD(mask, lo, lo)
	VPANDD(mask, hi, hi)
	t, al, ah := ZMM(), ZMM(), ZMM()
	VBROADCASTI32X4(Mem{Base: aux}, t)
	VBROADCASTI32X4(Mem{Base: a, Disp: 2}, al)
	VBROADCASTI32X4(Mem{Base: a, Disp: 18}, ah)
	vpdpbusd(al, lo, t)
	vpdpbusd(ah, hi, t)
	VCVTDQ2PS(t, t)
	VMULPS_BCST(Mem{Base: aux, Disp: 16}, t, t)
	VFMADD231PS(laneScales(w, lidx), t, acc)
	for _, p := range w {
		ADDQ(U32(18), p)
	}
	ADDQ(U32(34), a)
	ADDQ(U32(32), aux)
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
	out := ld("out")
	pidx := ZMM()
	VMOVDQU32(pickIdx, pidx)
	storeLanes(acc, pidx, Mem{Base: out})
	VZEROUPPER()
	RET()
}

// q40p generates the packed-layout version of q40s: a group of 4 Q4_0 rows
// (see kernels.Pack) x one Q8_0 activation row. Four blocks per iteration:
// their 16 scales are converted at once and multiplied by the activation
// scales (aux: auxQ4_0P), then each block's 4 picked out by one VPERMPS;
// two accumulators, so that the block sums do not wait on each other. The
// nb%4 blocks left are done one at a time as q40s does.
func q40p(name string) {
	TEXT(name, NOSPLIT, sigX)
	Pragma("noescape")
	Doc(name + ": a packed group of 4 Q4_0 weight rows x 1 Q8_0 activation row, AVX-512 VNNI.")
	ws := ld("ws")
	a, aux, nb := ld("a"), ld("aux"), ld("nb")
	w, s := packedPtrs(64, nb)
	pf := GP64()
	LEAQ(Mem{Base: w, Index: ws, Scale: 4}, pf)
	mask := ZMM()
	VPBROADCASTB(c0F, mask)
	acc := zeros512(2)
	// the integer dot of block k (at w+64k, a+34k) with the correction at
	// corr, as float32
	dot := func(k int, corr Mem) VecVirtual {
		lo, hi := ZMM(), ZMM()
		VMOVDQU32(Mem{Base: w, Disp: 64 * k}, lo)
		VPSRLW(U8(4), lo, hi)
		VPANDD(mask, lo, lo)
		VPANDD(mask, hi, hi)
		t, al, ah := ZMM(), ZMM(), ZMM()
		VBROADCASTI32X4(corr, t)
		VBROADCASTI32X4(Mem{Base: a, Disp: 34*k + 2}, al)
		VBROADCASTI32X4(Mem{Base: a, Disp: 34*k + 18}, ah)
		vpdpbusd(al, lo, t)
		vpdpbusd(ah, hi, t)
		VCVTDQ2PS(t, t)
		return t
	}
	pick := make([]VecVirtual, 4)
	for k := range pick {
		pick[k] = ZMM()
		VMOVDQU32(blockPick.Offset(64*k), pick[k])
	}
	n4 := GP64()
	MOVQ(nb, n4)
	SHRQ(U8(2), n4)
	JZ(LabelRef("tail"))
	Label("loop")
	prefetchStep(pf, 4*4*18)
	// scales of blocks 0..3 x rows 0..3, times the blocks' activation scales
	d := ZMM()
	VCVTPH2PS(Mem{Base: s}, d)
	VMULPS(Mem{Base: aux, Disp: 64}, d, d)
	for k := 0; k < 4; k++ {
		t := dot(k, Mem{Base: aux, Disp: 16 * k})
		dk := ZMM()
		VPERMPS(d, pick[k], dk)
		VFMADD231PS(dk, t, acc[k%2])
	}
	ADDQ(U32(256), w)
	ADDQ(U32(32), s)
	ADDQ(U32(4*34), a)
	ADDQ(U32(128), aux)
	DECQ(n4)
	JNZ(LabelRef("loop"))
	Label("tail")
	ANDQ(U32(3), nb)
	JZ(LabelRef("done"))
	Label("one")
	t := dot(0, Mem{Base: aux})
	VMULPS_BCST(Mem{Base: aux, Disp: 16}, t, t)
	VFMADD231PS(packedScales(s), t, acc[0])
	ADDQ(U32(64), w)
	ADDQ(U32(8), s)
	ADDQ(U32(34), a)
	ADDQ(U32(32), aux)
	DECQ(nb)
	JNZ(LabelRef("one"))
	Label("done")
	VADDPS(acc[1], acc[0], acc[0])
	out := ld("out")
	pidx := ZMM()
	VMOVDQU32(pickIdx, pidx)
	storeLanes(acc[0], pidx, Mem{Base: out})
	VZEROUPPER()
	RET()
}

// laneScales loads the F16 scales at the start of the blocks at w[0..3] and
// returns them as float32, each in the 4 floats of its row's 128-bit lane
// (lidx: laneIdx).
func laneScales(w []GPVirtual, lidx VecVirtual) VecVirtual {
	g, x, dw := GP32(), XMM(), ZMM()
	MOVWLZX(Mem{Base: w[0]}, g)
	VMOVD(g, x)
	for r := 1; r < len(w); r++ {
		VPINSRW(U8(r), Mem{Base: w[r]}, x, x)
	}
	VCVTPH2PS(x, x)
	VPERMPS(x.AsZ(), lidx, dw)
	return dw
}

// storeLanes sums the 4 floats of each 128-bit lane of acc and stores the
// four sums (one per row) at m (pidx: pickIdx).
func storeLanes(acc, pidx VecVirtual, m Mem) {
	s, u := ZMM(), ZMM()
	VPERMILPS(U8(0xb1), acc, s)
	VADDPS(s, acc, s)
	VPERMILPS(U8(0x4e), s, u)
	VADDPS(u, s, s)
	VPERMPS(s, pidx, s)
	VMOVUPS(s.AsX(), m)
}

// q4kNibbles512 unpacks the 4-bit values of the Q4_K block at x (quants at
// qoff) into 4 vectors holding sub-blocks (0,2) (1,3) (4,6) (5,7); with
// c01m (Q5_K) each value gets its fifth bit from the block's qh.
func q4kNibbles512(x GPVirtual, qoff int, mask, c01m VecVirtual) []VecVirtual {
	var qhz VecVirtual
	if c01m != nil {
		qhz = ZMM()
		VBROADCASTI64X4(Mem{Base: x, Disp: 16}, qhz)
	}
	q := make([]VecVirtual, 4)
	for half := 0; half < 2; half++ {
		z, h := ZMM(), ZMM()
		VMOVDQU64(Mem{Base: x, Disp: qoff + 64*half}, z)
		VPSRLW(U8(4), z, h)
		VPANDD(mask, z, z)
		VPANDD(mask, h, h)
		q[2*half], q[2*half+1] = z, h
	}
	for i := range q {
		if c01m != nil { // q |= ((qh >> sub-block) & 1) << 4
			b := ZMM()
			VPSRLVW(q5kShift[i], qhz, b)
			VPANDD(c01m, b, b)
			VPSLLW(U8(4), b, b)
			VPORD(b, q[i], q[i])
		}
	}
	return q
}

// q4kTile generates the AVX-512 Q4_K (withHigh: Q5_K) prefill tile: 1
// weight row x C Q8_K activations whose sub-blocks come paired as the
// nibble vectors pair them (pairK8: (0,2) (1,3) (4,6) (5,7), 64 bytes each),
// so each VPMADDUBSW takes its activation straight from memory. The row's
// nibbles, scale vectors and mins are unpacked once per block for the C
// activations; d and dmin scale each activation's sums before its own
// scale, broadcast from memory, adds them to its accumulator.
func q4kTile(name string, C int, withHigh bool) {
	bx, qoff, what := 144, 16, "Q4_K"
	if withHigh {
		bx, qoff, what = 176, 48, "Q5_K"
	}
	k := begin(name, 1, C, what+" weights, paired Q8_K activations (pairK8), AVX-512 VNNI")
	mask, midx := ZMM(), YMM()
	VPBROADCASTB(c0F, mask)
	VMOVDQU32(q4kMinIdx, midx)
	var c01m VecVirtual
	if withHigh {
		c01m = ZMM()
		VPBROADCASTB(c01, c01m)
	}
	acc := zeros512(C)
	k.loop(bx, 292, func() {
		x := k.w[0]
		xs := q4kScales(x)
		wds := YMM()
		VPMOVZXBW(xs, wds) // scales 0..7, mins 8..15 as words
		mins := YMM()
		VPERMW(wds, midx, mins)
		q, s := q4kNibbles512(x, qoff, mask, c01m), make([]VecVirtual, 4)
		for i := range q {
			s[i] = ZMM()
			VMOVDQU64(q4kScaleIdx[i], s[i])
			VPERMW(wds.AsZ(), s[i], s[i])
		}
		dd := XMM()
		VPBROADCASTD(Mem{Base: x}, dd)
		VCVTPH2PS(dd, dd)
		dv, dm := ZMM(), ZMM()
		VBROADCASTSS(dd, dv)
		VPERMILPS(U8(0x55), dd, dd)
		VBROADCASTSS(dd, dm)
		for c := 0; c < C; c++ {
			a := k.a[c]
			sumi := scaledDots512(a, q, s)
			md := YMM()
			VPMADDWD(Mem{Base: a, Disp: 260}, mins, md)
			VCVTDQ2PS(sumi, sumi)
			VCVTDQ2PS(md, md)
			VMULPS(dv, sumi, sumi)
			VFNMADD231PS(md.AsZ(), dm, sumi)
			VFMADD231PS_BCST(Mem{Base: a}, sumi, acc[c])
		}
	})
	storeTile512(acc)
}

// q6kValues512 unpacks the 6-bit values of the Q6_K block at x, unsigned
// (q+32), into 4 vectors of 64 in element order (mask: 0x0f bytes, m3:
// 0x03 bytes), and passes each to use as it is ready.
func q6kValues512(x GPVirtual, mask, m3 VecVirtual, use func(i int, q VecVirtual)) {
	for h := 0; h < 2; h++ {
		l, hb, hz := ZMM(), YMM(), ZMM()
		VMOVDQU64(Mem{Base: x, Disp: 64 * h}, l)
		VMOVDQU32(Mem{Base: x, Disp: 128 + 32*h}, hb)
		// hz = [qh | qh>>2] (bits of parts 0 and 1), qh>>4 gives parts 2, 3
		VPSRLW(U8(2), hb, hz.AsY())
		VINSERTI64X4(U8(1), hz.AsY(), hb.AsZ(), hz)
		lo, hi := ZMM(), ZMM()
		VPSRLW(U8(4), l, hi)
		VPANDD(mask, l, lo)
		VPANDD(mask, hi, hi)
		hh := ZMM()
		VPSRLW(U8(4), hz, hh)
		for p, v := range []struct{ q, bits VecVirtual }{{lo, hz}, {hi, hh}} {
			t := ZMM()
			VPANDD(m3, v.bits, t)
			VPSLLW(U8(4), t, t)
			VPORD(t, v.q, v.q)
			use(2*h+p, v.q)
		}
	}
}

// q6kTile generates the AVX-512 Q6_K prefill tile: 1 weight row x C Q8_K
// activations (in their natural order). The row's 6-bit values (used
// unsigned, q+32) and group-scale vectors are unpacked once per block for
// the C activations, as in q6kV4.
func q6kTile(name string, C int) {
	const bx = 210
	k := begin(name, 1, C, "Q6_K weights, Q8_K activations, AVX-512 VNNI")
	mask, m3 := ZMM(), ZMM()
	VPBROADCASTB(c0F, mask)
	VPBROADCASTB(c03, m3)
	acc := zeros512(C)
	k.loop(bx, 292, func() {
		x := k.w[0]
		sc := YMM()
		VPMOVSXBW(Mem{Base: x, Disp: 192}, sc) // 16 group scales as words
		q, s := make([]VecVirtual, 4), make([]VecVirtual, 4)
		q6kValues512(x, mask, m3, func(i int, v VecVirtual) {
			q[i], s[i] = v, ZMM()
			VMOVDQU64(q6kIdx[i], s[i])
			VPERMW(sc.AsZ(), s[i], s[i])
		})
		dd, dv := XMM(), ZMM()
		VPBROADCASTW(Mem{Base: x, Disp: 208}, dd)
		VCVTPH2PS(dd, dd)
		VBROADCASTSS(dd, dv)
		for c := 0; c < C; c++ {
			a := k.a[c]
			sumi := scaledDots512(a, q, s)
			// 32·Σ scale_g·bsum_g, per pair of groups
			cor := YMM()
			VPMADDWD(Mem{Base: a, Disp: 260}, sc, cor)
			VPSLLD(U8(5), cor, cor)
			VPSUBD(cor.AsZ(), sumi, sumi) // the upper half of cor.AsZ() is zero
			VCVTDQ2PS(sumi, sumi)
			VMULPS(dv, sumi, sumi)
			VFMADD231PS_BCST(Mem{Base: a}, sumi, acc[c])
		}
	})
	storeTile512(acc)
}

// scaledDots512 returns the int32 sums, per dword, of the 4 vectors of 64
// unsigned weight values q times the 256 activation quants of the Q8_K
// block at a (in the order q holds them), each product pair weighted by
// the words of its scale vector s.
func scaledDots512(a GPVirtual, q, s []VecVirtual) VecVirtual {
	sumi := ZMM()
	for i := range q {
		p := ZMM()
		VPMADDUBSW(Mem{Base: a, Disp: 4 + 64*i}, q[i], p)
		if i == 0 {
			VPMADDWD(s[i], p, sumi)
		} else {
			vpdpwssd(p, s[i], sumi)
		}
	}
	return sumi
}

// zeros512 returns n zeroed zmm accumulators.
func zeros512(n int) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = ZMM()
		VPXORD(v[i], v[i], v[i])
	}
	return v
}

// storeTile512 stores the sums of the 16 floats of acc[c] at out + c·os
// (the 1-row tiles' outputs).
func storeTile512(acc []VecVirtual) {
	out := ld("out")
	os := ld("os")
	SHLQ(U8(2), os)
	for c := range acc {
		storeSum512(acc[c], nil, Mem{Base: out})
		if c+1 < len(acc) {
			ADDQ(os, out)
		}
	}
	VZEROUPPER()
	RET()
}
