package cpu

import (
	"shoal/engine/device"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// mlaState is what a range of a multi-head latent attention model keeps
// beside the common scratch: per layer and held head, views of attn_k_b's
// and attn_v_b's rows, and the batch's intermediate rows.
//
// The per-head products (attn_k_b, attn_v_b) are small; the pool's
// threads take whole heads, each running its heads' products alone (solo:
// a pool of one thread runs them inline), so a decode step meets the
// threads twice per layer instead of four times per head.
type mlaState struct {
	kb, vb [][]*kernels.Matrix // [layer-Lo][head]
	mq     []float32           // [n][held heads][Nope+RopeDim]: attn_q's output
	qa     []float32           // [n][QLora]: attn_q_a's output, normed
	vo     []float32           // [n][held heads][VDim]: attn_output's input
	solo   []*kernels.Pool     // per worker
	work   []mlaWork           // per worker
	layer  int                 // the current layer, local index
	n      int                 // the batch's tokens
	kbFn   func(w, lo, hi int)
	vbFn   func(w, lo, hi int)
}

// mlaWork is one worker's rows for a head's product.
type mlaWork struct {
	hin  []float32 // [n][max(Nope, KVLora)]
	hout []float32 // [n][KVLora]
	acts []byte    // hin in the matrix's activation format
}

// initMLA takes the per-head views of the layers' attn_k_b and attn_v_b.
func (r *Range) initMLA() {
	m := r.sp.MLA
	st := &mlaState{kb: make([][]*kernels.Matrix, len(r.ld.Layers)), vb: make([][]*kernels.Matrix, len(r.ld.Layers))}
	for i := range r.ld.Layers {
		ly := &r.ld.Layers[i]
		if r.nh == 0 || ly.WkB == nil || ly.WvB == nil {
			continue
		}
		for h := 0; h < r.nh; h++ {
			st.kb[i] = append(st.kb[i], ly.WkB.Slice(h*m.KVLora, (h+1)*m.KVLora))
			st.vb[i] = append(st.vb[i], ly.WvB.Slice(h*m.VDim, (h+1)*m.VDim))
		}
	}
	st.solo = make([]*kernels.Pool, r.pool.Threads())
	for i := range st.solo {
		st.solo[i] = kernels.NewPool(1)
	}
	st.work = make([]mlaWork, r.pool.Threads())
	st.kbFn, st.vbFn = r.mlaAbsorb, r.mlaValues
	r.mla = st
	r.mlaPrepFn = r.mlaPrepRange
}

// beginMLA sizes the MLA scratch for n tokens.
func (r *Range) beginMLA(n int) {
	m, st := r.sp.MLA, r.mla
	qh := m.QHeadDim(r.sp.RopeDim)
	st.mq = Grow(st.mq, n*r.nh*qh)
	st.qa = Grow(st.qa, n*m.QLora)
	st.vo = Grow(st.vo, n*r.nh*m.VDim)
	w := max(m.Nope, m.KVLora)
	for i := range st.work {
		wk := &st.work[i]
		wk.hin = Grow(wk.hin, n*w)
		wk.hout = Grow(wk.hout, n*m.KVLora)
		wk.acts = Grow(wk.acts, n*quant.F32.RowSize(w))
	}
}

// headProduct runs out = W·in for n rows on worker w alone.
func (st *mlaState) headProduct(w int, m *kernels.Matrix, in []float32, n int, out []float32) {
	wk := &st.work[w]
	kernels.QuantizeActs(st.solo[w], m.ActType(), in, n, m.Cols, wk.acts)
	kernels.MatMul(st.solo[w], m, wk.acts, n, out, m.Rows)
}

// mlaAbsorb runs heads [lo,hi) of the absorbed queries on worker w: the
// non-rotated part of each token's query through attn_k_b, into the
// first KVLora values of the head's query row.
func (r *Range) mlaAbsorb(w, lo, hi int) {
	s, m, st := &r.s, r.sp.MLA, r.mla
	qh, D, Lr, n := m.QHeadDim(r.sp.RopeDim), r.sp.HeadDim, m.KVLora, st.n
	wk := &st.work[w]
	for h := lo; h < hi; h++ {
		for i := 0; i < n; i++ {
			src := st.mq[(i*r.nh+h)*qh:]
			copy(wk.hin[i*m.Nope:(i+1)*m.Nope], src[:m.Nope])
		}
		st.headProduct(w, st.kb[st.layer][h], wk.hin, n, wk.hout)
		for i := 0; i < n; i++ {
			copy(s.q[i*r.qd+h*D:i*r.qd+h*D+Lr], wk.hout[i*Lr:(i+1)*Lr])
		}
	}
}

// mlaValues runs heads [lo,hi) of the attention's output on worker w:
// each token's latent output through attn_v_b, into attn_output's input.
func (r *Range) mlaValues(w, lo, hi int) {
	s, m, st := &r.s, r.sp.MLA, r.mla
	D, Lr, V, n := r.sp.HeadDim, m.KVLora, m.VDim, st.n
	wk := &st.work[w]
	for h := lo; h < hi; h++ {
		for i := 0; i < n; i++ {
			copy(wk.hin[i*Lr:(i+1)*Lr], s.att[i*r.qd+h*D:i*r.qd+h*D+Lr])
		}
		st.headProduct(w, st.vb[st.layer][h], wk.hin, n, wk.hout)
		for i := 0; i < n; i++ {
			copy(st.vo[(i*r.nh+h)*V:(i*r.nh+h+1)*V], wk.hout[i*V:(i+1)*V])
		}
	}
}

// mlaAttention is Attention for multi-head latent attention, absorbed as
// llama.cpp computes it: the queries from attn_q (or attn_q_a, its norm and
// attn_q_b); the latent and the shared rotated key from attn_kv_a_mqa, the
// latent normed, both cached as one row; per head, the query's non-rotated
// part through attn_k_b joins its rotated part; attention over the cached
// rows (values: their latent part); per head, the output through attn_v_b;
// then attn_output.
func (r *Range) mlaAttention(l int, ly *device.Layer, out []float32) (bool, error) {
	s, m, st := &r.s, r.sp.MLA, r.mla
	n, i0 := s.n, l-r.ld.Lo
	if r.nh > 0 {
		// the queries' first product and the latent's share the normed
		// input: quantized once, their products one pool job
		first, firstOut := ly.Wq, st.mq
		if ly.WqA != nil {
			first, firstOut = ly.WqA, st.qa
		}
		if t := first.ActType(); ly.WkvA.ActType() == t {
			kernels.QuantizeActs(r.pool, t, s.xn, n, first.Cols, s.acts)
			kernels.MatMuls(r.pool, s.acts, n, []*kernels.Matrix{first, ly.WkvA}, [][]float32{firstOut, s.k})
		} else {
			r.matmul(first, s.xn, n, firstOut)
			r.matmul(ly.WkvA, s.xn, n, s.k)
		}
		if ly.WqA != nil {
			for i := 0; i < n; i++ {
				q := st.qa[i*m.QLora : (i+1)*m.QLora]
				RMSNorm(q, q, ly.QANorm, r.sp.RMSEps)
			}
			r.matmul(ly.WqB, st.qa, n, st.mq)
		}
		// the absorbed queries: q_nope·attn_k_b per head
		st.layer, st.n = i0, n
		r.pool.RunWorker(r.nh, 1, st.kbFn)
		r.cur = l
		r.pool.Run(n, 1, r.mlaPrepFn)
		r.attention(n)
		// per head, the latent output through attn_v_b
		r.pool.RunWorker(r.nh, 1, st.vbFn)
	}
	return r.project(ly.Wo, ly.WoGather, st.vo, n, r.tpCols(false), out)
}

// mlaPrepRange, for tokens [a,z) of the current layer: norms the latent,
// rotates the shared key and each held head's query part, and caches the
// row (latent, rotated key).
func (r *Range) mlaPrepRange(a, z int) {
	sp, s, m, st := r.sp, &r.s, r.sp.MLA, r.mla
	ly := r.layer(r.cur)
	qh, D, Lr, R, half := m.QHeadDim(sp.RopeDim), sp.HeadDim, m.KVLora, sp.RopeDim, sp.RopeDim/2
	for i := a; i < z; i++ {
		k := s.k[i*D : (i+1)*D]
		RMSNorm(k[:Lr], k[:Lr], ly.KVANorm, sp.RMSEps)
		cos, sin := s.cos[i*half:(i+1)*half], s.sin[i*half:(i+1)*half]
		Rope(k[Lr:], 1, R, R, sp.Rope, cos, sin)
		for h := 0; h < r.nh; h++ {
			pe := s.q[i*r.qd+h*D+Lr : i*r.qd+(h+1)*D]
			copy(pe, st.mq[(i*r.nh+h)*qh+m.Nope:(i*r.nh+h+1)*qh])
			Rope(pe, 1, R, R, sp.Rope, cos, sin)
		}
		r.store.Put(r.cur-r.ld.Lo, s.blocks[s.tokSeq[i]], int(s.tokPos[i]), k, nil)
	}
}
