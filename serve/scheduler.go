package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
)

// Errors callers map to HTTP statuses.
var (
	ErrQueueFull = errors.New("the server is at capacity: request queue full")
	ErrTooLong   = errors.New("prompt too long")
	ErrClosed    = errors.New("scheduler closed")
	ErrBadInput  = errors.New("bad request")
)

// Options size the scheduler.
type Options struct {
	MaxSeqs   int // sequences in the running batch (default 16)
	MaxTokens int // tokens per step: decode tokens plus prefill chunks (default 256)
	// PrefillTokens, when above MaxTokens, is a step's budget while no
	// sequence decodes: a prompt with no stream waiting on it prefills in
	// longer steps (fewer trips through a plan's stages, each step
	// pipelined in pieces across them), no longer than PrefillTime at the
	// prefill speed the steps measure (the first at MaxTokens tokens).
	PrefillTokens int
	PrefillTime   time.Duration
	QueueSize     int // requests waiting beyond the running batch (default 64)
	// SeqTokens, when positive, caps every sequence (prompt plus
	// generated) at that many tokens, so that MaxSeqs sequences fit the
	// cache together and none is preempted for another: a plan reserves
	// KV for MaxSeqs sequences of SeqTokens. It is lowered to a whole
	// number of blocks when MaxSeqs of it would not fit. 0: the whole
	// cache is one sequence's limit.
	SeqTokens int
	// NoPrefixCache turns off the reuse of KV blocks across requests that
	// share a prompt prefix (on by default where the engine supports it).
	NoPrefixCache bool
	// Lookup, when positive, drafts up to that many tokens per decode
	// step from the sequence's own context (prompt lookup: what followed
	// the last earlier occurrence of its latest n-gram) and verifies them
	// in the same step: speculative decoding without a draft model. The
	// output is what it would be without (see speculate.go). Only on an
	// engine whose sequences can be cut back (Truncater) and that returns
	// logits.
	Lookup int
	// Draft, when set, drafts the tokens instead (a draft model:
	// ModelDrafter), up to DraftMax a step (default 6). Either way the
	// number drafted adapts to how many the model accepts. The scheduler
	// calls the drafter from its loop only, and closes it on Close when
	// it is an io.Closer.
	Draft    Drafter
	DraftMax int

	// alwaysDraft (tests) drafts whether or not it pays (draftGain).
	alwaysDraft bool
}

func (o *Options) defaults() {
	if o.MaxSeqs <= 0 {
		o.MaxSeqs = 16
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = 256
	}
	if o.MaxTokens < o.MaxSeqs {
		o.MaxTokens = o.MaxSeqs
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 64
	}
}

// Request is one generation.
type Request struct {
	Prompt    []int32
	MaxTokens int // tokens to generate; <= 0 means until end of generation or context
	Sampling  sample.Params
	// TopLogprobs > 0 reports that many alternatives per token; Logprobs
	// reports the chosen token's log-probability.
	Logprobs    bool
	TopLogprobs int
	// Constraint, when set, limits every token drawn to those it allows
	// (constrained decoding); the sequence stops when it is Done.
	Constraint sample.Constraint
}

// TokenLogprob is a token with its log-probability.
type TokenLogprob = sample.TokenLogprob

// Event is one generated token, or the end of the sequence (Done).
type Event struct {
	Token   int32
	Logprob float32
	Top     []TokenLogprob
	// Set on the final event (which carries no token when Done is set).
	Done       bool
	Reason     string // "stop" (end of generation), "length", "cancelled", "error"
	Err        error
	Prompt     int // prompt tokens
	Cached     int // of which read from the prefix cache instead of computed
	Generated  int
	Preempted  int // times the sequence was preempted and recomputed
	TTFT       time.Duration
	TotalTime  time.Duration
	KVCapacity int
	Draws      uint64 // the sampler's random draws after this token
	// Drafted counts the tokens drafted for the sequence (speculative
	// decoding), Accepted those the model agreed with.
	Drafted, Accepted int
}

type seq struct {
	id        kv.SeqID
	ctx       context.Context
	req       Request
	out       chan Event
	tokens    []int32 // prompt + generated
	processed int     // tokens in the KV cache
	generated int
	preempted int
	sampler   *sample.Sampler
	arrived   time.Time
	first     time.Time
	admitted  uint64 // admission order, for choosing the newest to preempt
	cached    int    // prompt positions taken from the prefix cache
	keys      []uint64
	published int // full blocks registered in the prefix cache
	// remote: the prompt is being prefilled elsewhere (RemotePrefiller);
	// local: it is prefilled here (it was not sent, or that failed).
	remote, local bool
	// draft: the tokens drafted for this step after its last token
	// (Options.Lookup, Options.Draft); the step computes a row for each.
	// k is how many to draft next (adapted to what was accepted);
	// drafted and accepted count them for the final event.
	draft             []int32
	k                 int
	drafted, accepted int
}

// Stats is a snapshot of the scheduler's state.
type Stats struct {
	Waiting, Running   int
	KVBlocksUsed       int // held by sequences
	KVBlocksTotal      int
	KVBlocksCached     int // registered in the prefix cache (held or idle)
	LastBatchTokens    int
	LastBatchSeqs      int
	Steps              uint64
	PromptTokens       uint64 // computed
	CachedPromptTokens uint64 // read from the prefix cache
	// RemotePrefills counts prompts prefilled elsewhere (RemotePrefiller),
	// RemoteFailed those of them that failed and were prefilled here, and
	// RemotePrefilling those under way.
	RemotePrefills, RemoteFailed uint64
	RemotePrefilling             int
	GeneratedTokens              uint64
	Preemptions                  uint64
	Completed, Cancelled         uint64
	// DecodeMs is the time of a decode step of one sequence, averaged
	// (exponentially, the latest steps weighing most) over the DecodeSteps
	// such steps: the measured counterpart of a plan's predicted
	// ms/token.
	DecodeMs    float64
	DecodeSteps uint64
	// Drafted counts the tokens drafted (Options.Lookup, Options.Draft),
	// Accepted those of them the model agreed with: tokens that cost no
	// step of their own.
	Drafted, Accepted uint64
}

// decodeWeight is the weight of the latest step in Stats.DecodeMs.
const decodeWeight = 0.1

// Scheduler runs sequences on one runner holding the whole model.
type Scheduler struct {
	r      Engine
	eog    func(int32) bool
	opts   Options
	cap    int  // KV capacity in positions
	seqCap int  // the longest sequence: cap, or less with Options.SeqTokens
	prefix bool // share KV blocks of common prompt prefixes

	drafter  Drafter // nil: no speculation
	draftMax int
	gain     draftGain // whether drafting pays here (speculate.go)

	mu      sync.Mutex
	waiting []*seq
	wake    chan struct{}
	closed  bool
	nextID  kv.SeqID
	order   uint64

	running  []*seq // owned by the loop
	batch    model.Batch
	rows     []int
	rowSeq   []*seq
	reqs     []sample.Request // a RowSampler's, by row
	chunkSeq []*seq
	drafting bool // the batch holds drafts
	// prefillOnly: the batch holds no decode token; prefillSec is the
	// measured time per token of such steps (averaged like DecodeMs).
	prefillOnly bool
	prefillSec  float64
	prefill     []*seq // buildBatch's scratch
	prefillN    []int
	stats       Stats
	statsMu     sync.Mutex
	steps       atomic.Uint64
	done        chan struct{}
}

// New starts the scheduler loop on r. isEOG tells which tokens end a
// generation. Close stops it.
func New(r *model.Runner, isEOG func(int32) bool, o Options) (*Scheduler, error) {
	if lo, hi := r.Range(); lo != 0 || hi != r.Model().NLayer {
		closeDrafter(o.Draft)
		return nil, fmt.Errorf("serve: the runner holds layers [%d,%d); the scheduler needs the whole model", lo, hi)
	}
	return NewEngine(RunnerEngine{r}, isEOG, o)
}

// Engine is the model the scheduler drives, one batch per step: a local
// runner holding every layer (RunnerEngine) or a session of a model
// distributed over several nodes.
type Engine interface {
	// Step reserves KV space for b's chunks (setting their positions), runs
	// the model and returns the logits of the listed rows, len(rows) x
	// NVocab(), valid until the next Step. When the cache cannot hold b it
	// returns kv.ErrFull (possibly wrapped) and nothing changed.
	Step(b *model.Batch, rows []int) ([]float32, error)
	// Free releases a sequence's KV blocks.
	Free(seq kv.SeqID)
	// Cache holds the block accounting the scheduler admits and preempts by.
	Cache() *kv.Cache
	NVocab() int
}

// RunnerEngine is an Engine running a whole model on this machine.
type RunnerEngine struct{ R *model.Runner }

func (e RunnerEngine) Step(b *model.Batch, rows []int) ([]float32, error) { return e.R.Step(b, rows) }
func (e RunnerEngine) Free(seq kv.SeqID)                                  { e.R.Cache().Free(seq) }
func (e RunnerEngine) Cache() *kv.Cache                                   { return e.R.Cache() }
func (e RunnerEngine) NVocab() int                                        { return e.R.Model().NVocab }
func (e RunnerEngine) Truncate(seq kv.SeqID, n int)                       { e.R.Cache().Truncate(seq, n) }

// PrefixCache reports that the runner's cache holds every K and V the
// model reads, so blocks shared through it are complete.
func (e RunnerEngine) PrefixCache() bool { return true }

// RowSampler is an Engine that can sample the rows where their logits are
// computed (the last stage of a plan on another node) and return tokens
// instead of logits: a token and the sampler's state instead of a row of
// the vocabulary's width on the network each step.
type RowSampler interface {
	// SamplesRemotely says whether StepSampled saves anything now.
	SamplesRemotely() bool
	// StepSampled is Step with each row sampled as reqs says (one per
	// row); the results are in row order.
	StepSampled(b *model.Batch, rows []int, reqs []sample.Request) ([]sample.Result, error)
}

// RemotePrefiller is an Engine that may prefill a prompt elsewhere (the
// prefill pool of a disaggregated plan) while it goes on stepping the
// other sequences.
type RemotePrefiller interface {
	// Prefill decides whether seq's prompt (tokens, all computed, the
	// last one's logits returned) is prefilled elsewhere and, if so,
	// starts that and returns true: the sequence's
	// positions are reserved in Cache at once, and the outcome is
	// reported by Landed, after notify was called. false: the scheduler
	// prefills it in its own steps.
	Prefill(seq kv.SeqID, tokens []int32, notify func()) bool
	// Landed returns the remote prefills that finished since the last
	// call, on the scheduler's goroutine. A result without error holds
	// the logits of the prompt's last token and the sequence is in the
	// cache as if its prompt had been stepped; with an error the engine
	// has freed what the sequence held, and the scheduler prefills it
	// itself.
	Landed() []PrefillResult
}

// PrefillResult is the outcome of a remote prefill. Fail, with Err, ends
// the request with that error instead of prefilling it here.
type PrefillResult struct {
	Seq    kv.SeqID
	Logits []float32
	Err    error
	Fail   bool
}

// prefixCacher is an Engine whose Cache can share blocks between sequences
// (kv.Cache.Share); a distributed engine's cache is only a shadow of its
// members' and cannot.
type prefixCacher interface{ PrefixCache() bool }

// NewEngine starts a scheduler driving e.
func NewEngine(e Engine, isEOG func(int32) bool, o Options) (*Scheduler, error) {
	s, err := newScheduler(e, isEOG, o)
	if err != nil {
		closeDrafter(o.Draft)
		return nil, err
	}
	go s.loop()
	return s, nil
}

// closeDrafter closes d when it is an io.Closer: the scheduler owns the
// drafter it is given, started or not.
func closeDrafter(d Drafter) {
	if c, ok := d.(io.Closer); ok {
		c.Close()
	}
}

// newScheduler builds a scheduler whose loop is not started yet (tests
// queue requests before the first step).
func newScheduler(e Engine, isEOG func(int32) bool, o Options) (*Scheduler, error) {
	o.defaults()
	c := e.Cache().Config()
	s := &Scheduler{r: e, eog: isEOG, opts: o, cap: c.NumBlocks * c.BlockSize, wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.seqCap = s.cap
	if o.SeqTokens > 0 {
		s.seqCap = min(o.SeqTokens, s.cap)
		if o.MaxSeqs*blocksFor(s.seqCap, c.BlockSize) > c.NumBlocks {
			s.seqCap = c.NumBlocks / o.MaxSeqs * c.BlockSize
		}
		if s.seqCap <= 0 {
			return nil, fmt.Errorf("serve: a cache of %d blocks of %d tokens cannot hold %d sequences", c.NumBlocks, c.BlockSize, o.MaxSeqs)
		}
	}
	if pc, ok := e.(prefixCacher); ok && pc.PrefixCache() && !o.NoPrefixCache {
		s.prefix = true
	}
	switch {
	case o.Draft != nil:
		s.drafter, s.draftMax = o.Draft, o.DraftMax
		if s.draftMax <= 0 {
			s.draftMax = defaultDraftMax
		}
	case o.Lookup > 0:
		s.drafter, s.draftMax = lookupDrafter{}, o.Lookup
	}
	return s, nil
}

// Capacity is the longest sequence (prompt + generated) the scheduler
// holds: the KV cache capacity in token positions, or Options.SeqTokens.
func (s *Scheduler) Capacity() int { return s.seqCap }

// Submit queues a request and returns the channel its events arrive on. The
// channel is closed after the Done event. Cancelling ctx cancels the
// sequence and frees its KV blocks.
func (s *Scheduler) Submit(ctx context.Context, req Request) (<-chan Event, error) {
	if len(req.Prompt) == 0 {
		return nil, fmt.Errorf("%w: the prompt has no tokens", ErrBadInput)
	}
	if len(req.Prompt) >= s.seqCap {
		return nil, fmt.Errorf("%w: the prompt has %d tokens and the context holds %d (prompt plus at least one generated token)", ErrTooLong, len(req.Prompt), s.seqCap)
	}
	nv := int32(s.r.NVocab())
	for _, t := range req.Prompt {
		if t < 0 || t >= nv {
			return nil, fmt.Errorf("%w: token id %d is outside the vocabulary of %d", ErrBadInput, t, nv)
		}
	}
	if err := req.Sampling.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	if req.TopLogprobs < 0 || req.TopLogprobs > 20 {
		return nil, fmt.Errorf("%w: top_logprobs must be between 0 and 20, got %d", ErrBadInput, req.TopLogprobs)
	}
	// The channel holds every event the sequence can produce, so the loop
	// never blocks on a slow reader.
	n := req.MaxTokens
	if n <= 0 || n > s.seqCap {
		n = s.seqCap
	}
	sq := &seq{ctx: ctx, req: req, out: make(chan Event, n+2), tokens: append([]int32(nil), req.Prompt...),
		sampler: sample.New(req.Sampling, int(nv)), arrived: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if len(s.waiting) >= s.opts.QueueSize {
		return nil, ErrQueueFull
	}
	sq.id = s.nextID
	s.nextID++
	s.waiting = append(s.waiting, sq)
	s.signal()
	return sq.out, nil
}

func (s *Scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Close stops the loop; running and waiting sequences end with ErrClosed.
func (s *Scheduler) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.signal()
	<-s.done
}

// Stats returns a snapshot.
func (s *Scheduler) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	s.statsMu.Unlock()
	s.mu.Lock()
	st.Waiting = len(s.waiting)
	s.mu.Unlock()
	c := s.r.Cache()
	st.KVBlocksTotal = c.Config().NumBlocks
	st.KVBlocksUsed = st.KVBlocksTotal - c.FreeBlocks()
	st.KVBlocksCached = c.CachedBlocks()
	st.Steps = s.steps.Load()
	return st
}

func (s *Scheduler) loop() {
	defer close(s.done)
	defer closeDrafter(s.drafter)
	for {
		s.mu.Lock()
		closed := s.closed
		idle := len(s.waiting) == 0 && len(s.running) == 0
		s.mu.Unlock()
		if closed {
			s.shutdown()
			return
		}
		if idle {
			<-s.wake
			s.land() // a cancelled remote prefill that ended gives its blocks back
			continue
		}
		if !s.step() {
			// Every running sequence waits for a remote prefill.
			<-s.wake
		}
	}
}

func (s *Scheduler) shutdown() {
	s.mu.Lock()
	all := append(s.running, s.waiting...)
	s.waiting, s.running = nil, nil
	s.mu.Unlock()
	for _, sq := range all {
		s.finish(sq, "error", ErrClosed)
	}
}

// finish frees the sequence and sends its final event.
func (s *Scheduler) finish(sq *seq, reason string, err error) {
	s.r.Free(sq.id)
	if s.drafter != nil {
		s.drafter.Forget(sq.id)
	}
	ev := Event{Done: true, Reason: reason, Err: err, Prompt: len(sq.req.Prompt), Cached: sq.cached, Generated: sq.generated,
		Preempted: sq.preempted, TotalTime: time.Since(sq.arrived), KVCapacity: s.seqCap,
		Drafted: sq.drafted, Accepted: sq.accepted}
	if !sq.first.IsZero() {
		ev.TTFT = sq.first.Sub(sq.arrived)
	}
	// Count it before the client sees the end, so Stats read after the
	// final event includes it.
	s.statsMu.Lock()
	switch reason {
	case "cancelled":
		s.stats.Cancelled++
	default:
		s.stats.Completed++
	}
	s.statsMu.Unlock()
	sq.out <- ev
	close(sq.out)
}

func blocksFor(n, bs int) int { return (n + bs - 1) / bs }

// admit moves waiting sequences into the running batch while there is room
// for their first prompt chunk.
func (s *Scheduler) admit() {
	c := s.r.Cache()
	bs := c.Config().BlockSize
	free := c.FreeBlocks()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.waiting) > 0 && len(s.running) < s.opts.MaxSeqs {
		sq := s.waiting[0]
		if sq.ctx.Err() != nil {
			s.waiting = s.waiting[1:]
			s.mu.Unlock()
			s.finish(sq, "cancelled", sq.ctx.Err())
			s.mu.Lock()
			continue
		}
		// Keep a block per running sequence in reserve for their decoding.
		need := blocksFor(min(len(sq.tokens), s.opts.MaxTokens), bs) + len(s.running)
		if need > free && len(s.running) > 0 {
			break
		}
		free -= need
		s.waiting = s.waiting[1:]
		s.order++
		sq.admitted = s.order
		s.running = append(s.running, sq)
		if s.prefix && sq.processed == 0 {
			s.share(c, sq)
		}
	}
}

// share starts sq from the cached blocks of its longest cached prefix,
// leaving at least its last token to compute (its logits are needed).
func (s *Scheduler) share(c *kv.Cache, sq *seq) {
	sq.keys = c.PrefixKeys(sq.tokens[:len(sq.tokens)-1], sq.keys)
	n := c.Share(sq.id, sq.tokens, sq.keys)
	if n == 0 {
		return
	}
	sq.processed = n
	sq.published = n / c.Config().BlockSize
	if sq.generated == 0 {
		sq.cached = n
		s.statsMu.Lock()
		s.stats.CachedPromptTokens += uint64(n)
		s.statsMu.Unlock()
	}
}

// publish registers sq's newly filled blocks in the prefix cache.
func (s *Scheduler) publish(sq *seq) {
	c := s.r.Cache()
	full := sq.processed / c.Config().BlockSize
	if full <= sq.published {
		return
	}
	sq.keys = c.PrefixKeys(sq.tokens[:sq.processed], sq.keys)
	c.Publish(sq.id, sq.tokens, sq.keys)
	sq.published = full
}

// preemptNewest evicts the most recently admitted running sequence: its KV
// blocks are freed and it goes back to the front of the queue, to be
// recomputed from its prompt and the tokens generated so far.
func (s *Scheduler) preemptNewest() bool {
	if len(s.running)-len(s.remoteSeqs()) <= 1 {
		return false
	}
	newest := -1
	for i, sq := range s.running {
		if !sq.remote && (newest < 0 || sq.admitted > s.running[newest].admitted) {
			newest = i
		}
	}
	if newest < 0 {
		return false
	}
	sq := s.running[newest]
	s.running = append(s.running[:newest], s.running[newest+1:]...)
	s.r.Free(sq.id)
	sq.processed, sq.published = 0, 0
	sq.preempted++
	s.mu.Lock()
	s.waiting = append([]*seq{sq}, s.waiting...)
	s.mu.Unlock()
	s.statsMu.Lock()
	s.stats.Preemptions++
	s.statsMu.Unlock()
	return true
}

// step runs one batch; false when nothing could run (every running
// sequence waits for a remote prefill).
func (s *Scheduler) step() bool {
	defer s.noteRunning()
	s.land()
	s.admit()
	s.sendRemote()
	// Drop cancelled sequences first: their blocks go back to the pool now.
	kept := s.running[:0]
	for _, sq := range s.running {
		if err := sq.ctx.Err(); err != nil {
			s.finish(sq, "cancelled", err)
			continue
		}
		kept = append(kept, sq)
	}
	s.running = kept
	if len(s.running) == 0 {
		return true
	}
	// Decode tokens first (oldest first), then prefill chunks in the
	// remaining budget.
	sort.SliceStable(s.running, func(i, j int) bool { return s.running[i].admitted < s.running[j].admitted })
	for {
		s.buildBatch()
		if len(s.batch.Chunks) == 0 {
			return false
		}
		var logits []float32
		var sampled []sample.Result
		var err error
		t0 := time.Now()
		if rs, ok := s.r.(RowSampler); ok && rs.SamplesRemotely() && len(s.rows) > 0 && s.sampledRequests() {
			sampled, err = rs.StepSampled(&s.batch, s.rows, s.reqs)
		} else {
			logits, err = s.r.Step(&s.batch, s.rows)
		}
		took := time.Since(t0)
		if errors.Is(err, kv.ErrFull) {
			if s.preemptNewest() {
				continue
			}
			// A lone sequence that cannot grow has reached the context.
			for _, sq := range s.running {
				if !sq.remote {
					s.finish(sq, "length", nil)
				}
			}
			s.running = s.remoteOnly()
			return true
		}
		if err != nil {
			for _, sq := range s.running {
				if !sq.remote {
					s.finish(sq, "error", err)
				}
			}
			s.running = s.remoteOnly()
			return true
		}
		if len(s.batch.Chunks) == 1 && len(s.batch.Tokens) == 1 {
			s.noteDecode(took)
		}
		if s.prefillOnly {
			s.notePrefill(took, len(s.batch.Tokens))
		}
		if s.drafter == nil || len(s.prefill) > 0 {
			s.afterStep(logits, sampled)
			return true
		}
		// A decode-only step of a drafting scheduler: its tokens a second
		// tell whether drafting pays (draftGain).
		emitted := s.generated()
		s.afterStep(logits, sampled)
		s.gain.note(s.drafting, took, int(s.generated()-emitted))
		return true
	}
}

// generated is Stats.GeneratedTokens.
func (s *Scheduler) generated() uint64 {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return s.stats.GeneratedTokens
}

// noteDecode adds a decode step of one sequence to Stats.DecodeMs.
func (s *Scheduler) noteDecode(d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if s.stats.DecodeSteps == 0 {
		s.stats.DecodeMs = ms
	} else {
		s.stats.DecodeMs += decodeWeight * (ms - s.stats.DecodeMs)
	}
	s.stats.DecodeSteps++
}

// prefillBudget is a step's token budget while no sequence decodes.
func (s *Scheduler) prefillBudget() int {
	o := &s.opts
	if o.PrefillTokens <= o.MaxTokens {
		return o.MaxTokens
	}
	if o.PrefillTime <= 0 {
		return o.PrefillTokens
	}
	if s.prefillSec <= 0 {
		return o.MaxTokens // measure first
	}
	return max(o.MaxTokens, min(o.PrefillTokens, int(o.PrefillTime.Seconds()/s.prefillSec)))
}

// notePrefill adds a step of n tokens, none of them decoding, that took
// d to the measured prefill speed.
func (s *Scheduler) notePrefill(d time.Duration, n int) {
	if n < 16 {
		return // a short prompt's step measures the step's fixed cost
	}
	sec := d.Seconds() / float64(n)
	if s.prefillSec == 0 {
		s.prefillSec = sec
		return
	}
	s.prefillSec += 0.3 * (sec - s.prefillSec)
}

// remoteSeqs lists the running sequences that wait for a remote prefill.
func (s *Scheduler) remoteSeqs() []*seq {
	var out []*seq
	for _, sq := range s.running {
		if sq.remote {
			out = append(out, sq)
		}
	}
	return out
}

// remoteOnly is the running sequences that wait for a remote prefill.
func (s *Scheduler) remoteOnly() []*seq {
	kept := s.running[:0]
	for _, sq := range s.running {
		if sq.remote {
			kept = append(kept, sq)
		}
	}
	return kept
}

// sendRemote offers the prompts not yet computed to a RemotePrefiller.
func (s *Scheduler) sendRemote() {
	rp, ok := s.r.(RemotePrefiller)
	if !ok {
		return
	}
	n := 0
	for _, sq := range s.running {
		if !sq.remote && !sq.local && sq.processed == 0 && sq.generated == 0 && len(sq.tokens) > 1 && sq.ctx.Err() == nil {
			sq.remote = rp.Prefill(sq.id, sq.tokens, s.signal)
			sq.local = !sq.remote
		}
		if sq.remote {
			n++
		}
	}
	s.statsMu.Lock()
	s.stats.RemotePrefilling = n
	s.statsMu.Unlock()
}

// land takes the remote prefills that finished: a sequence whose prompt
// landed gets its first token from the logits; one whose prefill failed is
// prefilled here.
func (s *Scheduler) land() {
	rp, ok := s.r.(RemotePrefiller)
	if !ok {
		return
	}
	res := rp.Landed()
	if len(res) == 0 {
		return
	}
	byID := map[kv.SeqID]*seq{}
	for _, sq := range s.running {
		if sq.remote {
			byID[sq.id] = sq
		}
	}
	finished := map[*seq]bool{}
	for _, r := range res {
		sq := byID[r.Seq]
		if sq == nil {
			continue // cancelled meanwhile: the engine dropped it
		}
		sq.remote = false
		if r.Err != nil {
			sq.local = true
			s.statsMu.Lock()
			s.stats.RemoteFailed++
			s.statsMu.Unlock()
			if r.Fail {
				s.finish(sq, "error", fmt.Errorf("the prompt's prefill on the prefill pool failed: %w", r.Err))
				finished[sq] = true
			}
			continue
		}
		sq.processed = len(sq.tokens)
		s.statsMu.Lock()
		s.stats.RemotePrefills++
		s.stats.PromptTokens += uint64(len(sq.tokens))
		s.statsMu.Unlock()
		if s.emit(sq, r.Logits) {
			finished[sq] = true
		}
	}
	s.drop(finished)
}

// drop removes finished sequences from the running batch.
func (s *Scheduler) drop(finished map[*seq]bool) {
	if len(finished) == 0 {
		return
	}
	kept := s.running[:0]
	for _, sq := range s.running {
		if !finished[sq] {
			kept = append(kept, sq)
		}
	}
	s.running = kept
}

func (s *Scheduler) noteRunning() {
	s.statsMu.Lock()
	s.stats.Running = len(s.running)
	s.statsMu.Unlock()
}

func (s *Scheduler) buildBatch() {
	b := &s.batch
	b.Tokens, b.Chunks = b.Tokens[:0], b.Chunks[:0]
	s.rows, s.rowSeq, s.chunkSeq = s.rows[:0], s.rowSeq[:0], s.chunkSeq[:0]
	budget := s.opts.MaxTokens
	decoding := 0
	for _, sq := range s.running {
		sq.draft = sq.draft[:0]
		if !sq.remote && len(sq.tokens)-sq.processed == 1 {
			decoding++
		}
	}
	if s.prefillOnly = decoding == 0; s.prefillOnly {
		budget = s.prefillBudget()
	}
	add := func(sq *seq, n int) {
		b.Chunks = append(b.Chunks, model.Chunk{Seq: sq.id, N: n})
		s.chunkSeq = append(s.chunkSeq, sq)
		b.Tokens = append(b.Tokens, sq.tokens[sq.processed:sq.processed+n]...)
		if sq.processed+n == len(sq.tokens) {
			s.rows = append(s.rows, len(b.Tokens)-1)
			s.rowSeq = append(s.rowSeq, sq)
		}
		budget -= n
	}
	s.prefill = s.prefill[:0]
	s.drafting = false
	for _, sq := range s.running {
		if sq.remote {
			continue
		}
		if len(sq.tokens)-sq.processed == 1 {
			decoding--
			// Drafts take what the other decode tokens leave of the budget.
			if k := s.draftFor(sq, budget-1-decoding); k > 0 {
				s.addDrafted(sq)
				s.drafting = true
				budget -= 1 + k
				continue
			}
			add(sq, 1)
		} else {
			s.prefill = append(s.prefill, sq)
		}
	}
	// Every prefilling sequence gets an equal share of what the decode
	// tokens leave (MaxTokens >= MaxSeqs: at least a token each), then
	// what shorter prompts leave goes to the oldest: no running sequence
	// waits a step for another's prefill.
	if len(s.prefill) > 0 {
		n := s.prefillN[:0]
		left := budget
		share := max(1, budget/len(s.prefill))
		for _, sq := range s.prefill {
			k := min(len(sq.tokens)-sq.processed, share, left)
			n = append(n, k)
			left -= k
		}
		for i, sq := range s.prefill {
			k := min(len(sq.tokens)-sq.processed-n[i], left)
			n[i] += k
			left -= k
		}
		for i, sq := range s.prefill {
			if n[i] > 0 {
				add(sq, n[i])
			}
		}
		s.prefillN = n
	}
	s.statsMu.Lock()
	s.stats.LastBatchTokens = len(b.Tokens)
	s.stats.LastBatchSeqs = len(b.Chunks)
	s.statsMu.Unlock()
}

func (s *Scheduler) afterStep(logits []float32, sampled []sample.Result) {
	s.steps.Add(1)
	V := s.r.NVocab()
	var prompt uint64
	for i, c := range s.batch.Chunks {
		sq := s.chunkSeq[i]
		if len(sq.draft) > 0 {
			continue // verify advances it by what it keeps
		}
		prompt += uint64(max(0, min(sq.processed+c.N, len(sq.req.Prompt))-sq.processed))
		sq.processed += c.N
		if s.prefix {
			s.publish(sq)
		}
	}
	finished := map[*seq]bool{}
	for i := 0; i < len(s.rowSeq); i++ {
		sq := s.rowSeq[i]
		var done bool
		switch {
		case len(sq.draft) > 0 && sampled != nil:
			n := len(sq.draft)
			done = s.verify(sq, nil, sampled[i:i+1+n])
			i += n
		case len(sq.draft) > 0:
			n := len(sq.draft)
			done = s.verify(sq, logits[i*V:(i+1+n)*V], nil)
			i += n
		case sampled != nil:
			done = s.emitSampled(sq, &sampled[i])
		default:
			done = s.emit(sq, logits[i*V:(i+1)*V])
		}
		if done {
			finished[sq] = true
		}
	}
	s.statsMu.Lock()
	s.stats.PromptTokens += prompt
	s.statsMu.Unlock()
	s.drop(finished)
}

// emit samples sq's next token from the logits of its last token and sends
// it; true when that ended the sequence.
func (s *Scheduler) emit(sq *seq, l []float32) bool {
	var allow []uint64
	if c := sq.req.Constraint; c != nil {
		if allow = c.Mask(); allow != nil && noneSet(allow) {
			s.finish(sq, "error", errNothingAllowed)
			return true
		}
	}
	tok := sq.sampler.SampleAllowed(l, sq.tokens, allow)
	ev := Event{Token: tok, Draws: sq.sampler.Draws()}
	if sq.req.Logprobs || sq.req.TopLogprobs > 0 {
		ev.Logprob, ev.Top = sample.Logprobs(l, tok, sq.req.TopLogprobs)
	}
	return s.send(sq, ev)
}

// emitSampled sends the token the engine sampled for sq where its logits
// are (RowSampler), sq's sampler taking the random state the draw left;
// true when that ended the sequence.
func (s *Scheduler) emitSampled(sq *seq, r *sample.Result) bool {
	if err := sq.sampler.Adopt(r); err != nil {
		s.finish(sq, "error", err)
		return true
	}
	ev := Event{Token: r.Token, Draws: sq.sampler.Draws()}
	if sq.req.Logprobs || sq.req.TopLogprobs > 0 {
		ev.Logprob, ev.Top = r.Logprob, r.Top
	}
	return s.send(sq, ev)
}

// errNothingAllowed ends a constrained sequence whose constraint allows no
// token at all (a grammar that cannot go on, and cannot end, here).
var errNothingAllowed = errors.New("serve: the request's grammar allows no token here")

// noneSet reports whether a token bitset is empty.
func noneSet(bits []uint64) bool {
	for _, w := range bits {
		if w != 0 {
			return false
		}
	}
	return true
}

// send delivers sq's next token; true when that ended the sequence.
func (s *Scheduler) send(sq *seq, ev Event) bool {
	tok := ev.Token
	if c := sq.req.Constraint; c != nil {
		if err := c.Accept(tok); err != nil {
			s.finish(sq, "error", err)
			return true
		}
	}
	if sq.first.IsZero() {
		sq.first = time.Now()
	}
	sq.generated++
	s.statsMu.Lock()
	s.stats.GeneratedTokens++
	s.statsMu.Unlock()
	if s.eog(tok) {
		s.finish(sq, "stop", nil)
		return true
	}
	sq.tokens = append(sq.tokens, tok)
	sq.out <- ev
	if c := sq.req.Constraint; c != nil && c.Done() {
		s.finish(sq, "stop", nil)
		return true
	}
	if (sq.req.MaxTokens > 0 && sq.generated >= sq.req.MaxTokens) || len(sq.tokens) >= s.seqCap {
		s.finish(sq, "length", nil)
		return true
	}
	return false
}
