package kernels

import "shoal/engine/quant"

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
