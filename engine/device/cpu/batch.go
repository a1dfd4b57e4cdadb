package cpu

import (
	"fmt"

	"shoal/engine/device"
	"shoal/engine/quant"
)

type scratch struct {
	n                int
	xn, q, k, v, att []float32
	g, u, o          []float32
	acts             []byte
	cos, sin         []float32 // per token, RopeDim/2 each
	cosL, sinL       []float32 // the same for the sliding layers' own base
	tokSeq, tokPos   []int32
	blocks           [][]int32 // per chunk
	route            []float32 // per token, NExpert router logits
	expSel           []float32 // NExpert selection scores (with a bias)
	expW             []float32 // per token, NExpertUsed weights
	expID            []int32
	expRows          []int32
	expIdx           []int
	eg, eu, eo, ex   []float32
	shgate           []float32
	groupScore       []float32 // per expert group, its selection score
	groupIdx         []int
}

// Grow returns s resized to n, reallocated only when its capacity is short
// (the contents are then not kept).
func Grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Begin implements device.Range: it sizes the scratch space for the batch
// and computes each token's RoPE table.
func (r *Range) Begin(b *device.Batch) error {
	m, s := r.sp, &r.s
	n := 0
	for _, c := range b.Chunks {
		n += c.N
	}
	s.n = n
	maxF := max(m.NFF, m.NFFExpert, m.NFFShared)
	maxCols := max(m.NEmbd, m.NHead*m.HeadDim, maxF)
	s.xn = Grow(s.xn, n*m.NEmbd)
	s.q = Grow(s.q, n*r.qd)
	s.k = Grow(s.k, n*r.kvd)
	s.v = Grow(s.v, n*r.kvd)
	s.att = Grow(s.att, n*r.qd)
	s.o = Grow(s.o, n*m.NEmbd)
	s.g = Grow(s.g, n*maxF)
	s.u = Grow(s.u, n*maxF)
	s.acts = Grow(s.acts, n*quant.F32.RowSize(maxCols))
	half := m.RopeDim / 2
	s.cos = Grow(s.cos, n*half)
	s.sin = Grow(s.sin, n*half)
	if r.swaRope != nil {
		s.cosL = Grow(s.cosL, n*half)
		s.sinL = Grow(s.sinL, n*half)
	}
	if r.mla != nil {
		r.beginMLA(n)
	}
	s.tokSeq = Grow(s.tokSeq, n)
	s.tokPos = Grow(s.tokPos, n)
	s.blocks = s.blocks[:0]
	bs := r.ld.KV.BlockSize
	i := 0
	for ci, c := range b.Chunks {
		if c.N <= 0 || c.Pos < 0 || (c.Pos+c.N+bs-1)/bs > len(c.Blocks) {
			return fmt.Errorf("chunk %d (positions [%d,%d)) has no reserved KV space", ci, c.Pos, c.Pos+c.N)
		}
		s.blocks = append(s.blocks, c.Blocks)
		for j := 0; j < c.N; j++ {
			s.tokSeq[i] = int32(ci)
			s.tokPos[i] = int32(c.Pos + j)
			RopeTable(s.cos[i*half:(i+1)*half], s.sin[i*half:(i+1)*half], c.Pos+j, m)
			if r.swaRope != nil {
				RopeTable(s.cosL[i*half:(i+1)*half], s.sinL[i*half:(i+1)*half], c.Pos+j, r.swaRope)
			}
			i++
		}
	}
	if m.IsMoE() {
		s.route = Grow(s.route, n*m.NExpert)
		s.expW = Grow(s.expW, n*m.NExpertUsed)
		s.expID = Grow(s.expID, n*m.NExpertUsed)
		s.expRows = Grow(s.expRows, n)
		s.eg = Grow(s.eg, n*m.NFFExpert)
		s.eu = Grow(s.eu, n*m.NFFExpert)
		s.eo = Grow(s.eo, n*m.NEmbd)
		s.ex = Grow(s.ex, n*m.NEmbd)
		s.shgate = Grow(s.shgate, n)
		s.expIdx = Grow(s.expIdx, m.NExpert)
		s.expSel = Grow(s.expSel, m.NExpert)
	}
	return nil
}
