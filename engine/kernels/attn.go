package kernels

import (
	"unsafe"

	"shoal/engine/quant"
)

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

// ScoresQ sets out[t] to the dot product of a query head, qq (d values in
// t's activation format, quant.VecDotType), with the key rows of a
// quantized cache, d values of type kt each, stride words apart in k (the
// rows of one KV head in a cache block).
func ScoresQ(out []float32, kt quant.Type, d int, qq []byte, k []uint16, stride int) {
	if len(out) == 0 {
		return
	}
	n := kt.RowSize(d)
	b := WordBytes(k)
	_ = b[2*(len(out)-1)*stride+n-1]
	if ks := kernelsFor(kt); ks != nil && ks.one != nil && d%ks.blockLen == 0 {
		// the platform's one-row kernel, without VecDot's checks per row
		nb := d / ks.blockLen
		for t := range out {
			out[t] = ks.one(&b[2*t*stride], &qq[0], nb)
		}
		return
	}
	for t := range out {
		out[t] = VecDot(kt, d, b[2*t*stride:2*t*stride+n], qq)
	}
}

// AccumQ adds p[t] times value row t (len(acc) values of type vt, Q8_0 or
// Q4_0, stride words apart in v) to acc; tmp holds a dequantized row where
// the platform has no kernel for vt.
func AccumQ(acc, p []float32, vt quant.Type, v []uint16, stride int, tmp []float32) {
	d, T := len(acc), len(p)
	if T == 0 || d == 0 {
		return
	}
	n := vt.RowSize(d)
	b := WordBytes(v)
	_ = b[2*(T-1)*stride+n-1]
	if f := accumQFor(vt); f != nil && d%32 == 0 {
		f(&acc[0], &p[0], &b[0], 2*stride, d, T)
		return
	}
	tmp = tmp[:d]
	for t, w := range p {
		quant.DequantizeRow(vt, b[2*t*stride:2*t*stride+n], tmp)
		for i, x := range tmp {
			acc[i] += w * x
		}
	}
}

// accumQFor is the platform's AccumQ kernel for vt, or nil.
func accumQFor(vt quant.Type) func(acc, p *float32, v *byte, stride, d, T int) {
	switch vt {
	case quant.Q8_0:
		return cur.accumQ8_0
	case quant.Q4_0:
		return cur.accumQ4_0
	}
	return nil
}

// WordBytes is the memory of w as bytes (little-endian words: a quantized
// cache row's blocks).
func WordBytes(w []uint16) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 2*len(w))
}
