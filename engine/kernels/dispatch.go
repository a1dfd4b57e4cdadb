package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"
	"unsafe"

	"shoal/engine/quant"
)

// dotFn is the shape of every platform dot kernel: for R weight rows
// (w + r*ws bytes) and C activation rows (a + c*as bytes) of nb blocks each,
// it stores out[c*os + r] = dot(weight row r, activation row c). R and C are
// fixed per kernel. For the float formats a block is 16 elements.
type dotFn func(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

// rowsXFn is a decode kernel that takes activation data from auxPrep.
type rowsXFn func(w *byte, ws int, a *byte, aux *byte, nb int, out *float32)

// oneFn is the dot of one weight row with one activation row of nb blocks. (A
// Go wrapper calls the assembly directly, so that its result slot stays on
// the stack: through a func value it would escape.)
type oneFn func(w, a *byte, nb int) float32

// kset is the set of platform kernels for one weight type.
type kset struct {
	blockLen int // elements per kernel block (the type's block; 16 for floats)
	tail     bool

	one oneFn // one row x one activation

	rows  dotFn // rowsR rows x 1 activation: the decode kernel
	rowsR int

	// rowsX, when set, replaces rows: 4 rows x 1 activation with per-block
	// activation data that auxPrep computes once per activation row
	// (auxSize(nb) bytes).
	rowsX   rowsXFn
	auxPrep func(a []byte, nb int, aux []byte)
	// rowsX8, when set, is rowsX for 8 rows (same activation data), run
	// first: eight rows read at once keep more of memory's streams busy.
	rowsX8 rowsXFn
	// rowsU8, when set, replaces rowsX and rows: 4 rows x 1 activation
	// prepared as the tileU8 kernels take it (prepU8).
	rowsU8 dotFn

	tile         dotFn // tileR rows x tileC activations: the prefill kernel
	tileR, tileC int
	// tile4, when set, is the same kernel for 4 activations, used when a
	// small batch (a decode step of several sequences) is a multiple of 4
	// but not of tileC, so no activation falls back to the decode kernel.
	tile4 dotFn
	// rest, where set, are the tile kernel for 1, 2 or 3 activations: the
	// ones left after the tileC-tiles and tile4, run while the rows are in
	// L1 instead of by the decode kernel.
	rest    [4]dotFn
	tileF32 bool // tile takes float32 activations (float weight types)
	// tileU8: the tile takes Q8_0 activations prepared by prepU8 (per
	// 32-element block a float32 scale, then the quants plus 128 as bytes).
	tileU8 bool
	// tileK8: the tile takes Q8_K activations with their sub-blocks paired
	// (pairK8).
	tileK8 bool
	// tileExact: the tile kernels (tile, tile4, rest) give each pair of a
	// weight row and an activation row bitwise the value the decode kernels
	// give it (same sums in the same order), so batch-invariant products
	// keep them (see SetBatchInvariant). Set only where TestBatchInvariant
	// shows it.
	tileExact bool

	// panel, when set, runs batches of panel.minN or more activations (see
	// panel.go) instead of tile.
	panel *panelSet

	// packed, when set, are the kernels for matrices of this type in the
	// packed layout (see Pack): each takes a group of PackRows rows at w.
	packed *kset
}

// level is one set of kernels, selectable by name.
type level struct {
	name string
	k    [quant.MXFP4 + 1]*kset // by quant.Type; nil: generic Go
	q8_0 func(x *float32, dst *byte, nb int)
	q8_K func(x *float32, dst *byte, nb int)
	// prepU8 lays out nb Q8_0 blocks as the rowsU8 and tileU8 kernels take
	// them (see mmJob.prepU8); nil: Go.
	prepU8 func(src, dst *byte, nb int)
	// scoresF16 and accumF16 are the attention kernels over F16 cache rows
	// (see ScoresF16 and AccumF16); stride in bytes, d a multiple of 8.
	scoresF16 func(q *float32, k *uint16, stride, d, T int, out *float32)
	accumF16  func(acc, p *float32, v *uint16, stride, d, T int)
	// accumQ8_0 and accumQ4_0 are AccumQ over Q8_0 and Q4_0 rows; stride
	// in bytes, d a multiple of 32.
	accumQ8_0, accumQ4_0 func(acc, p *float32, v *byte, stride, d, T int)
	// expSub and siluMul are ExpSub and SiLUMul on n (a multiple of 8) floats.
	expSub  func(x *float32, n int, m float32) float32
	siluMul func(g, u *float32, n int)
	// f32ToF16, f16ToF32 and roundF16 are F32ToF16, F16ToF32 and RoundF16
	// on n (a multiple of 8) values.
	f32ToF16 func(dst *uint16, src *float32, n int)
	f16ToF32 func(dst *float32, src *uint16, n int)
	roundF16 func(x *float32, n int)
	// scaleRoundF16 is ScaleRoundF16 on n (a multiple of 8) floats.
	scaleRoundF16 func(x *float32, n int, s float32)
	// scaleMax is ScaleMax on n (a multiple of 8, at least 8) floats.
	scaleMax func(x *float32, n int, s float32) float32
}

var (
	q8SumsAsm func(a *byte, nb int, dst *int32) // set by the platform code

	levels []*level // available on this CPU, best first; "generic" last
	cur    *level

	// batchInvariant: see SetBatchInvariant.
	batchInvariant bool
)

func init() {
	levels = append(archLevels(), &level{name: "generic"})
	cur = levels[0]
	if s := os.Getenv("SHOAL_KERNELS"); s != "" {
		if err := SetLevel(s); err != nil {
			fmt.Fprintf(os.Stderr, "shoal: SHOAL_KERNELS: %v; using %s\n", err, cur.name)
		}
	}
	if s := os.Getenv("SHOAL_BATCH_INVARIANT"); s != "" && s != "0" {
		batchInvariant = true
	}
}

// SetBatchInvariant makes MatMul and MatMuls batch-invariant (on) or not:
// when on, the value of each pair of a weight row and an activation row
// is bitwise the same whatever the other activation rows of the call
// (their number included) and however the rows are split between
// threads, the value a decode step of that one activation gives. The
// batch then runs on the decode kernels, one activation after another
// against each group of rows while it is in L1, except for the weight
// types whose tile kernels sum in the decode kernels' order (the K-quants
// under avx2); the panel kernels (one lane per row, summed over the whole
// row) are never used. A prefill costs more; decode costs the same. The
// rest of a layer (quantized activations, norms, RoPE, attention) is
// computed row by row already, so a model's logits for a sequence do not
// depend on what shares its batch. The environment variable
// SHOAL_BATCH_INVARIANT=1 sets it at start-up. It must not be called while
// kernels run.
func SetBatchInvariant(on bool) { batchInvariant = on }

// BatchInvariant reports whether products are batch-invariant (see
// SetBatchInvariant).
func BatchInvariant() bool { return batchInvariant }

// Path reports the active kernel set: "generic", "avx2", "avx512", "neon" or
// "neon-dot".
func Path() string { return cur.name }

// Levels lists the kernel sets this CPU and build can run, best first; the
// last is always "generic".
func Levels() []string {
	var s []string
	for _, l := range levels {
		s = append(s, l.name)
	}
	return s
}

// SetLevel selects a kernel set by name (one of Levels(); "" or "auto" for
// the best). The environment variable SHOAL_KERNELS does the same at start-up.
// It must not be called while kernels run.
func SetLevel(name string) error {
	if name == "" || name == "auto" {
		cur = levels[0]
		return nil
	}
	for _, l := range levels {
		if l.name == name {
			cur = l
			return nil
		}
	}
	return fmt.Errorf("kernel set %q not available here (have %s)", name, strings.Join(Levels(), ", "))
}

func kernelsFor(t quant.Type) *kset {
	if int(t) < len(cur.k) {
		return cur.k[t]
	}
	return nil
}

// auxSize is the bytes of activation data the rowsX kernels take for an
// activation row of nb 32-element blocks: 64 per pair of blocks.
func auxSize(nb int) int { return 64 * ((nb + 1) / 2) }

// auxPairs fills the activation data of the paired Q4_0/Q5_0 kernels from a
// Q8_0 row of nb blocks: per pair of blocks (b, b1), float32 [d_b d_b d_b1
// d_b1] twice and int32 [k*s_b k*s_b k*s_b1 k*s_b1] twice, s the sum of the
// block's quants.
func auxPairs(k int32) func(a []byte, nb int, aux []byte) {
	return func(a []byte, nb int, aux []byte) {
		aux = aux[:auxSize(nb)]
		f := unsafe.Slice((*float32)(unsafe.Pointer(&aux[0])), len(aux)/4)
		c := unsafe.Slice((*int32)(unsafe.Pointer(&aux[0])), len(aux)/4)
		// The block sums go to the start of aux; filling the pairs from the
		// last one back only overwrites sums already used.
		q8Sums(a, nb, c[:nb])
		for p := (nb+1)/2 - 1; p >= 0; p-- {
			b := 2 * p
			s0, d0 := k*c[b], f16(a[b*quant.BlockQ8_0:])
			var s1 int32
			var d1 float32
			if b+1 < nb {
				s1, d1 = k*c[b+1], f16(a[(b+1)*quant.BlockQ8_0:])
			}
			o := f[16*p : 16*p+16]
			o[0], o[1], o[2], o[3] = d0, d0, d1, d1
			o[4], o[5], o[6], o[7] = d0, d0, d1, d1
			q := c[16*p+8 : 16*p+16]
			q[0], q[1], q[2], q[3] = s0, s0, s1, s1
			q[4], q[5], q[6], q[7] = s0, s0, s1, s1
		}
	}
}

// q8Sums stores the sum of the quants of each of the nb Q8_0 blocks of a.
func q8Sums(a []byte, nb int, dst []int32) {
	a, dst = a[:nb*quant.BlockQ8_0], dst[:nb]
	if q8SumsAsm != nil && nb > 0 {
		q8SumsAsm(&a[0], nb, &dst[0])
		return
	}
	for b := range dst {
		var s int32
		for _, q := range a[b*quant.BlockQ8_0+2 : (b+1)*quant.BlockQ8_0] {
			s += int32(int8(q))
		}
		dst[b] = s
	}
}

// auxQ8_0 fills the activation data of the Q8_0 kernel: per pair of blocks
// float32 [d_b x4 | d_b1 x4] (and 32 unused bytes).
func auxQ8_0(a []byte, nb int, aux []byte) {
	aux = aux[:auxSize(nb)]
	clear(aux[64*(nb/2):])
	f := unsafe.Slice((*float32)(unsafe.Pointer(&aux[0])), len(aux)/4)
	for b := 0; b < nb; b++ {
		d := f16(a[b*quant.BlockQ8_0:])
		o := 16*(b/2) + 4*(b%2)
		f[o], f[o+1], f[o+2], f[o+3] = d, d, d, d
	}
}

// auxQ4_0S fills the activation data of the AVX-512 Q4_0 decode kernel: per
// block int32 [c0 c1 c2 c3], ck = −8·(the sum of quants 4k..4k+3 and
// 16+4k..16+4k+3, the ones the kernel's dword k multiplies), then the
// block's scale as float32 (32 bytes a block).
func auxQ4_0S(a []byte, nb int, aux []byte) {
	aux = aux[:32*nb]
	for b := 0; b < nb; b++ {
		q4Corr(a[b*quant.BlockQ8_0:], aux[32*b:])
		binary.LittleEndian.PutUint32(aux[32*b+16:], math.Float32bits(f16(a[b*quant.BlockQ8_0:])))
	}
}

// auxQ4_0P fills the activation data of the packed-layout Q4_0 decode
// kernel: per 4 blocks their corrections as auxQ4_0S has them (16 bytes
// each), then their scales as float32, each 4 times (128 bytes); the nb%4
// blocks after the last 4 as auxQ4_0S.
func auxQ4_0P(a []byte, nb int, aux []byte) {
	aux = aux[:32*nb]
	q := nb / 4 * 4
	for b := 0; b < q; b++ {
		o := aux[128*(b/4):]
		q4Corr(a[b*quant.BlockQ8_0:], o[16*(b%4):])
		d := math.Float32bits(f16(a[b*quant.BlockQ8_0:]))
		for i := 0; i < 4; i++ {
			binary.LittleEndian.PutUint32(o[64+16*(b%4)+4*i:], d)
		}
	}
	auxQ4_0S(a[q*quant.BlockQ8_0:], nb-q, aux[32*q:])
}

// q4Corr stores the 4 int32 corrections of the Q8_0 block at a (see
// auxQ4_0S) at dst.
func q4Corr(a, dst []byte) {
	q := a[2:quant.BlockQ8_0]
	for k := 0; k < 4; k++ {
		var s int32
		for j := 0; j < 4; j++ {
			s += int32(int8(q[4*k+j])) + int32(int8(q[16+4*k+j]))
		}
		binary.LittleEndian.PutUint32(dst[4*k:], uint32(-8*s))
	}
}
