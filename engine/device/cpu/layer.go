package cpu

import (
	"shoal/engine/device"
	"shoal/engine/kernels"
)

// Attention implements device.Range.
func (r *Range) Attention(l int, x, out []float32) (bool, error) {
	s, ly := &r.s, r.layer(l)
	n := s.n
	r.norm(x, ly.AttnNorm)
	if r.mla != nil {
		return r.mlaAttention(l, ly, out)
	}
	if r.nh > 0 {
		if t := ly.Wq.ActType(); ly.Wk.ActType() == t && ly.Wv.ActType() == t {
			kernels.QuantizeActs(r.pool, t, s.xn, n, ly.Wq.Cols, s.acts)
			kernels.MatMuls(r.pool, s.acts, n, []*kernels.Matrix{ly.Wq, ly.Wk, ly.Wv}, [][]float32{s.q, s.k, s.v})
		} else {
			r.qkvApart(ly, n)
		}
		r.cur = l
		r.pool.Run(n, 1, r.prepFn)
		r.attention(n)
	}
	return r.project(ly.Wo, ly.WoGather, s.att, n, r.tpCols(false), out)
}

// FFN implements device.Range.
func (r *Range) FFN(l int, x, out []float32) (bool, error) {
	s, ly := &r.s, r.layer(l)
	n := s.n
	r.norm(x, ly.FFNNorm)
	if ly.Router != nil {
		return r.moe(ly, out)
	}
	cols := r.tpCols(true)
	if r.tp != nil && r.sp.IsMoE() {
		cols = r.tp.DenseCols // a leading dense layer of a MoE model
	}
	r.swiglu(ly.Gate, ly.Up, s.xn, n, s.g, s.u)
	return r.project(ly.Down, ly.DownGather, s.g, n, cols, out)
}

// norm writes the batch's rows of x RMS-normalized with weights w to s.xn.
func (r *Range) norm(x, w []float32) {
	s, E := &r.s, r.sp.NEmbd
	for i := 0; i < s.n; i++ {
		RMSNorm(s.xn[i*E:(i+1)*E], x[i*E:(i+1)*E], w, r.sp.RMSEps)
	}
}

// qkvApart computes a layer's q, k and v projections one at a time, for
// matrices that take different activation formats (sharing the quantized
// activations where they agree).
func (r *Range) qkvApart(ly *device.Layer, n int) {
	s := &r.s
	r.matmul(ly.Wq, s.xn, n, s.q)
	if ly.Wk.ActType() == ly.Wq.ActType() {
		r.matmulQ(ly.Wk, n, s.k)
	} else {
		r.matmul(ly.Wk, s.xn, n, s.k)
	}
	if ly.Wv.ActType() == ly.Wk.ActType() {
		r.matmulQ(ly.Wv, n, s.v)
	} else {
		r.matmul(ly.Wv, s.xn, n, s.v)
	}
}

// project computes out = W·in ([n][NEmbd]) for this member's part of a
// matrix split by input columns. With a column slice (or on one member), in
// holds the member's columns and out its product, partial (the caller
// all-reduces it over the group). Gathered (gather), the members' inputs
// (cols[p] values per token from member p) are all-gathered, W holds this
// member's output rows, and their products are all-gathered into out,
// complete. A nil W (nothing held) contributes zeros.
func (r *Range) project(w *kernels.Matrix, gather bool, in []float32, n int, cols []int, out []float32) (partial bool, err error) {
	E := r.sp.NEmbd
	if !gather {
		if w == nil {
			clear(out[:n*E])
		} else {
			r.matmul(w, in, n, out)
		}
		return true, nil
	}
	t := r.tp
	total := 0
	for _, c := range cols {
		total += c
	}
	t.full = Grow(t.full, n*total)
	if err := r.gatherRows(in, n, cols, t.full); err != nil {
		return false, err
	}
	rows := t.OutRows[t.coll.Rank()]
	t.part = Grow(t.part, n*rows)
	if w != nil {
		r.matmul(w, t.full, n, t.part)
	}
	return false, r.gatherRows(t.part, n, t.OutRows, out)
}

// prepRange adds biases, applies q/k norms and RoPE, and stores K and V in
// the cache for tokens [a,z) of the current layer (the member's heads).
func (r *Range) prepRange(a, z int) {
	m, s := r.sp, &r.s
	ly := r.layer(r.cur)
	Q, KV, D, half := r.qd, r.kvd, m.HeadDim, m.RopeDim/2
	for i := a; i < z; i++ {
		q, k, v := s.q[i*Q:(i+1)*Q], s.k[i*KV:(i+1)*KV], s.v[i*KV:(i+1)*KV]
		AddBias(q, ly.Bq)
		AddBias(k, ly.Bk)
		AddBias(v, ly.Bv)
		if ly.QNorm != nil {
			for h := 0; h < r.nh; h++ {
				RMSNorm(q[h*D:(h+1)*D], q[h*D:(h+1)*D], ly.QNorm, m.RMSEps)
			}
			for h := 0; h < r.nkv; h++ {
				RMSNorm(k[h*D:(h+1)*D], k[h*D:(h+1)*D], ly.KNorm, m.RMSEps)
			}
		}
		cos, sin := s.cos[i*half:(i+1)*half], s.sin[i*half:(i+1)*half]
		if r.swaRope != nil && m.SWA(r.cur) {
			cos, sin = s.cosL[i*half:(i+1)*half], s.sinL[i*half:(i+1)*half]
		}
		Rope(q, r.nh, D, m.RopeDim, m.Rope, cos, sin)
		Rope(k, r.nkv, D, m.RopeDim, m.Rope, cos, sin)
		r.store.Put(r.cur-r.ld.Lo, s.blocks[s.tokSeq[i]], int(s.tokPos[i]), k, v)
	}
}

// swiglu computes g = silu(gate·x) * up·x (gelu with Spec.GELU) for n rows
// of x (nothing when the member holds no FFN columns).
func (r *Range) swiglu(gate, up *kernels.Matrix, x []float32, n int, g, u []float32) {
	if gate == nil {
		return
	}
	F := gate.Rows
	if t := gate.ActType(); up.ActType() == t {
		kernels.QuantizeActs(r.pool, t, x, n, gate.Cols, r.s.acts)
		kernels.MatMuls(r.pool, r.s.acts, n, []*kernels.Matrix{gate, up}, [][]float32{g, u})
	} else {
		r.matmul(gate, x, n, g)
		r.matmul(up, x, n, u)
	}
	if r.sp.GELU {
		kernels.GELUMul(g[:n*F], u[:n*F])
	} else {
		kernels.SiLUMul(g[:n*F], u[:n*F])
	}
}

// ffn computes out = down(silu(gate·x) * up·x) for n rows of x.
func (r *Range) ffn(gate, up, down *kernels.Matrix, x []float32, n int, g, u, out []float32) {
	r.swiglu(gate, up, x, n, g, u)
	r.matmul(down, g, n, out)
}
