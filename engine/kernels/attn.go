package kernels

import (
	"unsafe"

	"shoal/engine/quant"
)

// F16Bytes views a slice of half floats as bytes (for VecDot with F16).
func F16Bytes(h []uint16) []byte {
	if len(h) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 2*len(h))
}

// DotF16 is the dot product of two half-float vectors of equal length.
func DotF16(a, b []uint16) float32 {
	return VecDot(quant.F16, len(a), F16Bytes(a), F16Bytes(b))
}

// AxpyF16 adds alpha·x to y, x in half floats (len(x) >= len(y)).
func AxpyF16(y []float32, alpha float32, x []uint16) {
	x = x[:len(y)]
	if k := cur.axpyF16; k != nil {
		if n := len(y) &^ 7; n > 0 {
			k(&y[0], alpha, &x[0], n)
			y, x = y[n:], x[n:]
		}
	}
	axpyF16Generic(y, alpha, x)
}

func axpyF16Generic(y []float32, alpha float32, x []uint16) {
	x = x[:len(y)]
	i := 0
	for ; i+4 <= len(y); i += 4 {
		y[i] += alpha * quant.FP16ToFP32(x[i])
		y[i+1] += alpha * quant.FP16ToFP32(x[i+1])
		y[i+2] += alpha * quant.FP16ToFP32(x[i+2])
		y[i+3] += alpha * quant.FP16ToFP32(x[i+3])
	}
	for ; i < len(y); i++ {
		y[i] += alpha * quant.FP16ToFP32(x[i])
	}
}
