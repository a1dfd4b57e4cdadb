package placement

import "math"

// MinPrefillPiece is the fewest tokens a pipelined prefill's piece holds:
// the matrix kernels lose their efficiency on fewer rows.
const MinPrefillPiece = 32

// PrefillPiece is the tokens per piece of a prefill of n tokens through a
// plan of stages stages, 0 when it runs as one step: a plan of several
// stages cuts a prompt of at least 2*MinPrefillPiece tokens into 4 pieces
// per stage, none of fewer than MinPrefillPiece tokens. S stages and P
// pieces take (P+S-1)/P of one stage's share of the whole prompt, so 4 per
// stage keeps the pipeline's fill and drain near a fifth of it.
func PrefillPiece(stages, n int) int {
	if stages < 2 || n < 2*MinPrefillPiece {
		return 0
	}
	return max(MinPrefillPiece, (n+4*stages-1)/(4*stages))
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
// for the piece's tokens (attention over half the prompt on average), its
// weights read once, the hop in and the all-reduces of the piece's hidden
// states; the pieces flow through the stages, so the prompt takes the
// first piece's way through every stage and then one busiest stage's
// time per further piece. ok is false for a plan Recost cannot weigh
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

// prefillEnv is e for one step of a prefill piece of tokens tokens of a
// prompt of n: the piece's hidden states, its rows attending to half the
// prompt on average, the weights read once for all of them.
func (e *env) prefillEnv(tokens, n int) *env {
	f := *e
	f.prefill = true
	f.batch = float64(tokens)
	f.hidden = f.batch * float64(e.p.NEmbd) * actBytes
	f.ctxAvg = float64(n) / 2
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
	steps := func(tokens int) ([]float64, float64, bool) {
		c := e.prefillEnv(tokens, n).evaluateAt(groups, bounds, false)
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
	whole, ret, ok := steps(n)
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
	per, ret, ok := steps(piece)
	if !ok {
		return pf, true
	}
	pieces := (n + piece - 1) / piece
	total, busiest := ret, 0.0
	for _, ms := range per {
		total += ms
		busiest = math.Max(busiest, ms)
	}
	pf.Piece, pf.Pieces, pf.StageMs = piece, pieces, per
	pf.Ms = total + float64(pieces-1)*busiest
	return pf, true
}
