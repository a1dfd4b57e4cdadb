package cpu

import (
	"math"

	"shoal/engine/kernels"
	"shoal/engine/kv"
	"shoal/engine/quant"
)

// attnScratch is one worker's space for the query heads of a KV head:
// head j's scores at j·ctx, its query and sums at j·HeadDim.
type attnScratch struct {
	ctx    int
	scores []float32
	qh     []float32
	acc    []float32
	qq     []byte    // the query heads in Q8_0, for a quantized cache
	vrow   []float32 // one value row, dequantized
}

// attention runs the attention of the batch's n tokens. A job is a token
// and a KV head, with all the query heads that share it (or a part of
// them, when there would otherwise be fewer jobs than twice the threads):
// each block of keys and values is read from memory once and then from L1
// for the other heads, instead of once per query head.
func (r *Range) attention(n int) {
	group := r.sp.NHead / r.sp.NHeadKV
	r.attnParts = 1
	if jobs := n * r.nkv; jobs < 2*r.pool.Threads() {
		r.attnParts = min(group, (2*r.pool.Threads()+jobs-1)/jobs)
	}
	r.pool.RunWorker(n*r.nkv*r.attnParts, 1, r.attnFn)
}

// attnRange runs attention jobs [a,z) (see attention) on worker w: per
// query head, softmax(q·K/√D)·V over the token's context, in float32 with
// the query and probabilities rounded to half precision as ggml does with an
// F16 cache.
func (r *Range) attnRange(w, a, z int) {
	m, s, p := r.sp, &r.s, &r.ld.Part
	D, Q := m.HeadDim, r.qd
	layer := r.cur - r.ld.Lo
	group := m.NHead / m.NHeadKV
	bs := r.ld.KV.BlockSize
	scale, qscale := float32(1/math.Sqrt(float64(D))), float32(1)
	if m.AttnScale != 0 {
		scale, qscale = 1, m.AttnScale
	}
	vd := D // a value row's values: the head, or MLA's latent (the row's first KVLora)
	if m.MLA != nil {
		scale, vd = m.MLA.KQScale, m.MLA.KVLora
	}
	swa := m.SWA(r.cur)
	ly := r.layer(r.cur)
	// hw and row: a head's and a position's words in the cache
	kt := r.store.Type()
	quantized := kt != quant.F16
	hw := kv.Words(kt, D)
	row := r.nkv * hw
	qBytes := quant.VecDotType(kt).RowSize(D)
	ws := &r.attnWork[w]
	parts := r.attnParts
	per := (group + parts - 1) / parts
	for job := a; job < z; job++ {
		i, kvh, part := job/(r.nkv*parts), job/parts%r.nkv, job%parts
		// the member's query heads [h0,h0+g) share its KV head kvh: those
		// of the model's group KVLo+kvh that the part holds, counted from
		// its first
		first := max((p.KVLo+kvh)*group, p.HeadLo) - p.HeadLo
		last := min((p.KVLo+kvh+1)*group, p.HeadHi) - p.HeadLo
		h0 := first + part*per
		g := min(per, last-h0)
		if g <= 0 {
			continue
		}
		blocks := s.blocks[s.tokSeq[i]]
		ctx := int(s.tokPos[i]) + 1
		// positions [from,ctx) are attended; the blocks from start on are
		// read (a sliding window's first block in part)
		from := 0
		if swa {
			from = max(0, ctx-m.Window)
		}
		start := from / bs * bs
		qh := func(j int) []float32 { return ws.qh[j*D : (j+1)*D] }
		acc := func(j int) []float32 { return ws.acc[j*D : (j+1)*D] }
		scores := func(j int) []float32 { return ws.scores[j*ws.ctx : j*ws.ctx+ctx] }
		for j := 0; j < g; j++ {
			copy(qh(j), s.q[i*Q+(h0+j)*D:i*Q+(h0+j+1)*D])
			if qscale != 1 {
				for d, v := range qh(j) {
					qh(j)[d] = v * qscale
				}
			}
			if quantized {
				// as ggml's flash attention: the query in the K type's
				// activation format (Q8_0), integer dot products
				quant.QuantizeRow(quant.VecDotType(kt), qh(j), ws.qq[j*qBytes:(j+1)*qBytes])
			} else {
				kernels.RoundF16(qh(j))
			}
		}
		// K and V rows of one head are a row apart within a block: one
		// kernel call per block of positions and query head.
		for t := start; t < ctx; t += bs {
			e := min(t+bs, ctx)
			k := r.store.KRun(layer, blocks, t)[kvh*hw:]
			for j := 0; j < g; j++ {
				if quantized {
					kernels.ScoresQ(scores(j)[t:e], kt, D, ws.qq[j*qBytes:(j+1)*qBytes], k, row)
				} else {
					kernels.ScoresF16(scores(j)[t:e], qh(j), k, row)
				}
			}
		}
		for j := 0; j < g; j++ {
			sc := scores(j)[from:]
			mx := kernels.ScaleMax(sc, scale)
			var sink float64
			if ly.Sinks != nil {
				// the head's sink logit joins the max and the sum
				sl := ly.Sinks[p.HeadLo+h0+j]
				mx = max(mx, sl)
				sink = float64(float32(math.Exp(float64(sl - mx))))
			}
			inv := float32(1 / (kernels.ExpSub(sc, mx) + sink))
			if quantized {
				// the probabilities stay float32 (ggml's flash attention)
				for t := range sc {
					sc[t] *= inv
				}
			} else {
				// Softmax's arithmetic, the probabilities then rounded to
				// half precision in the same pass
				kernels.ScaleRoundF16(sc, inv)
			}
			clear(scores(j)[start:from]) // outside the window: no weight
			clear(acc(j))
		}
		for t := start; t < ctx; t += bs {
			e := min(t+bs, ctx)
			v := r.store.VRun(layer, blocks, t)[kvh*hw:]
			for j := 0; j < g; j++ {
				if quantized {
					kernels.AccumQ(acc(j)[:vd], scores(j)[t:e], kt, v, row, ws.vrow)
				} else {
					kernels.AccumF16(acc(j)[:vd], scores(j)[t:e], v, row)
				}
			}
		}
		for j := 0; j < g; j++ {
			copy(s.att[i*Q+(h0+j)*D:i*Q+(h0+j+1)*D], acc(j))
		}
	}
}
