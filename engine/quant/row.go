package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Byte layouts of the blocks, as the structs in ggml's ggml-common.h. All
// multi-byte fields are little-endian; "f16" is an IEEE half float.
const (
	// block_q4_0: f16 d | qs[16]
	BlockQ4_0 = 18
	// block_q4_1: f16 d | f16 m | qs[16]
	BlockQ4_1 = 20
	// block_q5_0: f16 d | qh[4] | qs[16]
	BlockQ5_0 = 22
	// block_q5_1: f16 d | f16 m | qh[4] | qs[16]
	BlockQ5_1 = 24
	// block_q8_0: f16 d | int8 qs[32]
	BlockQ8_0 = 34
	// block_q8_1: f16 d | f16 s (= d * sum(qs)) | int8 qs[32]
	BlockQ8_1 = 36
	// block_q2_K: scales[16] | qs[64] | f16 d | f16 dmin
	BlockQ2_K = 84
	// block_q3_K: hmask[32] | qs[64] | scales[12] | f16 d
	BlockQ3_K = 110
	// block_q4_K: f16 d | f16 dmin | scales[12] | qs[128]
	BlockQ4_K = 144
	// block_q5_K: f16 d | f16 dmin | scales[12] | qh[32] | qs[128]
	BlockQ5_K = 176
	// block_q6_K: ql[128] | qh[64] | int8 scales[16] | f16 d
	BlockQ6_K = 210
	// block_q8_K: f32 d | int8 qs[256] | int16 bsums[16]
	BlockQ8_K = 292
)

// VecDotType is the format ggml's CPU backend quantizes activations to before a
// matrix product with weights of type t (type_traits_cpu[t].vec_dot_type).
// Q8_1 and Q8_K, which ggml has no weight kernels for, map to themselves.
// It panics for a type without a dot product.
func VecDotType(t Type) Type {
	switch t {
	case F32, F16, BF16:
		return t
	case Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4:
		return Q8_0
	case Q4_1, Q5_1, Q8_1:
		return Q8_1
	case Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
		IQ1_S, IQ1_M:
		return Q8_K
	}
	panic(fmt.Sprintf("quant: no vec_dot type for %v", t))
}

// Supported reports whether DequantizeRow and QuantizeRow handle t.
func Supported(t Type) bool {
	_, block := blockCodecs[t]
	return block || t == F32 || t == F16 || t == BF16
}

// checkRow panics unless t is supported, n is a whole number of blocks and raw
// holds exactly t.RowSize(n) bytes.
func checkRow(op string, t Type, n, raw int) {
	if !Supported(t) {
		panic(fmt.Sprintf("quant.%s: unsupported type %v", op, t))
	}
	if err := t.CheckRow(n); err != nil {
		panic("quant." + op + ": " + err.Error())
	}
	if want := t.RowSize(n); raw != want {
		panic(fmt.Sprintf("quant.%s: %v row of %d elements takes %d bytes, got %d", op, t, n, want, raw))
	}
}

// DequantizeRow decodes len(dst) elements of type t from src into dst, with the
// arithmetic of ggml's dequantize_row_* (and of its fp16/bf16 conversions).
//
// It panics, as on any programmer error, if t is not Supported, if len(dst)
// is not a multiple of t.BlockLen() or if len(src) != t.RowSize(len(dst)).
func DequantizeRow(t Type, src []byte, dst []float32) {
	checkRow("DequantizeRow", t, len(dst), len(src))
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = FP16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		dequant, bs, bl := blockCodecs[t].dequant, t.BlockSize(), t.BlockLen()
		for i := range len(dst) / bl {
			dequant(src[i*bs:(i+1)*bs], dst[i*bl:(i+1)*bl])
		}
	}
}

// QuantizeRow encodes the len(src) elements of src as type t into dst, with
// the algorithms of ggml's reference quantizers quantize_row_*_ref (no
// importance matrix; this is what llama-quantize does without --imatrix).
// F16 and BF16 round to nearest even. The i-quants (IQ4_NL, IQ4_XS, the IQ1,
// IQ2 and IQ3 types) are the exception: their quantizers are shoal's own
// (see iquants.go, iqbook.go and iq1.go), not ggml's.
//
// It panics, as on any programmer error, if t is not Supported, if len(src)
// is not a multiple of t.BlockLen() or if len(dst) != t.RowSize(len(src)).
func QuantizeRow(t Type, src []float32, dst []byte) {
	checkRow("QuantizeRow", t, len(src), len(dst))
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToFP16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToBF16(v))
		}
	default:
		quant, bs, bl := blockCodecs[t].quant, t.BlockSize(), t.BlockLen()
		for i := range len(src) / bl {
			quant(src[i*bl:(i+1)*bl], dst[i*bs:(i+1)*bs])
		}
	}
}

// blockCodec is a block type's decoder (ggml's dequantize_row_*) and
// reference encoder (quantize_row_*_ref), one block at a time.
type blockCodec struct {
	dequant func(b []byte, y []float32)
	quant   func(x []float32, b []byte)
}

var blockCodecs = map[Type]blockCodec{
	Q4_0:    {dequantQ4_0, quantQ4_0},
	Q4_1:    {dequantQ4_1, quantQ4_1},
	Q5_0:    {dequantQ5_0, quantQ5_0},
	Q5_1:    {dequantQ5_1, quantQ5_1},
	Q8_0:    {dequantQ8_0, quantQ8_0},
	Q8_1:    {dequantQ8_1, quantQ8_1},
	Q2_K:    {dequantQ2_K, quantQ2_K},
	Q3_K:    {dequantQ3_K, quantQ3_K},
	Q4_K:    {dequantQ4_K, quantQ4_K},
	Q5_K:    {dequantQ5_K, quantQ5_K},
	Q6_K:    {dequantQ6_K, quantQ6_K},
	Q8_K:    {dequantQ8_K, quantQ8_K},
	IQ4_NL:  {dequantIQ4_NL, quantIQ4_NL},
	IQ4_XS:  {dequantIQ4_XS, quantIQ4_XS},
	IQ2_XXS: {dequantIQ2_XXS, quantIQ2_XXS},
	IQ2_XS:  {dequantIQ2_XS, quantIQ2_XS},
	IQ2_S:   {dequantIQ2_S, quantIQ2_S},
	IQ3_XXS: {dequantIQ3_XXS, quantIQ3_XXS},
	IQ3_S:   {dequantIQ3_S, quantIQ3_S},
	IQ1_S:   {dequantIQ1_S, quantIQ1_S},
	IQ1_M:   {dequantIQ1_M, quantIQ1_M},
	MXFP4:   {dequantMXFP4, quantMXFP4},
}

// f16 reads the half float at b[off:off+2].
func f16(b []byte, off int) float32 {
	return FP16ToFP32(binary.LittleEndian.Uint16(b[off:]))
}

// putF16 stores v at b[off:off+2] rounded to a half float.
func putF16(b []byte, off int, v float32) {
	binary.LittleEndian.PutUint16(b[off:], FP32ToFP16(v))
}
