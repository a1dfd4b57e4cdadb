package cpu

import (
	"math"

	"shoal/engine/device"
)

// moe runs the routed-expert FFN (plus the shared expert where the
// architecture has one) on s.xn, writing to out. Every member routes every
// token; a member runs the chosen experts it holds and the group sums.
// partial is as for device.Range.FFN.
func (r *Range) moe(ly *device.Layer, out []float32) (partial bool, err error) {
	m, s := r.sp, &r.s
	n, E, X, K := s.n, m.NEmbd, m.NExpert, m.NExpertUsed
	r.matmul(ly.Router, s.xn, n, s.route)
	idx := s.expIdx
	for i := 0; i < n; i++ {
		p := s.route[i*X : (i+1)*X]
		if m.OAI {
			// the top logits (with the router's bias), then a softmax
			// over those alone
			AddBias(p, ly.RouterB)
			TopK(p, idx, K)
			w := s.expW[i*K : (i+1)*K]
			for j := 0; j < K; j++ {
				s.expID[i*K+j], w[j] = int32(idx[j]), p[idx[j]]
			}
			Softmax(w)
			continue
		}
		if m.SigmoidGate {
			for e := range p {
				p[e] = Sigmoid(p[e])
			}
		} else {
			Softmax(p)
		}
		if b := ly.ExpProbsB; b != nil || m.ExpertGroups > 1 {
			// chosen by score plus bias (within the best groups), weighted
			// by the score alone
			sel := s.expSel[:X]
			copy(sel, p)
			if b != nil {
				for e := range sel {
					sel[e] += b[e]
				}
			}
			if m.ExpertGroups > 1 {
				r.maskGroups(sel)
			}
			TopK(sel, idx, K)
		} else {
			TopK(p, idx, K)
		}
		var sum float32
		for j := 0; j < K; j++ {
			s.expID[i*K+j] = int32(idx[j])
			s.expW[i*K+j] = p[idx[j]]
			sum += p[idx[j]]
		}
		if m.NormExperts {
			sum = max(sum, 6.103515625e-5) // ggml's clamp of the sum (the least normal half)
			for j := 0; j < K; j++ {
				s.expW[i*K+j] /= sum
			}
		}
		if m.ExpertScale != 0 {
			for j := 0; j < K; j++ {
				s.expW[i*K+j] *= m.ExpertScale
			}
		}
	}
	clear(out[:n*E])
	// Per expert: gather the tokens routed to it, run its FFN, scatter back
	// weighted. Experts are visited in each token's selection order so that
	// sums happen in the order ggml adds them.
	for j := 0; j < K; j++ {
		for e := 0; e < X; e++ {
			ex := &ly.Experts[e]
			if ex.Gate == nil {
				continue // held by another member
			}
			rows := s.expRows[:0]
			for i := 0; i < n; i++ {
				if int(s.expID[i*K+j]) == e {
					rows = append(rows, int32(i))
				}
			}
			if len(rows) == 0 {
				continue
			}
			for gi, i := range rows {
				copy(s.ex[gi*E:(gi+1)*E], s.xn[int(i)*E:(int(i)+1)*E])
			}
			if m.OAI {
				r.ffnOAI(ly, e, ex, s.ex, len(rows))
			} else {
				r.ffn(ex.Gate, ex.Up, ex.Down, s.ex, len(rows), s.eg, s.eu, s.eo)
			}
			for gi, i := range rows {
				w := s.expW[int(i)*K+j]
				o, src := out[int(i)*E:(int(i)+1)*E], s.eo[gi*E:(gi+1)*E]
				for c := range o {
					o[c] += src[c] * w
				}
			}
		}
	}
	if !m.SharedFFN {
		return true, nil
	}
	if ly.ShGateInp != nil {
		r.matmul(ly.ShGateInp, s.xn, n, s.shgate)
	}
	// The shared expert's partial product joins the routed sum before the
	// one all-reduce (the caller's); gathered, it is complete and joins
	// after it, so the routed sum is reduced here.
	if ly.ShDownGather {
		if err := r.allReduce(out[:n*E]); err != nil {
			return false, err
		}
		r.swiglu(ly.ShGate, ly.ShUp, s.xn, n, s.g, s.u)
		if _, err := r.project(ly.ShDown, true, s.g, n, r.tpCols(true), s.eo); err != nil {
			return false, err
		}
	} else if ly.ShGate == nil || ly.ShDown == nil {
		clear(s.eo[:n*E])
	} else {
		r.ffn(ly.ShGate, ly.ShUp, ly.ShDown, s.xn, n, s.g, s.u, s.eo)
	}
	for i := 0; i < n; i++ {
		gate := float32(1)
		if ly.ShGateInp != nil {
			gate = Sigmoid(s.shgate[i])
		}
		o, src := out[i*E:(i+1)*E], s.eo[i*E:(i+1)*E]
		for c := range o {
			o[c] += src[c] * gate
		}
	}
	return !ly.ShDownGather, nil
}

// Sigmoid is 1/(1+e^-x).
func Sigmoid(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }

// TopK orders the first k entries of idx as the indexes of the k largest
// values of p, largest first, ties to the lower index (a stable selection).
func TopK(p []float32, idx []int, k int) {
	for e := range idx {
		idx[e] = e
	}
	for j := 0; j < k; j++ {
		best := j
		for e := j + 1; e < len(idx); e++ {
			if p[idx[e]] > p[idx[best]] || (p[idx[e]] == p[idx[best]] && idx[e] < idx[best]) {
				best = e
			}
		}
		idx[j], idx[best] = idx[best], idx[j]
	}
}

// ffnOAI is gpt-oss's expert e (of layer ly) on n rows of x into s.eo:
// gate and up with their biases, the clamped SwiGLU, down with its bias.
func (r *Range) ffnOAI(ly *device.Layer, e int, ex *device.Expert, x []float32, n int) {
	s, E := &r.s, r.sp.NEmbd
	F := ex.Gate.Rows
	g, u := s.eg[:n*F], s.eu[:n*F]
	r.matmul(ex.Gate, x, n, g)
	r.matmul(ex.Up, x, n, u)
	gb, ub := ly.ExpGateB[e*F:(e+1)*F], ly.ExpUpB[e*F:(e+1)*F]
	for i := 0; i < n; i++ {
		gi, ui := g[i*F:(i+1)*F], u[i*F:(i+1)*F]
		for c := range gi {
			a := min(gi[c]+gb[c], oaiLimit)
			y := min(max(ui[c]+ub[c], -oaiLimit), oaiLimit)
			gi[c] = a / (1 + float32(math.Exp(float64(-oaiAlpha*a)))) * (y + 1)
		}
	}
	r.matmul(ex.Down, g, n, s.eo)
	db := ly.ExpDownB[e*E : (e+1)*E]
	for i := 0; i < n; i++ {
		AddBias(s.eo[i*E:(i+1)*E], db)
	}
}

// gpt-oss's SwiGLU: x·σ(αx)·(y+1) with x at most the limit and y within it.
const oaiAlpha, oaiLimit = 1.702, 7.0

// maskGroups limits the experts' selection scores sel to the
// Spec.ExpertGroupsUsed groups (of Spec.ExpertGroups runs of consecutive
// experts) whose two best scores sum highest, as DeepSeek-V3 routes and
// llama.cpp computes it: the others' scores become -∞.
func (r *Range) maskGroups(sel []float32) {
	m, s := r.sp, &r.s
	G := m.ExpertGroups
	per := len(sel) / G
	s.groupScore = Grow(s.groupScore, G)
	s.groupIdx = Grow(s.groupIdx, G)
	for g := 0; g < G; g++ {
		a, b := float32(math.Inf(-1)), float32(math.Inf(-1)) // the two best
		for _, v := range sel[g*per : (g+1)*per] {
			if v > a {
				a, b = v, a
			} else if v > b {
				b = v
			}
		}
		s.groupScore[g] = a + b
	}
	TopK(s.groupScore, s.groupIdx, m.ExpertGroupsUsed)
	keep := s.groupScore // reused: 1 for a kept group
	clear(keep)
	for _, g := range s.groupIdx[:m.ExpertGroupsUsed] {
		keep[g] = 1
	}
	for g := 0; g < G; g++ {
		if keep[g] == 0 {
			for e := g * per; e < (g+1)*per; e++ {
				sel[e] = float32(math.Inf(-1))
			}
		}
	}
}
