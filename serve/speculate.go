package serve

import (
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
)

// Speculative decoding by prompt lookup (Options.Lookup). A decoding
// sequence whose latest n-gram (4 tokens down to 2) occurred earlier in
// its context drafts the tokens that followed it there; the step runs its
// last token and the drafts as one chunk and computes a row of logits for
// each. verify then samples the rows in order, exactly as it would sample
// one token per step (the same sampler, penalties over the same history,
// the grammar's mask after the same tokens): while the token drawn is the
// draft at that position, that position's KV was computed from the right
// input and the next row is valid; the first token that differs (or the
// one after the last draft) is kept and the rest is cut from the cache.
// Every emitted token is drawn once from its row, so the output, sampled
// or greedy, is the one decoding token by token gives (up to the float
// differences of a batched step), and the sampler's random draws are the
// same: replay holds. A draft costs its rows' compute; on a memory-bound
// decode a step of a few tokens reads the weights once, as one does.

// Truncater is an Engine whose sequences can be cut back to n positions
// (the KV of drafts the model did not accept).
type Truncater interface {
	Truncate(seq kv.SeqID, n int)
}

// lookupMaxN and lookupMinN bound the n-grams prompt lookup matches.
const (
	lookupMaxN = 4
	lookupMinN = 2
)

// defaultDraftMax is Options.DraftMax when unset.
const defaultDraftMax = 6

// draftFor drafts up to room tokens for decoding sequence sq into sq.draft
// and returns how many.
func (s *Scheduler) draftFor(sq *seq, room int) int {
	if s.drafter == nil || room <= 0 || (s.gain.paused() && !s.opts.alwaysDraft) {
		return 0
	}
	if _, ok := s.r.(Truncater); !ok {
		return 0
	}
	// Drafts take only KV room no other sequence needs this step: what is
	// left of the sequence's last block, and the free blocks beyond one
	// per running sequence (a draft never makes the scheduler preempt).
	c := s.r.Cache()
	bs := c.Config().BlockSize
	spare := max(0, c.FreeBlocks()-len(s.running))
	room = min(room, (bs-(sq.processed+1)%bs)%bs+spare*bs)
	if sq.k <= 0 {
		sq.k = s.draftMax
	}
	k := min(sq.k, room, s.seqCap-len(sq.tokens)-1)
	if sq.req.MaxTokens > 0 {
		k = min(k, sq.req.MaxTokens-sq.generated-1)
	}
	if k <= 0 {
		return 0
	}
	sq.draft = s.drafter.Draft(sq.id, sq.tokens, k, sq.draft[:0])
	return len(sq.draft)
}

// draftGain decides whether drafting pays on this engine: a drafted row
// costs little where a step is bound by reading the weights (a large
// model), but on a small model, or with drafts that are seldom accepted,
// a step of several rows can emit fewer tokens a second than steps of
// one. It compares the tokens a second of decode steps with drafts and
// without (averaged, the latest weighing most) and, when drafting loses,
// pauses it for a while and then tries again; when every step drafts, it
// pauses now and then to measure the steps without.
type draftGain struct {
	plain, drafted   float64 // tokens a second of decode steps without and with drafts
	nPlain, nDrafted int     // steps measured of each since the last decision
	off              int     // steps left without drafts
	pause            int     // the next pause: doubled each time drafting loses again
}

const (
	gainWeight  = 0.2 // of the latest step in the averages
	gainSteps   = 8   // drafted steps measured before a decision
	gainPause   = 64  // steps without drafts when drafting loses (doubling while it keeps losing)
	gainMaxStop = 4096
	gainProbe   = 4 // steps without drafts to measure them
	gainMargin  = 0.95
	gainRedraft = 256 // drafted steps before plain ones are measured again
)

// paused reports whether this step drafts nothing.
func (g *draftGain) paused() bool { return g.off > 0 }

// note adds a decode-only step of d that emitted n tokens, with drafts or
// without.
func (g *draftGain) note(drafted bool, d time.Duration, n int) {
	if d <= 0 || n <= 0 {
		return
	}
	rate := float64(n) / d.Seconds()
	avg := func(a *float64, k *int) {
		if *k == 0 {
			*a = rate
		} else {
			*a += gainWeight * (rate - *a)
		}
		*k++
	}
	if !drafted {
		avg(&g.plain, &g.nPlain)
		if g.off > 0 {
			g.off--
		}
		return
	}
	avg(&g.drafted, &g.nDrafted)
	switch {
	case g.nPlain < gainProbe && g.nDrafted%gainRedraft == gainSteps:
		g.off = gainProbe // measure steps without drafts
	case g.nPlain >= gainProbe && g.nDrafted >= gainSteps && g.drafted < gainMargin*g.plain:
		// Each retry that loses again costs its drafted steps: the pauses
		// grow, so what retrying costs stays small against a long run.
		g.pause = min(max(2*g.pause, gainPause), gainMaxStop)
		g.off, g.nDrafted, g.nPlain = g.pause, 0, 0
	case g.nDrafted >= gainRedraft:
		g.nPlain = 0 // steps without drafts change too: measure them again
		g.nDrafted = 0
	case g.nPlain >= gainProbe && g.nDrafted >= gainSteps:
		g.pause = 0 // drafting pays: a later loss pauses briefly first
	}
}

// adapt sets how many tokens sq drafts next from how many of n drafts the
// model accepted: one more after all of them, else about half-way to the
// run just accepted plus one (a poor guesser drafts one token a step,
// which costs a row, not a step).
func (s *Scheduler) adapt(sq *seq, n, accepted int) {
	if accepted == n {
		sq.k = min(sq.k+1, s.draftMax)
		return
	}
	sq.k = max(1, (sq.k+accepted+1)/2)
}

// lookup appends to dst the k tokens that followed the latest earlier
// occurrence of the longest n-gram (lookupMaxN down to lookupMinN) that
// ends toks, or none. Where the context ends before k tokens are copied,
// the copy goes on from what it drafted, as an overlapping copy does: the
// text since that occurrence is taken to repeat, so a loop (a repeated
// line, a token over and over) is drafted k tokens at a time.
func lookup(toks []int32, k int, dst []int32) []int32 {
	n := len(toks)
	for g := min(lookupMaxN, n-1); g >= lookupMinN; g-- {
		tail := toks[n-g:]
		// The latest occurrence that ends before the tail does and has a
		// token after it.
		for end := n - 1; end >= g; end-- {
			if !equalTokens(toks[end-g:end], tail) {
				continue
			}
			start := len(dst)
			for i := range k {
				if src := end + i; src < n {
					dst = append(dst, toks[src])
				} else {
					dst = append(dst, dst[start+src-n])
				}
			}
			return dst
		}
	}
	return dst
}

func equalTokens(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// addDrafted adds sq's last token and its drafts to the batch as one
// chunk, with a logits row for every position.
func (s *Scheduler) addDrafted(sq *seq) {
	b := &s.batch
	n := 1 + len(sq.draft)
	b.Chunks = append(b.Chunks, model.Chunk{Seq: sq.id, N: n})
	s.chunkSeq = append(s.chunkSeq, sq)
	b.Tokens = append(b.Tokens, sq.tokens[sq.processed])
	b.Tokens = append(b.Tokens, sq.draft...)
	for i := range n {
		s.rows = append(s.rows, len(b.Tokens)-n+i)
		s.rowSeq = append(s.rowSeq, sq)
	}
}

// verify samples sq's rows of a drafted step in order (logits: one row
// for its last token and one per draft) while the tokens drawn are the
// drafts, keeps the KV of the positions whose input was right and cuts
// the rest; true when the sequence ended. With res, the rows were drawn
// where the logits are (RowSampler) and res holds their draws.
func (s *Scheduler) verify(sq *seq, logits []float32, res []sample.Result) bool {
	V := s.r.NVocab()
	base := sq.processed // the position of the step's first token
	n := len(sq.draft)
	// Counted first: a sequence that ends here reports this step's drafts
	// in its final event.
	sq.drafted += n
	accepted := 0
	done := false
	for j := 0; j <= n; j++ {
		if res != nil {
			// Drawn where the logits are, each row chained to the one
			// before (sample.Request.After): a row after a draft that was
			// not drawn was not drawn either.
			if res[j].Token < 0 {
				break
			}
			done = s.emitSampled(sq, &res[j])
		} else {
			done = s.emit(sq, logits[j*V:(j+1)*V])
		}
		if done {
			break
		}
		if j == n || sq.tokens[len(sq.tokens)-1] != sq.draft[j] {
			break
		}
		accepted++
		sq.accepted++
	}
	s.adapt(sq, n, accepted)
	s.statsMu.Lock()
	s.stats.Drafted += uint64(n)
	s.stats.Accepted += uint64(accepted)
	s.statsMu.Unlock()
	sq.draft = sq.draft[:0]
	if done {
		return true // finish freed its KV
	}
	sq.processed = base + 1 + accepted
	s.r.(Truncater).Truncate(sq.id, sq.processed)
	if s.prefix {
		s.publish(sq)
	}
	return false
}

// sampledRequests fills s.reqs with a sampling request per row of the
// batch for a RowSampler: a sequence's own for its row, and for each
// draft's row one chained to the row before (drawn only when that row drew
// the draft: verification where the logits are, so that only tokens come
// back). ok is false when a drafted sequence is constrained: its mask after
// a draft is not known before the draft is accepted here, so the step
// takes its logits back instead.
func (s *Scheduler) sampledRequests() (ok bool) {
	s.reqs = s.reqs[:0]
	for i := 0; i < len(s.rowSeq); i++ {
		sq := s.rowSeq[i]
		r := sq.sampler.Request(sq.tokens, sq.req.Logprobs, sq.req.TopLogprobs)
		if c := sq.req.Constraint; c != nil {
			if len(sq.draft) > 0 {
				return false
			}
			r.Allow = c.Mask()
		}
		s.reqs = append(s.reqs, r)
		for j := range sq.draft {
			s.reqs = append(s.reqs, sample.Request{Params: r.Params, Logprobs: r.Logprobs, Top: r.Top, After: &sq.draft[j]})
		}
		i += len(sq.draft)
	}
	return true
}
