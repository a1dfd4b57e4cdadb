package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"shoal/engine/quant"
)

// VecDot returns the dot product of one weight row of type t holding n
// elements (w, raw bytes in ggml's layout) with one activation row of n
// elements already in quant.VecDotType(t) (a, raw bytes; little-endian
// float32s when t is F32). Extra bytes after either row are ignored.
//
// It does not allocate. It panics, as on any programmer error, for a type it
// has no kernel for, for n not a multiple of t's block length, and when w or
// a is shorter than its row.
//
// Kernels per weight type (ggml's scalar versions they follow):
//
//	F32   · F32   ggml_vec_dot_f32        float32 products, float64 sum
//	F16   · F16   ggml_vec_dot_f16        likewise
//	BF16  · BF16  ggml_vec_dot_bf16       likewise
//	Q4_0  · Q8_0  ggml_vec_dot_q4_0_q8_0_generic
//	Q4_1  · Q8_1  ggml_vec_dot_q4_1_q8_1_generic
//	Q5_0  · Q8_0  ggml_vec_dot_q5_0_q8_0_generic
//	Q5_1  · Q8_1  ggml_vec_dot_q5_1_q8_1_generic
//	Q8_0  · Q8_0  ggml_vec_dot_q8_0_q8_0_generic
//	Q2_K  · Q8_K  ggml_vec_dot_q2_K_q8_K_generic
//	Q3_K  · Q8_K  ggml_vec_dot_q3_K_q8_K_generic
//	Q4_K  · Q8_K  ggml_vec_dot_q4_K_q8_K_generic
//	Q5_K  · Q8_K  ggml_vec_dot_q5_K_q8_K_generic
//	Q6_K  · Q8_K  ggml_vec_dot_q6_K_q8_K_generic
//	IQ4_NL · Q8_0 ggml_vec_dot_iq4_nl_q8_0_generic
//	IQ4_XS · Q8_K ggml_vec_dot_iq4_xs_q8_K_generic
//	IQ2_XXS · Q8_K ggml_vec_dot_iq2_xxs_q8_K_generic
//	IQ2_XS · Q8_K ggml_vec_dot_iq2_xs_q8_K_generic
//	IQ2_S · Q8_K  ggml_vec_dot_iq2_s_q8_K_generic
//	IQ3_XXS · Q8_K ggml_vec_dot_iq3_xxs_q8_K_generic
//	IQ3_S · Q8_K  ggml_vec_dot_iq3_s_q8_K_generic
//	IQ1_S · Q8_K  ggml_vec_dot_iq1_s_q8_K_generic
//	IQ1_M · Q8_K  ggml_vec_dot_iq1_m_q8_K_generic
//	Q8_1  · Q8_1  (no ggml kernel; same scheme as Q8_0 · Q8_0)
//	Q8_K  · Q8_K  (no ggml kernel; same scheme as Q8_0 · Q8_0)
func VecDot(t quant.Type, n int, w, a []byte) float32 {
	if ks := kernelsFor(t); ks != nil {
		return vecDotFast(ks, t, n, w, a)
	}
	return vecDotGeneric(t, n, w, a)
}

// vecDotFast is VecDot with the active platform kernel set.
func vecDotFast(ks *kset, t quant.Type, n int, w, a []byte) float32 {
	if bl := t.BlockLen(); bl > 1 {
		blocks(t, n, bl)
	} else if n < 0 {
		panic(fmt.Sprintf("kernels.VecDot: %v row of %d elements", t, n))
	}
	w, a = row(w, t.RowSize(n)), row(a, quant.VecDotType(t).RowSize(n))
	nb := n / ks.blockLen
	var s float32
	if nb > 0 {
		s = ks.one(&w[0], &a[0], nb)
	}
	if ks.tail && nb*ks.blockLen < n {
		s += floatTail(t, w, a, nb*ks.blockLen, n)
	}
	return s
}

// floatTail is the dot of elements [lo,hi) of two float rows of type t (F32,
// F16 or BF16 weights with activations of the same type).
func floatTail(t quant.Type, w, a []byte, lo, hi int) float32 {
	var sum float64
	switch t {
	case quant.F32:
		x, y := floats(w, hi), floats(a, hi)
		for i := lo; i < hi; i++ {
			sum += float64(x[i] * y[i])
		}
	case quant.F16:
		x, y := halves(w, hi), halves(a, hi)
		for i := lo; i < hi; i++ {
			sum += float64(quant.FP16ToFP32(x[i]) * quant.FP16ToFP32(y[i]))
		}
	case quant.BF16:
		x, y := halves(w, hi), halves(a, hi)
		for i := lo; i < hi; i++ {
			sum += float64(quant.BF16ToFP32(x[i]) * quant.BF16ToFP32(y[i]))
		}
	}
	return float32(sum)
}

// vecDotGeneric is VecDot with the generic Go kernels, whatever the level.
func vecDotGeneric(t quant.Type, n int, w, a []byte) float32 {
	switch t {
	case quant.F32:
		return dotF32Generic(n, w, a)
	case quant.F16:
		return dotF16Generic(n, w, a)
	case quant.BF16:
		return dotBF16Generic(n, w, a)
	case quant.Q4_0:
		return dotQ4_0Q8_0Generic(blocks(t, n, quant.QK), w, a)
	case quant.Q4_1:
		return dotQ4_1Q8_1Generic(blocks(t, n, quant.QK), w, a)
	case quant.Q5_0:
		return dotQ5_0Q8_0Generic(blocks(t, n, quant.QK), w, a)
	case quant.Q5_1:
		return dotQ5_1Q8_1Generic(blocks(t, n, quant.QK), w, a)
	case quant.Q8_0:
		return dotQ8_0Q8_0Generic(blocks(t, n, quant.QK), w, a)
	case quant.Q8_1:
		return dotQ8_1Q8_1Generic(blocks(t, n, quant.QK), w, a)
	case quant.Q2_K:
		return dotQ2_KQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.Q3_K:
		return dotQ3_KQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.Q4_K:
		return dotQ4_KQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.Q5_K:
		return dotQ5_KQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.Q6_K:
		return dotQ6_KQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.Q8_K:
		return dotQ8_KQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ4_NL:
		return dotIQ4_NLQ8_0Generic(blocks(t, n, quant.QK), w, a)
	case quant.MXFP4:
		return dotMXFP4Q8_0Generic(blocks(t, n, quant.QK), w, a)
	case quant.IQ4_XS:
		return dotIQ4_XSQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ2_XXS:
		return dotIQ2_XXSQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ2_XS:
		return dotIQ2_XSQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ2_S:
		return dotIQ2_SQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ3_XXS:
		return dotIQ3_XXSQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ3_S:
		return dotIQ3_SQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ1_S:
		return dotIQ1_SQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	case quant.IQ1_M:
		return dotIQ1_MQ8_KGeneric(blocks(t, n, quant.QKK), w, a)
	}
	panic(fmt.Sprintf("kernels.VecDot: no kernel for %v", t))
}

func blocks(t quant.Type, n, bl int) int {
	if n < 0 || n%bl != 0 {
		panic(fmt.Sprintf("kernels.VecDot: %v row of %d elements is not whole blocks", t, n))
	}
	return n / bl
}

// row returns b[:size], panicking when b is shorter (reslicing alone would
// only check against the capacity).
func row(b []byte, size int) []byte {
	if len(b) < size {
		panic(fmt.Sprintf("kernels.VecDot: row of %d bytes, need %d", len(b), size))
	}
	return b[:size]
}

// f16 reads the half float at the start of b.
func f16(b []byte) float32 { return quant.FP16ToFP32(binary.LittleEndian.Uint16(b)) }

// f32 reads the little-endian float32 at the start of b.
func f32(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

// ---- float rows

func floats(b []byte, n int) []float32 {
	if n <= 0 {
		return nil
	}
	b = row(b, 4*n)
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

func halves(b []byte, n int) []uint16 {
	if n <= 0 {
		return nil
	}
	b = row(b, 2*n)
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
}

func dotF32Generic(n int, w, a []byte) float32 {
	x, y := floats(w, n), floats(a, n)
	y = y[:len(x)]
	var sum float64
	for i, v := range x {
		sum += float64(v * y[i])
	}
	return float32(sum)
}

func dotF16Generic(n int, w, a []byte) float32 {
	x, y := halves(w, n), halves(a, n)
	y = y[:len(x)]
	var sum float64
	for i, v := range x {
		sum += float64(quant.FP16ToFP32(v) * quant.FP16ToFP32(y[i]))
	}
	return float32(sum)
}

func dotBF16Generic(n int, w, a []byte) float32 {
	x, y := halves(w, n), halves(a, n)
	y = y[:len(x)]
	var sum float64
	for i, v := range x {
		sum += float64(quant.BF16ToFP32(v) * quant.BF16ToFP32(y[i]))
	}
	return float32(sum)
}
