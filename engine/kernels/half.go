package kernels

import "shoal/engine/quant"

// F32ToF16 writes the half-precision bits of src[i] to dst[i], rounding to
// nearest even: quant.FP32ToFP16 element by element (F16C's VCVTPS2PH on
// amd64). It converts F16 activations and the rows written to the F16 KV
// cache.
func F32ToF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	if f := cur.f32ToF16; f != nil {
		if n := len(src) &^ 7; n > 0 {
			f(&dst[0], &src[0], n)
			dst, src = dst[n:], src[n:]
		}
	}
	for i, v := range src {
		dst[i] = quant.FP32ToFP16(v)
	}
}

// F16ToF32 writes the float32 value of the half-precision bits src[i] to
// dst[i] (exact): quant.FP16ToFP32 element by element (F16C's VCVTPH2PS
// on amd64). It decodes F16 payloads off the wire.
func F16ToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	if f := cur.f16ToF32; f != nil {
		if n := len(src) &^ 7; n > 0 {
			f(&dst[0], &src[0], n)
			dst, src = dst[n:], src[n:]
		}
	}
	for i, h := range src {
		dst[i] = quant.FP16ToFP32(h)
	}
}

// RoundF16 rounds every x[i] to the nearest half-precision value (ties to
// even), in place.
func RoundF16(x []float32) {
	if f := cur.roundF16; f != nil {
		if n := len(x) &^ 7; n > 0 {
			f(&x[0], n)
			x = x[n:]
		}
	}
	for i, v := range x {
		x[i] = quant.FP16ToFP32(quant.FP32ToFP16(v))
	}
}

// ScaleRoundF16 sets x[i] to x[i]·s (a float32 product) rounded to half
// precision: RoundF16 after scaling, in one pass.
func ScaleRoundF16(x []float32, s float32) {
	if f := cur.scaleRoundF16; f != nil {
		if n := len(x) &^ 7; n > 0 {
			f(&x[0], n, s)
			x = x[n:]
		}
	}
	for i, v := range x {
		x[i] = quant.FP16ToFP32(quant.FP32ToFP16(v * s))
	}
}
