package parallel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/placement"
	"shoal/transport"
)

// DefaultTimeout bounds a step (and every wait inside it) when Options
// leave it 0.
const DefaultTimeout = 5 * time.Second

// abortTimeout bounds telling the members that a session failed.
const abortTimeout = time.Second

// Options of a Cluster.
type Options struct {
	// Pool is the role of the plan's pool to run ("" for the first).
	Pool string
	// Timeout bounds one step end to end, on the driver and on every
	// member (DefaultTimeout if 0): a prefill chunk must fit in it.
	Timeout time.Duration
	// Activations and Collectives are the wire encodings of hidden states
	// between stages and of tensor-parallel all-reduces (DefaultWire if
	// 0). F32 is exact; F16, half the bytes, and Q8_0, about a quarter,
	// keep the logits within the oracle tolerances (TestPlans runs every
	// case on the default). Logits always travel as F32.
	Activations transport.DType
	Collectives transport.DType
	// Times, when set, accumulates each member node's step times.
	Times *StepTimes
	// Piece is the tokens per piece of a pipelined prefill: a step of
	// more tokens through a plan of several stages runs as steps of this
	// many, sent at once, so the stages compute different pieces at the
	// same time. 0 picks the size from the step (pieceSize); < 0 never
	// cuts a step.
	Piece int
}

// DefaultWire is the wire encoding of activations and collectives when
// Options leaves it open: F16, half of F32's bytes (a tensor-parallel
// decode step of a TinyLlama-shaped model all-reduces 44 vectors of 2,048
// values per token).
const DefaultWire = transport.F16

// Stats counts what a cluster's steps sent: payload bytes of the step
// descriptions and replies (Control), of hidden states between stages and
// from the embedder (Activations), of tensor-parallel collectives, summed
// over the members (Collectives), and of the logits returned (Logits).
// Frame headers and QUIC overhead are not counted.
type Stats struct {
	Steps, Tokens int64
	Control       int64
	Activations   int64
	Collectives   int64
	Logits        int64
	// ComputeUs is the steps' compute on their critical path: per step,
	// the sum over stages of the slowest member's layer time (waits for
	// input and inside collectives excluded). The rest of a step's time
	// is the network, the waits and the driver.
	ComputeUs int64
}

// Sub is the difference s - o of two readings of the counters.
func (s Stats) Sub(o Stats) Stats {
	return Stats{Steps: s.Steps - o.Steps, Tokens: s.Tokens - o.Tokens, Control: s.Control - o.Control,
		Activations: s.Activations - o.Activations, Collectives: s.Collectives - o.Collectives, Logits: s.Logits - o.Logits,
		ComputeUs: s.ComputeUs - o.ComputeUs}
}

// Bytes is the total payload.
func (s Stats) Bytes() int64 { return s.Control + s.Activations + s.Collectives + s.Logits }

// BytesPerToken is the payload per token stepped (0 before any).
func (s Stats) BytesPerToken() float64 {
	if s.Tokens == 0 {
		return 0
	}
	return float64(s.Bytes()) / float64(s.Tokens)
}

// Cluster drives one plan's members from a host: whoever receives a
// request opens a Session and steps it.
type Cluster struct {
	h   *Host
	lay *layout
	opt Options

	steps, tokens, control, act, coll, logits atomic.Int64
	compute                                   atomic.Int64 // Stats.ComputeUs
}

// NewCluster prepares to drive the plan whose nodes are at addrs (node ID
// -> endpoint address). It contacts nobody until Open.
func (h *Host) NewCluster(plan placement.Plan, addrs map[string]string, opt Options) (*Cluster, error) {
	lay, err := newLayout(plan, opt.Pool, addrs)
	if err != nil {
		return nil, err
	}
	if opt.Timeout <= 0 {
		opt.Timeout = DefaultTimeout
	}
	for _, d := range []*transport.DType{&opt.Activations, &opt.Collectives} {
		if *d == 0 {
			*d = DefaultWire
		}
		if !d.Valid() {
			return nil, fmt.Errorf("dist: unknown wire dtype %d", byte(*d))
		}
	}
	return &Cluster{h: h, lay: lay, opt: opt}, nil
}

// Stats returns the counters of every session's steps so far.
func (c *Cluster) Stats() Stats {
	return Stats{Steps: c.steps.Load(), Tokens: c.tokens.Load(), Control: c.control.Load(),
		Activations: c.act.Load(), Collectives: c.coll.Load(), Logits: c.logits.Load(), ComputeUs: c.compute.Load()}
}

// Session is one sequence of numbered steps through every member of the
// plan, each member holding the KV cache of its layers for the session's
// sequences. Steps run one at a time. After a failed step the session is
// unusable: every call returns that error; open a new one.
type Session struct {
	c      *Cluster
	id     string
	nEmbd  int
	nVocab int

	// remoteOut: the output member is on another node (SamplesRemotely,
	// asked every step, answered once: the layout is the session's).
	remoteOnce sync.Once
	remoteOut  bool

	mu     sync.Mutex
	step   uint64
	err    error
	closed bool
	// gone mirrors usable() (err, or ErrClosed once closed) for Err, which
	// must not wait for a step in flight: s.mu is held for a whole step,
	// and a prefill pool's handoff step runs for seconds (the decode
	// pool's scheduler asking whether that session is usable stalled
	// every stream for the rest of the step).
	gone atomic.Pointer[error]
	// lenMu guards seqLen (also read and written under mu by steps), so
	// that a handoff to this session reads and advances its sequence's
	// length without waiting for the step in flight.
	lenMu  sync.Mutex
	seqLen map[kv.SeqID]int
	cut    map[kv.SeqID]bool // cut back by Truncate since their last step (lenMu)
	pos    map[kv.SeqID]int
	reqs   []stepReq
	logits []float32
	aborts sync.WaitGroup
}

// Open starts a session on every member.
func (c *Cluster) Open(ctx context.Context) (*Session, error) {
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Session{c: c, id: hex.EncodeToString(id[:]), seqLen: map[kv.SeqID]int{}, cut: map[kv.SeqID]bool{}, pos: map[kv.SeqID]int{}}
	ctx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
	defer cancel()
	ms := c.lay.members()
	resps := make([]openResp, len(ms))
	err := c.each(ctx, func(ctx context.Context, i int, m memberRef) error {
		req := openReq{memberAddr: s.addr(m), Version: c.lay.Version, Pool: c.lay.Pool, Stage: m.Stage, Rank: m.Rank,
			TimeoutMs: c.opt.Timeout.Milliseconds(), Activations: c.opt.Activations, Collectives: c.opt.Collectives, Driver: c.h.Addr()}
		_, _, err := c.h.call(ctx, m.Addr, methodOpen, &req, &resps[i])
		return err
	})
	if err != nil {
		s.fail(err)
		s.release(context.Background(), methodClose)
		return nil, fmt.Errorf("dist: open session: %w", err)
	}
	for i, m := range ms {
		if m == c.lay.Output {
			s.nEmbd, s.nVocab = resps[i].NEmbd, resps[i].NVocab
		}
	}
	return s, nil
}

func (s *Session) addr(m memberRef) memberAddr {
	return memberAddr{Session: s.id, Key: memberKey(s.c.lay, m)}
}

// each runs f for every member concurrently; the first error (naming the
// member) cancels the others' calls and is returned.
func (c *Cluster) each(ctx context.Context, f func(ctx context.Context, i int, m memberRef) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ms := c.lay.members()
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			if err := f(ctx, i, m); err != nil {
				once.Do(func() {
					first = fmt.Errorf("%v: %w", m, err)
					cancel()
				})
			}
		})
	}
	wg.Wait()
	return first
}

// ID is the session's identifier on the members.
func (s *Session) ID() string { return s.id }

// NVocab is the width of a logits row.
func (s *Session) NVocab() int { return s.nVocab }

// Err is the error that made the session unusable, or nil. It does not
// wait for a step under way.
func (s *Session) Err() error {
	if p := s.gone.Load(); p != nil {
		return *p
	}
	return nil
}

// fail makes the session unusable with err (s.mu held).
func (s *Session) fail(err error) {
	s.err = err
	s.gone.Store(&err)
}

func (s *Session) usable() error {
	if s.err != nil {
		return s.err
	}
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Step runs one batch through the plan: prefill chunks and decode tokens
// of any of the session's sequences (b.Tokens laid out chunk after chunk),
// and returns the logits of the listed rows (indexes into the batch's
// tokens), len(rows) x NVocab, valid until the next Step. It sets each
// chunk's Pos to where its tokens go in its sequence. A step that fails,
// or does not finish within the cluster's timeout, makes the session
// unusable; the error names the member that failed when one did.
func (s *Session) Step(ctx context.Context, b *model.Batch, rows []int) ([]float32, error) {
	logits, _, err := s.run(ctx, b, rows, nil, nil, nil)
	return logits, err
}

// StepSampled is Step with each row sampled by the member that computes
// the logits, as reqs says (one per row): only the tokens come back.
func (s *Session) StepSampled(ctx context.Context, b *model.Batch, rows []int, reqs []sample.Request) ([]sample.Result, error) {
	if len(reqs) != len(rows) {
		return nil, fmt.Errorf("dist: %d sampling requests for %d rows", len(reqs), len(rows))
	}
	_, res, err := s.run(ctx, b, rows, reqs, nil, nil)
	return res, err
}

// SamplesRemotely says whether the logits are computed on another node
// (so StepSampled saves sending them).
func (s *Session) SamplesRemotely() bool {
	s.remoteOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.remoteOut = !s.c.h.ep.IsSelf(ctx, s.c.lay.Output.Addr)
	})
	return s.remoteOut
}

// run is Step, sampling the rows where the logits are when sreqs is set
// (their results returned instead of logits), and sending the KV to a
// decode session when ho is set. A member's failure to send the KV does
// not fail the step: it is reported in kvErr.
func (s *Session) run(ctx context.Context, b *model.Batch, rows []int, sreqs []sample.Request, ho *handoffReq, kvErr *error) ([]float32, []sample.Result, error) {
	var kvMu sync.Mutex
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return nil, nil, err
	}
	n := b.Len()
	if n == 0 || len(b.Tokens) != n {
		return nil, nil, fmt.Errorf("dist: a step needs tokens for its chunks (%d tokens, chunks cover %d)", len(b.Tokens), n)
	}
	for _, c := range b.Chunks {
		if c.N <= 0 {
			return nil, nil, fmt.Errorf("dist: chunk of sequence %d has %d tokens", c.Seq, c.N)
		}
	}
	for _, i := range rows {
		if i < 0 || i >= n {
			return nil, nil, fmt.Errorf("dist: logits row %d is outside the batch of %d", i, n)
		}
	}
	c := s.c
	lay := c.lay
	chunks := make([]wireChunk, len(b.Chunks))
	clear(s.pos)
	for i := range b.Chunks {
		ch := &b.Chunks[i]
		p, ok := s.pos[ch.Seq]
		cut := false
		if !ok {
			s.lenMu.Lock()
			p, cut = s.seqLen[ch.Seq], s.cut[ch.Seq]
			s.lenMu.Unlock()
		}
		ch.Pos = p
		s.pos[ch.Seq] = p + ch.N
		chunks[i] = wireChunk{Seq: int32(ch.Seq), Pos: p, N: ch.N, Cut: cut}
	}
	s.logits = grow(s.logits, len(rows)*s.nVocab)
	var pieces []*piece
	if size := c.pieceSize(n); ho == nil && size > 0 && !chained(sreqs) {
		pieces = splitPieces(chunks, b.Tokens, rows, sreqs, size)
	} else {
		// One step: the buffers are the session's, reused step after step.
		pieces = []*piece{{chunks: chunks, tokens: b.Tokens, rows: rows, sreqs: sreqs, logits: s.logits}}
	}
	ms := lay.members()
	for k, pc := range pieces {
		s.step++
		pc.step = s.step
		reqs := s.reqs[:0]
		if len(pieces) > 1 {
			reqs = make([]stepReq, 0, len(ms))
		}
		for _, m := range ms {
			r := stepReq{memberAddr: s.addr(m), Step: pc.step, Chunks: pc.chunks, Handoff: ho}
			if m == lay.Embedder || (m.Stage == 0 && m.Embedding) {
				r.Tokens = pc.tokens
			}
			if m == lay.Output {
				r.Rows, r.Sample = pc.rows, pc.sreqs
			}
			reqs = append(reqs, r)
		}
		pc.reqs = reqs
		if k == 0 && len(pieces) == 1 {
			s.reqs = reqs
		}
		if pc.logits == nil && len(pc.rows) > 0 && sreqs == nil {
			pc.logits = make([]float32, len(pc.rows)*s.nVocab)
		}
	}

	sctx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
	defer cancel()
	var control atomic.Int64
	var stageMu sync.Mutex
	// stageCompute[k][st]: piece k's compute in stage st (its slowest member).
	stageCompute := make([][]int64, len(pieces))
	for k := range stageCompute {
		stageCompute[k] = make([]int64, len(lay.Stages))
	}
	var tr [3]atomic.Int64
	stepPiece := func(ctx context.Context, k int) error {
		pc := pieces[k]
		return c.each(ctx, func(ctx context.Context, i int, m memberRef) error {
			var recvErr chan error
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			if m == lay.Output && len(pc.rows) > 0 && pc.sreqs == nil {
				recvErr = make(chan error, 1)
				go func() {
					recvErr <- recvRows(rctx, c.h.mb, pc.step, tagLogits(s.id), len(pc.rows), s.nVocab, pc.logits)
				}()
			}
			var got traffic
			t0 := time.Now()
			sent, recvd, err := c.h.call(ctx, m.Addr, methodStep, &pc.reqs[i], &got)
			control.Add(int64(sent + recvd))
			if recvErr != nil {
				if err != nil {
					rcancel()
				}
				// The member sends the logits before it replies.
				if rerr := <-recvErr; err == nil && rerr != nil {
					err = fmt.Errorf("receiving the logits: %w", rerr)
				}
			}
			if err != nil {
				return err
			}
			c.opt.Times.observe(m.Node, time.Since(t0))
			if got.KVError != "" && kvErr != nil {
				kvMu.Lock()
				if *kvErr == nil {
					*kvErr = fmt.Errorf("%v: %s", m, got.KVError)
				}
				kvMu.Unlock()
			}
			if m == lay.Output && pc.sreqs != nil {
				if len(got.Sampled) != len(pc.rows) {
					return fmt.Errorf("%v sampled %d rows of %d", m, len(got.Sampled), len(pc.rows))
				}
				pc.sampled = got.Sampled
			}
			stageMu.Lock()
			stageCompute[k][m.Stage] = max(stageCompute[k][m.Stage], got.ComputeUs)
			stageMu.Unlock()
			tr[0].Add(got.Activations)
			tr[1].Add(got.Collectives)
			tr[2].Add(got.Logits)
			return nil
		})
	}
	var err error
	if len(pieces) == 1 {
		err = stepPiece(sctx, 0)
	} else {
		// The pieces' steps go out at once: each member runs them in
		// order, so stage 0 computes piece k+1 while stage 1 computes
		// piece k. The first failure cancels the rest.
		pctx, pcancel := context.WithCancel(sctx)
		var once sync.Once
		var wg sync.WaitGroup
		for k := range pieces {
			wg.Go(func() {
				if e := stepPiece(pctx, k); e != nil {
					once.Do(func() {
						err = fmt.Errorf("piece %d of %d (step %d): %w", k+1, len(pieces), pieces[k].step, e)
						pcancel()
					})
				}
			})
		}
		wg.Wait()
		pcancel()
	}
	c.control.Add(control.Load())
	c.act.Add(tr[0].Load())
	c.coll.Add(tr[1].Load())
	c.logits.Add(tr[2].Load())
	if err != nil {
		if ctx.Err() == nil && sctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (no reply within %v)", err, c.opt.Timeout)
		}
		s.fail(fmt.Errorf("dist: session %s step %d: %w", s.id, pieces[0].step, err))
		s.abortAll()
		return nil, nil, s.err
	}
	c.steps.Add(1)
	c.tokens.Add(int64(n))
	c.compute.Add(criticalCompute(stageCompute))
	s.lenMu.Lock()
	for q, p := range s.pos {
		s.seqLen[q] = p
		delete(s.cut, q)
	}
	s.lenMu.Unlock()
	if sreqs != nil {
		if len(pieces) == 1 {
			return nil, pieces[0].sampled, nil
		}
		sampled := make([]sample.Result, len(rows))
		for _, pc := range pieces {
			for j, at := range pc.at {
				sampled[at] = pc.sampled[j]
			}
		}
		return nil, sampled, nil
	}
	if len(pieces) > 1 {
		V := s.nVocab
		for _, pc := range pieces {
			for j, at := range pc.at {
				copy(s.logits[at*V:(at+1)*V], pc.logits[j*V:(j+1)*V])
			}
		}
	}
	if ho != nil {
		// Handoffs run from several goroutines: each gets its own copy.
		return append([]float32(nil), s.logits...), nil, nil
	}
	return s.logits, nil, nil
}

// piece is one step of a batch run as several (pipelined prefill): its
// chunks, their tokens, the logits rows it computes (indexes into its own
// tokens; at maps each to the caller's row), and what came back.
type piece struct {
	step    uint64
	chunks  []wireChunk
	tokens  []int32
	rows    []int
	at      []int
	sreqs   []sample.Request
	reqs    []stepReq
	logits  []float32
	sampled []sample.Result
}

// pieceSize is the tokens per piece of a step of n tokens through the
// plan, 0 to run it as one step: placement.PrefillPiece (what the planner
// predicts prefill with), or Options.Piece (< 0: never cut).
func (c *Cluster) pieceSize(n int) int {
	stages := len(c.lay.Stages)
	switch {
	case c.opt.Piece < 0 || stages < 2:
		return 0
	case c.opt.Piece > 0:
		if n <= c.opt.Piece {
			return 0
		}
		return c.opt.Piece
	}
	return placement.PrefillPiece(stages, n)
}

// chained reports whether a row's draw depends on the row before it
// (sample.Request.After): such rows are sampled together, in one piece.
func chained(reqs []sample.Request) bool {
	for i := range reqs {
		if reqs[i].After != nil {
			return true
		}
	}
	return false
}

// splitPieces cuts a step's tokens (laid out chunk after chunk) into pieces
// of size tokens, the last one shorter; a chunk that straddles a cut is
// split in two at that position. rows (and their sampling requests) go to
// the piece that holds their token.
func splitPieces(chunks []wireChunk, tokens []int32, rows []int, sreqs []sample.Request, size int) []*piece {
	n := len(tokens)
	pieces := make([]*piece, 0, (n+size-1)/size)
	for lo := 0; lo < n; lo += size {
		pieces = append(pieces, &piece{tokens: tokens[lo:min(lo+size, n)]})
	}
	at := 0 // token offset of the current chunk
	for _, ch := range chunks {
		for done := 0; done < ch.N; {
			k := (at + done) / size
			take := min(ch.N-done, (k+1)*size-(at+done))
			pieces[k].chunks = append(pieces[k].chunks, wireChunk{Seq: ch.Seq, Pos: ch.Pos + done, N: take, Cut: ch.Cut && done == 0})
			done += take
		}
		at += ch.N
	}
	for i, r := range rows {
		pc := pieces[r/size]
		pc.rows = append(pc.rows, r%size)
		pc.at = append(pc.at, i)
		if sreqs != nil {
			pc.sreqs = append(pc.sreqs, sreqs[i])
		}
	}
	return pieces
}

// criticalCompute is the compute on a step's critical path from each
// piece's compute per stage: one piece, the sum over its stages; several
// pipelined, the busiest stage's total plus the other stages' share of one
// piece (the fill and drain of the pipeline).
func criticalCompute(stageCompute [][]int64) int64 {
	if len(stageCompute) == 1 {
		var sum int64
		for _, us := range stageCompute[0] {
			sum += us
		}
		return sum
	}
	per := make([]int64, len(stageCompute[0]))
	for _, pc := range stageCompute {
		for st, us := range pc {
			per[st] += us
		}
	}
	busiest := 0
	for st := range per {
		if per[st] > per[busiest] {
			busiest = st
		}
	}
	total := per[busiest]
	for st, us := range per {
		if st != busiest {
			total += us / int64(len(stageCompute))
		}
	}
	return total
}

// abortAll tells every member, in the background and bounded, that the
// session failed, so that members still waiting inside the step give up
// now rather than at their timeout.
func (s *Session) abortAll() {
	s.aborts.Go(func() { s.release(context.Background(), methodAbort) })
}

// release calls method (abort or close) on every member, best effort,
// within abortTimeout.
func (s *Session) release(ctx context.Context, method string) {
	ctx, cancel := context.WithTimeout(ctx, min(abortTimeout, s.c.opt.Timeout))
	defer cancel()
	reason := "closed"
	if s.err != nil {
		reason = s.err.Error()
	}
	// Every member is told, whatever the others answer: a member that is
	// gone must not cancel the call to one that still holds the session
	// (each cancels the rest on the first error).
	_ = s.c.each(ctx, func(ctx context.Context, i int, m memberRef) error {
		var req any = s.addr(m)
		if method == methodAbort {
			req = abortReq{memberAddr: s.addr(m), Reason: reason}
		}
		_, _, _ = s.c.h.call(ctx, m.Addr, method, req, nil)
		return nil
	})
}

// Free drops sequences from every member's KV cache.
func (s *Session) Free(ctx context.Context, seqs ...kv.SeqID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	ids := make([]int32, len(seqs))
	for i, q := range seqs {
		ids[i] = int32(q)
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.opt.Timeout)
	defer cancel()
	err := s.c.each(ctx, func(ctx context.Context, i int, m memberRef) error {
		_, _, err := s.c.h.call(ctx, m.Addr, methodFree, freeReq{memberAddr: s.addr(m), Seqs: ids}, nil)
		return err
	})
	if err != nil {
		s.fail(fmt.Errorf("dist: session %s free: %w", s.id, err))
		s.abortAll()
		return s.err
	}
	s.lenMu.Lock()
	for _, q := range seqs {
		delete(s.seqLen, q)
		delete(s.cut, q)
	}
	s.lenMu.Unlock()
	return nil
}

// Truncate cuts seq back to its first n positions: the members drop the
// rest of its KV at its next step (wireChunk.Cut), so the cut costs no
// round trip of its own. A sequence no longer than n is left as it is.
func (s *Session) Truncate(seq kv.SeqID, n int) {
	s.lenMu.Lock()
	defer s.lenMu.Unlock()
	if p, ok := s.seqLen[seq]; ok && n < p {
		s.seqLen[seq] = max(n, 0)
		s.cut[seq] = true
	}
}

// Close ends the session on every member (best effort, bounded) and
// waits for pending aborts.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.err == nil {
		closed := ErrClosed
		s.gone.Store(&closed)
	}
	s.mu.Unlock()
	s.aborts.Wait()
	s.release(ctx, methodClose)
	return nil
}
