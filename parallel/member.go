package parallel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"shoal/engine/device"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/placement"
	"shoal/shard"
	"shoal/transport"
)

// MemberConfig describes one member of a plan on this node.
type MemberConfig struct {
	Plan placement.Plan
	// Pool is the role of the plan's pool the member belongs to ("" for
	// the first pool).
	Pool string
	// Node is this node's ID in the plan; Addrs maps every node of the
	// plan to its endpoint address.
	Node  string
	Addrs map[string]string
	// Spec is the member's shard (shard.SpecsFor) and Model the weights it
	// holds (shard.Shard.Model), which must outlive the member.
	Spec  shard.ShardSpec
	Model *model.Model
	// Runner options of every session: worker threads (all cores if 0),
	// KV capacity in tokens over all sequences (the model's context if 0)
	// and KV block size (the engine's default if 0).
	Threads     int
	CacheTokens int
	BlockSize   int
	// Device runs the member's layers (the CPU if nil).
	Device device.Device
}

// Member is the runtime of one member of a plan: for every session a
// driver opens, a model.Runner of the member's layers and slice (and a
// collective of its stage's tensor-parallel group), which runs the
// session's steps as they come.
type Member struct {
	h   *Host
	cfg MemberConfig
	lay *layout
	me  memberRef
	key string

	mu       sync.Mutex
	sessions map[string]*memberSession
	opening  map[string]int // places reserved by opens under way, by node
	closed   bool
	busy     atomic.Int32
}

// memberKey names a member of a plan on its host.
func memberKey(l *layout, m memberRef) string {
	return fmt.Sprintf("%s/v%d/%s/%s", l.Model, l.Version, l.Pool, m.key())
}

// AddMember starts serving a member of a plan on h.
func (h *Host) AddMember(cfg MemberConfig) (*Member, error) {
	if cfg.Model == nil {
		return nil, errors.New("dist: member without a model")
	}
	lay, err := newLayout(cfg.Plan, cfg.Pool, cfg.Addrs)
	if err != nil {
		return nil, err
	}
	me, err := lay.locate(cfg.Node, cfg.Spec.Lo, cfg.Spec.Hi, cfg.Spec.TPRank)
	if err != nil {
		return nil, err
	}
	if err := lay.checkSpec(me, cfg.Spec); err != nil {
		return nil, err
	}
	w := cfg.Model.W
	switch size := len(lay.Stages[me.Stage].Members); {
	case max(cfg.Spec.TPSize, 1) != size:
		return nil, fmt.Errorf("dist: %v: the shard is for a group of %d, the stage has %d members", me, cfg.Spec.TPSize, size)
	case (me.Embedding || me == lay.Embedder) && w.TokEmbd == nil:
		return nil, fmt.Errorf("dist: %v embeds but its weights hold no token embedding", me)
	case me == lay.Output && (w.Output == nil || w.OutputNorm == nil):
		return nil, fmt.Errorf("dist: %v computes the logits but its weights hold no output", me)
	}
	m := &Member{h: h, cfg: cfg, lay: lay, me: me, key: memberKey(lay, me), sessions: map[string]*memberSession{}, opening: map[string]int{}}
	if err := h.add(m.key, m); err != nil {
		return nil, err
	}
	return m, nil
}

// Busy is the number of steps the member is running.
func (m *Member) Busy() int { return int(m.busy.Load()) }

// Sessions is the number of open sessions.
func (m *Member) Sessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

// Close ends the member's sessions (waiting for steps in progress) and
// stops serving it.
func (m *Member) Close() error {
	m.h.remove(m.key, m)
	m.mu.Lock()
	m.closed = true
	ss := m.sessions
	m.sessions = map[string]*memberSession{}
	m.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
	return nil
}

// memberSession is a member's part of one session.
type memberSession struct {
	m       *Member
	id      string
	timeout time.Duration
	act     transport.DType
	driver  string
	runner  *model.Runner
	coll    *countingGroup // nil outside a tensor-parallel group

	ctx    context.Context // ended by abort and close
	cancel context.CancelFunc

	// peer is the node that opened the session and from its address
	// (its driver); used the last time a call named the session (unix
	// nanoseconds) and active the calls using it now.
	peer   string
	from   netip.AddrPort
	used   atomic.Int64
	active atomic.Int32

	stateMu sync.Mutex
	err     error // sticky: why the session is unusable

	importMu sync.Mutex
	imports  map[uint64]*kvImport // KV imports of disaggregated prefill, by transfer

	stepMu sync.Mutex // one step (or free) at a time; held by close
	next   uint64     // the step to run next
	turn   sync.Cond  // on stepMu: a step ended (a later one may be waiting its turn)
	x, emb []float32
	wire   []byte // scratch of roundRows
	logits []float32
	batch  model.Batch
	// samplers sample rows here for the driver (stepReq.Sample), by
	// parameters: their buffers are the vocabulary's width.
	samplers map[sample.Params]*sample.Sampler
}

// openResp tells the driver the shapes it needs.
type openResp struct {
	NEmbd  int `json:"n_embd"`
	NVocab int `json:"n_vocab"`
}

// reserve takes a place for a session of node peer before its runner is
// built. At a limit it closes the least recently used session that has
// been unused for Idle (of that node at PerPeer, of any at Total) to make
// room, or refuses with 429.
func (m *Member) reserve(peer string) error {
	l := m.h.sessionLimits()
	now := time.Now()
	m.mu.Lock()
	mine, total := m.opening[peer], 0
	for _, n := range m.opening {
		total += n
	}
	for _, s := range m.sessions {
		total++
		if s.peer == peer {
			mine++
		}
	}
	var evict *memberSession
	switch {
	case mine >= l.PerPeer:
		if evict = m.lruLocked(now, l.Idle, peer); evict == nil {
			m.mu.Unlock()
			return transport.Errorf(http.StatusTooManyRequests, "dist: node %s holds %d sessions on %v, the most one node may: close the sessions it no longer uses", peer, mine, m.me)
		}
	case total >= l.Total:
		if evict = m.lruLocked(now, l.Idle, ""); evict == nil {
			m.mu.Unlock()
			return transport.Errorf(http.StatusTooManyRequests, "dist: %v holds %d sessions, the most it keeps: try again once one closes", m.me, total)
		}
	}
	if evict != nil {
		delete(m.sessions, evict.id)
	}
	m.opening[peer]++
	m.mu.Unlock()
	if evict != nil {
		evict.fail(fmt.Errorf("dist: session %s was unused for %v and closed to make room for another", evict.id, l.Idle))
		evict.close()
	}
	return nil
}

func (m *Member) unreserveLocked(peer string) {
	if m.opening[peer]--; m.opening[peer] <= 0 {
		delete(m.opening, peer)
	}
}

// lruLocked is the least recently used session (of node peer, unless
// empty) unused for idle, or nil.
func (m *Member) lruLocked(now time.Time, idle time.Duration, peer string) *memberSession {
	var lru *memberSession
	for _, s := range m.sessions {
		if (peer == "" || s.peer == peer) && s.idle(now, idle) && (lru == nil || s.used.Load() < lru.used.Load()) {
			lru = s
		}
	}
	return lru
}

// idleSessions lists the sessions unused for idle.
func (m *Member) idleSessions(now time.Time, idle time.Duration) []*memberSession {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*memberSession
	for _, s := range m.sessions {
		if s.idle(now, idle) {
			out = append(out, s)
		}
	}
	return out
}

// reclaim closes session s, failing it with why.
func (m *Member) reclaim(s *memberSession, why string) {
	m.mu.Lock()
	mine := m.sessions[s.id] == s
	if mine {
		delete(m.sessions, s.id)
	}
	m.mu.Unlock()
	if mine {
		s.fail(fmt.Errorf("dist: session %s closed: %s", s.id, why))
		s.close()
	}
}

// touch records a use of the session.
func (s *memberSession) touch() { s.used.Store(time.Now().UnixNano()) }

// idle tells whether no call has used the session for d.
func (s *memberSession) idle(now time.Time, d time.Duration) bool {
	return s.active.Load() == 0 && now.UnixNano()-s.used.Load() >= int64(d)
}

// addrPort is a peer's UDP address as the endpoint's PeerStats key it.
func addrPort(a net.Addr) netip.AddrPort {
	u, ok := a.(*net.UDPAddr)
	if !ok {
		return netip.AddrPort{}
	}
	ap := u.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (m *Member) open(peer transport.Peer, req *openReq) (*openResp, error) {
	if req.Stage != m.me.Stage || req.Rank != m.me.Rank || req.Version != m.lay.Version {
		return nil, transport.Errorf(http.StatusConflict, "dist: %v of plan version %d was asked for stage %d rank %d of version %d",
			m.me, m.lay.Version, req.Stage, req.Rank, req.Version)
	}
	if !req.Activations.Valid() || !req.Collectives.Valid() || req.TimeoutMs <= 0 || req.Session == "" {
		return nil, transport.Errorf(http.StatusBadRequest, "dist: invalid session options")
	}
	if err := m.reserve(peer.ID); err != nil {
		return nil, err
	}
	reserved := true
	defer func() {
		if reserved {
			m.mu.Lock()
			m.unreserveLocked(peer.ID)
			m.mu.Unlock()
		}
	}()
	s := &memberSession{m: m, id: req.Session, samplers: map[sample.Params]*sample.Sampler{}, timeout: time.Duration(req.TimeoutMs) * time.Millisecond,
		act: req.Activations, driver: req.Driver, next: 1, peer: peer.ID, from: addrPort(peer.Addr)}
	s.turn.L = &s.stepMu
	s.touch()
	st := m.lay.Stages[m.me.Stage]
	var coll model.Collective
	if len(st.Members) > 1 {
		addrs := make([]string, len(st.Members))
		for i, p := range st.Members {
			addrs[i] = p.Addr
		}
		gc := transport.GroupConfig{ID: fmt.Sprintf("%s/s%d", req.Session, m.me.Stage),
			Members: addrs, Rank: m.me.Rank, DType: req.Collectives, Timeout: s.timeout}
		sum, err := transport.NewGroup(m.h.ep, gc)
		if err != nil {
			return nil, err
		}
		gc.ID += "g"
		gc.DType = transport.F32
		gather, err := transport.NewGroup(m.h.ep, gc)
		if err != nil {
			sum.Close()
			return nil, err
		}
		s.coll = &countingGroup{sum: sum, gather: gather, dt: req.Collectives}
		coll = s.coll
	}
	cfg := &m.cfg
	kt, err := KVType(&cfg.Plan)
	if err != nil {
		if s.coll != nil {
			s.coll.close()
		}
		return nil, err
	}
	r, err := model.NewRunner(cfg.Model, model.Options{Threads: cfg.Threads, Lo: st.Lo, Hi: st.Hi,
		CacheTokens: cfg.CacheTokens, BlockSize: cfg.BlockSize, Slice: cfg.Spec.Slice(&cfg.Model.Config), Collective: coll, Device: cfg.Device, KVType: kt})
	if err != nil {
		if s.coll != nil {
			s.coll.close()
		}
		return nil, fmt.Errorf("dist: %v: %w", m.me, err)
	}
	s.runner = r
	s.ctx, s.cancel = context.WithCancel(context.Background())
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unreserveLocked(peer.ID)
	reserved = false
	if m.closed || m.sessions[req.Session] != nil {
		s.close()
		if m.closed {
			return nil, ErrClosed
		}
		return nil, transport.Errorf(http.StatusConflict, "dist: session %s is already open on %v", req.Session, m.me)
	}
	m.sessions[req.Session] = s
	return &openResp{NEmbd: cfg.Model.NEmbd, NVocab: cfg.Model.NVocab}, nil
}

func (m *Member) session(id string) (*memberSession, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[id]; s != nil {
		s.touch()
		return s, nil
	}
	return nil, transport.Errorf(http.StatusNotFound, "dist: no session %s on %v", id, m.me)
}

func (m *Member) abort(id string, why error) {
	if s, err := m.session(id); err == nil {
		s.fail(fmt.Errorf("aborted by the driver: %w", why))
	}
}

func (m *Member) closeSession(id string) {
	m.mu.Lock()
	s := m.sessions[id]
	delete(m.sessions, id)
	m.mu.Unlock()
	if s != nil {
		s.close()
	}
}

func (m *Member) free(req *freeReq) error {
	s, err := m.session(req.Session)
	if err != nil {
		return err
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	for _, q := range req.Seqs {
		s.runner.Cache().Free(kv.SeqID(q))
	}
	return nil
}

// fail makes the session unusable: the step in progress is cancelled
// (its collective calls fail at once) and later ones are refused.
func (s *memberSession) fail(err error) {
	s.stateMu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.stateMu.Unlock()
	s.cancel()
	if s.coll != nil {
		s.coll.close()
	}
}

func (s *memberSession) failed() error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.err
}

// close fails the session and releases its runner once no step runs.
func (s *memberSession) close() {
	if s.cancel != nil {
		s.fail(ErrClosed)
	} else if s.coll != nil {
		s.coll.close()
	}
	s.endImports()
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	if s.runner != nil {
		s.runner.Close()
		s.runner = nil
	}
}

func (m *Member) step(ctx context.Context, req *stepReq) (*traffic, error) {
	s, err := m.session(req.Session)
	if err != nil {
		return nil, err
	}
	m.busy.Add(1)
	defer m.busy.Add(-1)
	s.active.Add(1)
	defer s.active.Add(-1)
	defer s.touch()
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	defer s.turn.Broadcast()
	if req.Step > s.next {
		// A pipelined prefill sends its pieces' steps at once: this one
		// waits until the earlier ones have run here.
		if err := s.awaitTurn(ctx, req.Step); err != nil {
			return nil, err
		}
	}
	if err := s.failed(); err != nil {
		return nil, fmt.Errorf("dist: session %s is unusable on %v: %w", s.id, m.me, err)
	}
	if s.runner == nil {
		return nil, ErrClosed
	}
	if req.Step != s.next {
		err := fmt.Errorf("dist: %v got step %d of session %s, expected %d", m.me, req.Step, s.id, s.next)
		s.fail(err)
		return nil, err
	}
	s.next++
	// A member gives up a little before the driver does, so that its
	// error, which names the peer it waited for, reaches the driver.
	sctx, cancel := context.WithTimeout(s.ctx, s.timeout*3/4)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	var tr traffic
	if err := s.run(sctx, req, &tr); err != nil {
		if s.failed() == nil {
			err = fmt.Errorf("dist: %v, step %d: %w", m.me, req.Step, err)
		} else {
			err = fmt.Errorf("dist: %v, step %d: %w (%v)", m.me, req.Step, err, s.failed())
		}
		s.fail(err)
		return nil, err
	}
	if s.coll != nil {
		tr.Collectives = s.coll.bytes.Swap(0)
	}
	return &tr, nil
}

// awaitTurn waits (s.stepMu held, released while waiting) until step is
// the next to run, the session fails or closes, or ctx ends.
func (s *memberSession) awaitTurn(ctx context.Context, step uint64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopS := context.AfterFunc(s.ctx, cancel)
	defer stopS()
	stopW := context.AfterFunc(wctx, func() {
		s.stepMu.Lock()
		s.turn.Broadcast()
		s.stepMu.Unlock()
	})
	defer stopW()
	for step > s.next && wctx.Err() == nil && s.runner != nil {
		s.turn.Wait()
	}
	if step > s.next && s.failed() == nil && s.runner != nil {
		return fmt.Errorf("dist: %v, step %d: still waiting for step %d of session %s: %w", s.m.me, step, s.next, s.id, context.Cause(wctx))
	}
	return nil
}

// run executes one step on this member: take the input (embed it, or
// receive it from the embedder or the previous stage), run the layers,
// and pass the result on (next stage, or logits to the driver).
func (s *memberSession) run(ctx context.Context, req *stepReq, tr *traffic) error {
	m, lay, me := s.m, s.m.lay, s.m.me
	r := s.runner
	E := m.cfg.Model.NEmbd
	b := &s.batch
	b.Chunks = b.Chunks[:0]
	n := 0
	for _, c := range req.Chunks {
		if c.N <= 0 {
			return fmt.Errorf("chunk of sequence %d has %d tokens", c.Seq, c.N)
		}
		b.Chunks = append(b.Chunks, model.Chunk{Seq: kv.SeqID(c.Seq), N: c.N})
		n += c.N
	}
	if n == 0 {
		return errors.New("empty step")
	}
	b.Tokens = req.Tokens
	c := r.Cache()
	for _, ch := range req.Chunks {
		if !ch.Cut {
			continue
		}
		if have := c.Len(kv.SeqID(ch.Seq)); ch.Pos > have {
			return fmt.Errorf("sequence %d is cut back to position %d but holds %d here", ch.Seq, ch.Pos, have)
		}
		c.Truncate(kv.SeqID(ch.Seq), ch.Pos)
	}
	embedder := me == lay.Embedder
	embeds := embedder || (me.Stage == 0 && me.Embedding)
	if embeds && len(req.Tokens) != n {
		return fmt.Errorf("step has %d tokens, its chunks cover %d", len(req.Tokens), n)
	}
	if err := r.Reserve(b); err != nil {
		return err
	}
	for i, c := range b.Chunks {
		if c.Pos != req.Chunks[i].Pos {
			return fmt.Errorf("sequence %d is at position %d here, the driver says %d", c.Seq, c.Pos, req.Chunks[i].Pos)
		}
	}
	s.x = grow(s.x, n*E)
	x := s.x
	if embedder {
		e := x
		if me.Stage != 0 {
			s.emb = grow(s.emb, n*E)
			e = s.emb
		}
		if err := r.Embed(req.Tokens, e); err != nil {
			return err
		}
		var targets []memberRef
		for _, t := range lay.Stages[0].Members {
			if lay.receivesEmbedding(t) && t != me {
				targets = append(targets, t)
			}
		}
		sent, err := fanOut(ctx, targets, func(t memberRef) (int64, error) {
			return sendRows(ctx, m.h.mb, t.Addr, req.Step, tagEmbed(s.id), s.act, n, E, e)
		})
		tr.Activations += sent
		if err != nil {
			return fmt.Errorf("sending the embedding: %w", err)
		}
		if len(targets) > 0 && me.Stage == 0 {
			// The group must hold one hidden state: this member's too
			// is what its peers decoded.
			s.wire = roundRows(s.act, n, E, e, s.wire)
		}
	}
	switch {
	case me.Stage == 0 && me.Embedding:
		if !embedder {
			if err := r.Embed(req.Tokens, x); err != nil {
				return err
			}
		}
	case me.Stage == 0:
		if err := recvRows(ctx, m.h.mb, req.Step, tagEmbed(s.id), n, E, x); err != nil {
			return fmt.Errorf("waiting for the embedding from %v: %w", lay.Embedder, err)
		}
	default:
		from := lay.Stages[me.Stage-1].Members[0]
		if err := recvRows(ctx, m.h.mb, req.Step, tagHidden(s.id, me.Stage), n, E, x); err != nil {
			return fmt.Errorf("waiting for the hidden state from %v: %w", from, err)
		}
	}
	st := lay.Stages[me.Stage]
	var waited0 int64
	if s.coll != nil {
		waited0 = s.coll.waited.Load()
	}
	t0 := time.Now()
	kvDone, err := s.forward(ctx, req, b, st.Lo, st.Hi, x)
	tr.ComputeUs = time.Since(t0).Microseconds()
	if s.coll != nil {
		tr.ComputeUs -= (s.coll.waited.Load() - waited0) / 1000
	}
	if err != nil {
		if len(st.Members) > 1 {
			err = fmt.Errorf("%w (tensor-parallel group: %v)", err, st.Members)
		}
		return err
	}
	// A handoff's KV goes on streaming while the hidden state and the
	// logits go out; the step ends once it is sent (or failed to be).
	defer func() { kvDone(tr) }()
	if me.Stage+1 < len(lay.Stages) && me.Rank == 0 {
		sent, err := fanOut(ctx, lay.Stages[me.Stage+1].Members, func(t memberRef) (int64, error) {
			return sendRows(ctx, m.h.mb, t.Addr, req.Step, tagHidden(s.id, me.Stage+1), s.act, n, E, x)
		})
		tr.Activations += sent
		if err != nil {
			return fmt.Errorf("sending the hidden state: %w", err)
		}
	}
	if me == lay.Output && len(req.Rows) > 0 {
		for _, i := range req.Rows {
			if i < 0 || i >= n {
				return fmt.Errorf("logits row %d is outside the step's %d tokens", i, n)
			}
		}
		V := m.cfg.Model.NVocab
		s.logits = grow(s.logits, len(req.Rows)*V)
		t0 := time.Now()
		if err := r.Logits(x, req.Rows, s.logits); err != nil {
			return err
		}
		tr.ComputeUs += time.Since(t0).Microseconds()
		if req.Sample != nil {
			// Sampled here: the tokens go back in the reply.
			if len(req.Sample) != len(req.Rows) {
				return fmt.Errorf("%d sampling requests for %d rows", len(req.Sample), len(req.Rows))
			}
			tr.Sampled = make([]sample.Result, len(req.Rows))
			sampler := func(p sample.Params) *sample.Sampler {
				sm := s.samplers[p]
				if sm == nil {
					if len(s.samplers) >= 64 {
						clear(s.samplers)
					}
					sm = sample.New(p, V)
					s.samplers[p] = sm
				}
				return sm
			}
			// Rows chained to the row before (drafts verified here) are
			// drawn while the drafts are.
			return sample.RemoteRows(req.Sample, func(i int) []float32 { return s.logits[i*V : (i+1)*V] }, sampler, tr.Sampled)
		}
		sent, err := sendRows(ctx, m.h.mb, s.driver, req.Step, tagLogits(s.id), transport.F32, len(req.Rows), V, s.logits)
		tr.Logits += sent
		if err != nil {
			return fmt.Errorf("sending the logits to the driver at %s: %w", s.driver, err)
		}
	}
	return nil
}

// forward runs layers [lo,hi) on the step's batch. In a handoff step it
// runs them one at a time and queues each layer's KV, as soon as it is in
// the cache, for a goroutine that sends it to the decode pool while the
// next layers compute; done waits for that goroutine (bounded by ctx) and
// closes the transfer's senders. A piece that cannot be sent (the receiver
// gave up, the link broke or stalled past the step's deadline) stops the
// sending, not the step: done sets tr.KVError, and the session stays
// usable.
func (s *memberSession) forward(ctx context.Context, req *stepReq, b *model.Batch, lo, hi int, x []float32) (done func(tr *traffic), err error) {
	ho := req.Handoff
	if ho == nil {
		return func(*traffic) {}, s.runner.Forward(b, lo, hi, x)
	}
	if len(b.Chunks) != 1 {
		return nil, fmt.Errorf("a handoff step carries one chunk, not %d", len(b.Chunks))
	}
	link := s.m.h.kvLink()
	if link == nil {
		return nil, errors.New("this host has no KV link to send a handoff's KV on")
	}
	dec, err := newLayout(s.m.cfg.Plan, ho.Pool, s.m.cfg.Addrs)
	if err != nil {
		return nil, err
	}
	if dec.Pool == s.m.lay.Pool {
		return nil, fmt.Errorf("a handoff to the %q pool the step runs in", dec.Pool)
	}
	type piece struct {
		i    int
		addr string
		p    *KVPiece
	}
	q := make(chan piece, (hi-lo)*len(dec.members())+1)
	var sendErr error
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		senders := map[int]KVSender{}
		for pc := range q {
			if sendErr != nil {
				continue // drain: the transfer failed
			}
			if senders[pc.i] == nil {
				senders[pc.i] = link.Sender(ho.Base + uint64(pc.i))
			}
			if err := senders[pc.i].Send(ctx, pc.addr, pc.p); err != nil {
				sendErr = fmt.Errorf("sending layer %d's KV to %s: %w", pc.p.Layer, pc.addr, err)
			}
		}
		for _, snd := range senders {
			if err := snd.Close(ctx); err != nil && sendErr == nil {
				sendErr = err
			}
		}
	}()
	done = func(tr *traffic) {
		<-sent
		if sendErr != nil {
			tr.KVError = fmt.Sprintf("sending the KV to the decode pool: %v", sendErr)
		}
	}
	for l := lo; l < hi; l++ {
		if err := s.runner.Forward(b, l, l+1, x); err == nil {
			err = s.exportKV(dec, ho, b, l, func(i int, addr string, p *KVPiece) { q <- piece{i, addr, p} })
		}
		if err != nil {
			close(q)
			<-sent
			return nil, err
		}
	}
	close(q)
	return done, nil
}

// fanOut runs send for every target concurrently and returns the bytes
// sent and the first error, naming its target.
func fanOut(ctx context.Context, targets []memberRef, send func(t memberRef) (int64, error)) (int64, error) {
	if len(targets) == 1 {
		n, err := send(targets[0])
		if err != nil {
			err = fmt.Errorf("to %v: %w", targets[0], err)
		}
		return n, err
	}
	var total atomic.Int64
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			n, err := send(t)
			total.Add(n)
			if err != nil {
				errs[i] = fmt.Errorf("to %v: %w", t, err)
			}
		})
	}
	wg.Wait()
	return total.Load(), errors.Join(errs...)
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
