package parallel

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
)

// Engine drives a Session one batch at a time for a scheduler (it has the
// method set of serve.Engine). It keeps a shadow KV cache that stores
// nothing but mirrors the members' block use: the scheduler admits and
// preempts sequences by it, and a step it accepts always fits every
// member's cache (each holds at least CacheTokens positions in blocks of the
// same size), so a full cache is an ordinary kv.ErrFull, never a failed
// session.
//
// Replay: the engine keeps the tokens it fed each live sequence. Its owner
// may Offer it a new session (over the same plan once its members answer
// again, or over a new plan); at the next step boundary the engine
// re-prefills every live sequence on it, closes the old one and goes on.
// When a step fails, the engine waits up to ReplayWait for such a session,
// replays and runs the step again, at most MaxReplays times in a row: the
// scheduler, and the clients behind it, see a slow step, not an error, and
// sampling goes on from the same state.
type Engine struct {
	shadow *kv.Cache
	nVocab int
	// onFail, when set, learns of a step that failed the session and
	// gives the error the scheduler sees when no replay saves the step.
	onFail func(error) error

	// ReplayWait bounds the wait for a new session after a failed step
	// (0: no replay, the step fails at once); MaxReplays bounds the
	// replays in a row before a step fails for good.
	ReplayWait time.Duration
	MaxReplays int

	s      *Session // the scheduler's goroutine's alone
	hist   map[kv.SeqID][]int32
	offers chan *Session

	times *StepTimes // the sessions' member step times

	remote remoteState // disaggregated prefill (remote.go)

	mu      sync.Mutex
	closed  bool
	done    chan struct{}
	replays int64
	lastLag time.Duration
}

// replayChunk bounds the tokens of one re-prefill step.
const replayChunk = 256

// NewEngine wraps s. cacheTokens and blockSize must not exceed what every
// member was given (MemberConfig.CacheTokens, BlockSize; 0 = the defaults).
func NewEngine(s *Session, cacheTokens, blockSize int) (*Engine, error) {
	if cacheTokens <= 0 {
		return nil, fmt.Errorf("dist: engine needs a positive KV capacity, got %d", cacheTokens)
	}
	if blockSize <= 0 {
		blockSize = kv.DefaultBlockSize
	}
	c, err := kv.New(kv.Config{Layers: 1, KVDim: 0, BlockSize: blockSize, NumBlocks: cacheTokens / blockSize})
	if err != nil {
		return nil, err
	}
	return &Engine{s: s, shadow: c, nVocab: s.NVocab(), hist: map[kv.SeqID][]int32{}, offers: make(chan *Session, 1), done: make(chan struct{}),
		times: s.c.opt.Times}, nil
}

// MemberSteps is how long each member node took to answer the steps of
// the engine's sessions (nil when its cluster keeps no Options.Times).
func (e *Engine) MemberSteps() []MemberTime { return e.times.Snapshot() }

// Capacity is the KV positions the engine admits sequences for.
func (e *Engine) Capacity() int { c := e.shadow.Config(); return c.NumBlocks * c.BlockSize }

// Offer hands the engine a new session to continue on: it takes it at its
// next step, replaying every live sequence. An offer not yet taken is
// replaced (and closed). It reports false, closing s, once the engine is
// closed.
func (e *Engine) Offer(s *Session) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		closeSession(s)
		return false
	}
	for {
		select {
		case e.offers <- s:
			return true
		case old := <-e.offers:
			closeSession(old)
		}
	}
}

// Replays is how many times the engine moved its sequences to a new
// session, and how long the last move paused the steps.
func (e *Engine) Replays() (n int64, lastPause time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.replays, e.lastLag
}

// Close closes the current session and any offered one; a step waiting
// for a replay fails.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	close(e.done)
	e.mu.Unlock()
	select {
	case s := <-e.offers:
		closeSession(s)
	default:
	}
	// The scheduler's goroutine may be inside a step on e.s: closing the
	// session fails that step, which then finds the engine closed.
	closeSession(e.s)
}

func closeSession(s *Session) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = s.Close(ctx)
	cancel()
}

// Step reserves b in the shadow cache (all chunks or none) and runs it on
// the cluster, on a new session first when one was offered, and again on
// the next one when it fails and replay is on.
func (e *Engine) Step(b *model.Batch, rows []int) ([]float32, error) {
	logits, _, err := e.stepOrReplay(b, rows, nil)
	return logits, err
}

// SamplesRemotely says whether the plan's logits are computed on another
// node than this driver (serve.RowSampler).
func (e *Engine) SamplesRemotely() bool { return e.s != nil && e.s.SamplesRemotely() }

// StepSampled is Step with the rows sampled where their logits are
// (serve.RowSampler): a replayed step samples with the same requests, so
// the same tokens come out.
func (e *Engine) StepSampled(b *model.Batch, rows []int, reqs []sample.Request) ([]sample.Result, error) {
	_, res, err := e.stepOrReplay(b, rows, reqs)
	return res, err
}

// stepOrReplay is Step, sampling the rows as reqs says when set.
func (e *Engine) stepOrReplay(b *model.Batch, rows []int, reqs []sample.Request) ([]float32, []sample.Result, error) {
	select {
	case ns := <-e.offers:
		if err := e.adopt(ns); err != nil {
			return nil, nil, e.failed(err)
		}
	default:
	}
	for attempt := 0; ; attempt++ {
		logits, res, err := e.step(b, rows, reqs)
		if err == nil || !failedStep(err) {
			return logits, res, err
		}
		if attempt >= e.MaxReplays || e.ReplayWait <= 0 {
			return nil, nil, e.failed(err)
		}
		// Tell the owner (it finds a new session), then wait for one.
		if e.onFail != nil {
			_ = e.onFail(err)
		}
		if rerr := e.awaitReplay(err); rerr != nil {
			return nil, nil, e.failed(rerr)
		}
	}
}

// step is one attempt at b on the current session.
func (e *Engine) step(b *model.Batch, rows []int, reqs []sample.Request) ([]float32, []sample.Result, error) {
	for i := range b.Chunks {
		c := &b.Chunks[i]
		pos, err := e.shadow.Reserve(c.Seq, c.N)
		if err != nil {
			e.undo(b, i)
			return nil, nil, err
		}
		c.Pos = pos
	}
	var logits []float32
	var res []sample.Result
	var err error
	if reqs != nil {
		res, err = e.s.StepSampled(context.Background(), b, rows, reqs)
	} else {
		logits, err = e.s.Step(context.Background(), b, rows)
	}
	if err != nil {
		e.undo(b, len(b.Chunks))
		return nil, nil, err
	}
	off := 0
	for _, c := range b.Chunks {
		e.hist[c.Seq] = append(e.hist[c.Seq], b.Tokens[off:off+c.N]...)
		off += c.N
	}
	return logits, res, nil
}

// failed gives the scheduler the error of a step no replay saved.
func (e *Engine) failed(err error) error {
	if e.onFail != nil {
		return e.onFail(err)
	}
	return err
}

// awaitReplay waits for an offered session and moves the live sequences
// to it; cause is the failure that made the current one unusable.
func (e *Engine) awaitReplay(cause error) error {
	t := time.NewTimer(e.ReplayWait)
	defer t.Stop()
	for {
		select {
		case ns := <-e.offers:
			err := e.adopt(ns)
			if err == nil {
				return nil
			}
			cause = err // that session failed too: wait for the next
		case <-t.C:
			return fmt.Errorf("%w; no new session within %v to replay the running sequences on", cause, e.ReplayWait)
		case <-e.done:
			return fmt.Errorf("%w; the model stopped being served here", cause)
		}
	}
}

// adopt re-prefills every live sequence on ns and makes it the session.
func (e *Engine) adopt(ns *Session) error {
	t0 := time.Now()
	if ns.NVocab() != e.nVocab {
		closeSession(ns)
		return fmt.Errorf("dist: the new session's vocabulary (%d) is not the model's (%d)", ns.NVocab(), e.nVocab)
	}
	seqs := make([]kv.SeqID, 0, len(e.hist))
	for q := range e.hist {
		seqs = append(seqs, q)
	}
	slices.Sort(seqs)
	for _, q := range seqs {
		toks := e.hist[q]
		for off := 0; off < len(toks); off += replayChunk {
			n := min(replayChunk, len(toks)-off)
			b := &model.Batch{Tokens: toks[off : off+n], Chunks: []model.Chunk{{Seq: q, N: n}}}
			if _, err := ns.Step(context.Background(), b, nil); err != nil {
				closeSession(ns)
				return fmt.Errorf("dist: replaying sequence %d on a new session: %w", q, err)
			}
		}
	}
	old := e.s
	e.s = ns
	closeSession(old)
	e.mu.Lock()
	e.replays++
	e.lastLag = time.Since(t0)
	e.mu.Unlock()
	return nil
}

// undo returns the first n chunks' reservations.
func (e *Engine) undo(b *model.Batch, n int) {
	for j := n - 1; j >= 0; j-- {
		e.shadow.Truncate(b.Chunks[j].Seq, b.Chunks[j].Pos)
	}
}

// Free releases seq on every member and in the shadow cache.
func (e *Engine) Free(seq kv.SeqID) {
	if e.cancelRemote(seq) {
		return // freed when its remote prefill ends (Landed)
	}
	e.shadow.Free(seq)
	delete(e.hist, seq)
	// A failed free leaves the session unusable; the next Step reports it.
	_ = e.s.Free(context.Background(), seq)
}

// Truncate cuts seq back to its first n positions (drafts the model did
// not accept): in the shadow cache and the replay history now, on the
// members with its next step.
func (e *Engine) Truncate(seq kv.SeqID, n int) {
	e.shadow.Truncate(seq, n)
	if h := e.hist[seq]; n < len(h) {
		e.hist[seq] = h[:n]
	}
	e.s.Truncate(seq, n)
}

// Cache is the shadow cache.
func (e *Engine) Cache() *kv.Cache { return e.shadow }

// NVocab is the model's vocabulary size.
func (e *Engine) NVocab() int { return e.nVocab }
