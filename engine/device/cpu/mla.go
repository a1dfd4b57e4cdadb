package cpu

import (
	"shoal/engine/device"
	"shoal/engine/kernels"
)

// mlaState is what a range of a multi-head latent attention model keeps
// beside the common scratch: per layer and held head, views of attn_k_b's
// and attn_v_b's rows, and the batch's intermediate rows.
type mlaState struct {
	kb, vb [][]*kernels.Matrix // [layer-Lo][head]
	mq     []float32           // [n][held heads][Nope+RopeDim]: attn_q's output
	qa     []float32           // [n][QLora]: attn_q_a's output, normed
	hin    []float32           // one head's rows in: [n][max(Nope, KVLora)]
	hout   []float32           // one head's rows out: [n][KVLora]
	vo     []float32           // [n][held heads][VDim]: attn_output's input
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
	r.mla = st
	r.mlaPrepFn = r.mlaPrepRange
}

// beginMLA sizes the MLA scratch for n tokens.
func (r *Range) beginMLA(n int) {
	m, st := r.sp.MLA, r.mla
	qh := m.QHeadDim(r.sp.RopeDim)
	st.mq = Grow(st.mq, n*r.nh*qh)
	st.qa = Grow(st.qa, n*m.QLora)
	st.hin = Grow(st.hin, n*max(m.Nope, m.KVLora))
	st.hout = Grow(st.hout, n*m.KVLora)
	st.vo = Grow(st.vo, n*r.nh*m.VDim)
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
		qh, D, Lr := m.QHeadDim(r.sp.RopeDim), r.sp.HeadDim, m.KVLora
		if ly.WqA != nil {
			r.matmul(ly.WqA, s.xn, n, st.qa)
			for i := 0; i < n; i++ {
				q := st.qa[i*m.QLora : (i+1)*m.QLora]
				RMSNorm(q, q, ly.QANorm, r.sp.RMSEps)
			}
			r.matmul(ly.WqB, st.qa, n, st.mq)
		} else {
			r.matmul(ly.Wq, s.xn, n, st.mq)
		}
		r.matmul(ly.WkvA, s.xn, n, s.k)
		// the absorbed queries: q_nope·attn_k_b per head
		for h := 0; h < r.nh; h++ {
			for i := 0; i < n; i++ {
				src := st.mq[(i*r.nh+h)*qh:]
				copy(st.hin[i*m.Nope:(i+1)*m.Nope], src[:m.Nope])
			}
			r.matmul(st.kb[i0][h], st.hin, n, st.hout)
			for i := 0; i < n; i++ {
				copy(s.q[i*r.qd+h*D:i*r.qd+h*D+Lr], st.hout[i*Lr:(i+1)*Lr])
			}
		}
		r.cur = l
		r.pool.Run(n, 1, r.mlaPrepFn)
		r.attention(n)
		// per head, the latent output through attn_v_b
		V := m.VDim
		for h := 0; h < r.nh; h++ {
			for i := 0; i < n; i++ {
				copy(st.hin[i*Lr:(i+1)*Lr], s.att[i*r.qd+h*D:i*r.qd+h*D+Lr])
			}
			r.matmul(st.vb[i0][h], st.hin, n, st.hout)
			for i := 0; i < n; i++ {
				copy(st.vo[(i*r.nh+h)*V:(i*r.nh+h+1)*V], st.hout[i*V:(i+1)*V])
			}
		}
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
