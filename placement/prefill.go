package placement

import "math"

// MinPrefillPiece is the fewest tokens a pipelined prefill's piece holds:
// the matrix kernels lose their efficiency on fewer rows.
const MinPrefillPiece = 32

// PrefillPiece is the tokens per piece of a prefill of n tokens through a
// plan of stages stages, 0 when it runs as one step: a plan of several
// stages cuts a prompt of at least 2*MinPrefillPiece tokens into 8 pieces
// per stage, none of fewer than MinPrefillPiece tokens. The stages work on
// different pieces at once, so the prompt takes one busiest stage's share
// of all of it plus the fill and drain: the other stages' time for the
// first and last pieces. A piece's attention grows with its position, so
// the last is the dearest (1.8x the first for TinyLlama's shapes at 2,048
// tokens, measured); 8 per stage keep the drain near a sixteenth of the
// prompt on two stages. The matrix kernels run as fast on 32 rows as on
// 256 (measured on one AVX-512 core: 98 and 96 tok/s), so more pieces cost
// only their messages.
func PrefillPiece(stages, n int) int {
	if stages < 2 || n < 2*MinPrefillPiece {
		return 0
	}
	return max(MinPrefillPiece, (n+8*stages-1)/(8*stages))
}

// Prefill is a predicted prefill of a prompt through a plan.
type Prefill struct {
	Tokens int `json:"tokens"`
	// Piece is the tokens per pipelined piece (PrefillPiece), Pieces how
	// many; 0 and 1 for a prompt run as one step.
	Piece  int `json:"piece"`
	Pieces int `json:"pieces"`
	// Ms is the prompt's time to its first token's logits; OneStepMs the
	// same prompt run as one step through the stages in turn.
	Ms        float64 `json:"ms"`
	OneStepMs float64 `json:"one_step_ms"`
	// StageMs is each stage's time for one piece, hops and all-reduces
	// included.
	StageMs []float64 `json:"stage_ms"`
}

// PredictPrefill is plan's prefill of one prompt of n tokens on the nodes'
// and links' figures now: each piece costs every stage its layers' FLOPs
// for the piece's tokens (attention over the positions before them), its
// weights read once, the hop in and the all-reduces of the piece's hidden
// states; the pieces flow through the stages, so the prompt takes the
// busiest stage's time for every piece, the stages before it for the first
// piece and the stages after it for the last. ok is false for a plan Recost cannot weigh
// (several pools, members that no longer fit).
func PredictPrefill(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options, plan *Plan, n int) (Prefill, bool) {
	if n <= 0 {
		return Prefill{}, false
	}
	o := opts.normalized()
	l, ok := layoutOf(&profile, nodes, o, plan)
	if !ok || len(l.holes) > 0 {
		return Prefill{}, false
	}
	return newEnv(&profile, l.eligible, links, o).prefillOf(l.groups, l.bounds, n)
}

// prefillEnv is e for one step of a prefill piece of tokens tokens whose
// rows attend to ctx positions on average: the piece's hidden states, the
// weights read once for all of them.
func (e *env) prefillEnv(tokens int, ctx float64) *env {
	f := *e
	f.prefill = true
	f.batch = float64(tokens)
	f.hidden = f.batch * float64(e.p.NEmbd) * actBytes
	f.ctxAvg = ctx
	if e.p.NExpert > 0 {
		f.touched = 1 - math.Pow(1-float64(e.p.NExpertUsed)/float64(e.p.NExpert), f.batch)
	}
	return &f
}

// prefillTokens is the tokens of one step of a prefill of n tokens through
// stages stages: a piece, or the whole prompt.
func prefillTokens(stages, n int) int {
	if piece := PrefillPiece(stages, n); piece > 0 {
		return piece
	}
	return n
}

// prefillOf is PredictPrefill for the arrangement groups with layer bounds.
func (e *env) prefillOf(groups [][]int, bounds []int, n int) (Prefill, bool) {
	// steps is each stage's time for a step of tokens tokens attending to
	// ctx positions on average, and the sampled token's way back.
	steps := func(tokens int, ctx float64) ([]float64, float64, bool) {
		c := e.prefillEnv(tokens, ctx).evaluateAt(groups, bounds, false)
		if !c.ok {
			return nil, 0, false
		}
		ms := make([]float64, len(c.stages))
		for k := range c.stages {
			ms[k] = c.stages[k].Ms
		}
		last, first := groups[len(groups)-1][0], groups[0][0]
		return ms, e.sendMs(last, first, 4), true
	}
	whole, ret, ok := steps(n, float64(n)/2)
	if !ok {
		return Prefill{}, false
	}
	pf := Prefill{Tokens: n, Pieces: 1, StageMs: whole, OneStepMs: ret}
	for _, ms := range whole {
		pf.OneStepMs += ms
	}
	pf.Ms = pf.OneStepMs
	piece := PrefillPiece(len(groups), n)
	if piece == 0 {
		return pf, true
	}
	pieces := (n + piece - 1) / piece
	tail := n - (pieces-1)*piece // the last piece's tokens
	avg, _, ok1 := steps(piece, float64(n)/2)
	first, _, ok2 := steps(piece, float64(piece)/2)
	last, _, ok3 := steps(tail, float64(n-tail/2))
	if !ok1 || !ok2 || !ok3 {
		return pf, true
	}
	busiest := 0
	for k := range avg {
		if avg[k] > avg[busiest] {
			busiest = k
		}
	}
	// The busiest stage's time for every piece (linear in the tokens, at
	// the average position), the stages before it for the first piece,
	// those after it for the last.
	ms := ret + avg[busiest]*float64(n)/float64(piece)
	for k := range busiest {
		ms += first[k]
	}
	for k := busiest + 1; k < len(last); k++ {
		ms += last[k]
	}
	pf.Piece, pf.Pieces, pf.StageMs, pf.Ms = piece, pieces, avg, ms
	return pf, true
}
