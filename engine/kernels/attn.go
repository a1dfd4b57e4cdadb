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

// ScoresF16 sets out[t] = q · k[t*stride : t*stride+len(q)] for t <
// len(out): one query against a run of half-float key rows stride elements
// apart (the rows of one KV head in a cache block). The products are
// summed in float32.
func ScoresF16(out, q []float32, k []uint16, stride int) {
	T, d := len(out), len(q)
	if T == 0 || d == 0 {
		clear(out)
		return
	}
	_ = k[(T-1)*stride+d-1]
	if f := cur.scoresF16; f != nil && d%8 == 0 {
		f(&q[0], &k[0], 2*stride, d, T, &out[0])
		return
	}
	for t := range out {
		row := k[t*stride : t*stride+d]
		var s float32
		for i, v := range row {
			s += q[i] * quant.FP16ToFP32(v)
		}
		out[t] = s
	}
}

// AccumF16 adds p[t] · v[t*stride : t*stride+len(acc)] to acc for t <
// len(p): the probability-weighted sum of a run of half-float value rows.
func AccumF16(acc, p []float32, v []uint16, stride int) {
	T, d := len(p), len(acc)
	if T == 0 || d == 0 {
		return
	}
	_ = v[(T-1)*stride+d-1]
	if f := cur.accumF16; f != nil && d%8 == 0 {
		f(&acc[0], &p[0], &v[0], 2*stride, d, T)
		return
	}
	for t, w := range p {
		row := v[t*stride : t*stride+d]
		for i, x := range row {
			acc[i] += w * quant.FP16ToFP32(x)
		}
	}
}
