package parallel

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/transport"
)

// Disaggregated prefill: a session over a plan's prefill pool runs a
// prompt chunk of one sequence while its members send the KV cache each
// layer produces, as soon as it is produced, to the members of a session
// over the decode pool that hold that layer and those KV heads. The pools
// may split layers and heads differently: a prefill member sends each
// decode member only the overlap of their heads. The decode members
// reserve the chunk's positions first (dist.kvopen), import what arrives,
// and report when every layer and head they hold is filled (dist.kvwait);
// the sequence then decodes on the decode session as if it had been
// prefilled there.

// RPC methods of a handoff.
const (
	methodKVOpen = "dist.kvopen"
	methodKVWait = "dist.kvwait"
)

// handoffReq, in a prefill step, says where the KV of the step's chunk
// goes: the decode session's members, each under transfer Base + its index
// in the decode pool, at the decode side's positions (Pos).
type handoffReq struct {
	Pool    string `json:"pool"`
	Session string `json:"session"`
	Base    uint64 `json:"base"`
	Pos     int    `json:"pos"`
}

// kvOpenReq asks a decode member to reserve N positions of Seq from Pos and
// to import transfer Transfer into them.
type kvOpenReq struct {
	memberAddr
	Transfer uint64 `json:"transfer"`
	Seq      int32  `json:"seq"`
	Pos      int    `json:"pos"`
	N        int    `json:"n"`
	// TimeoutMs bounds the import: the member gives up (and returns the
	// positions) when the KV has not all arrived by then.
	TimeoutMs int64 `json:"timeout_ms"`
}

// kvWaitReq waits for an import to finish, or cancels it: a cancelled
// import, finished or not (or already waited for), gives Seq's positions
// from Pos back.
type kvWaitReq struct {
	memberAddr
	Transfer uint64 `json:"transfer"`
	Seq      int32  `json:"seq"`
	Pos      int    `json:"pos"`
	Cancel   bool   `json:"cancel,omitempty"`
}

// kvImport is a decode member's import of one transfer.
type kvImport struct {
	seq    kv.SeqID
	pos, n int
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	bytes  int64
}

// SetKVLink lets the host's members take part in disaggregated prefill
// over l (before any session opens).
func (h *Host) SetKVLink(l KVLink) {
	h.mu.Lock()
	h.kv = l
	h.mu.Unlock()
}

func (h *Host) kvLink() KVLink {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kv
}

// kvHeads is the range of global KV heads a runner's cache holds.
func kvHeads(r *model.Runner) (lo, hi int) {
	sl := r.Slice()
	return sl.KVHeads(&r.Model().Config)
}

// kvOpen reserves the positions and starts importing.
func (m *Member) kvOpen(req *kvOpenReq) error {
	s, err := m.session(req.Session)
	if err != nil {
		return err
	}
	link := m.h.kvLink()
	if link == nil {
		return transport.Errorf(http.StatusNotImplemented, "dist: %v takes no KV from other nodes (no KV link on this host)", m.me)
	}
	if req.N <= 0 || req.Pos < 0 || req.TimeoutMs <= 0 {
		return transport.Errorf(http.StatusBadRequest, "dist: KV import of %d positions from %d (timeout %d ms)", req.N, req.Pos, req.TimeoutMs)
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	if err := s.failed(); err != nil {
		return fmt.Errorf("dist: session %s is unusable on %v: %w", s.id, m.me, err)
	}
	if s.runner == nil {
		return ErrClosed
	}
	s.importMu.Lock()
	_, dup := s.imports[req.Transfer]
	s.importMu.Unlock()
	if dup {
		return transport.Errorf(http.StatusConflict, "dist: KV transfer %d is already open on %v", req.Transfer, m.me)
	}
	c := s.runner.Cache()
	b := model.Batch{Chunks: []model.Chunk{{Seq: kv.SeqID(req.Seq), N: req.N}}}
	if err := s.runner.Reserve(&b); err != nil {
		return fmt.Errorf("dist: %v reserving %d positions for sequence %d: %w", m.me, req.N, req.Seq, err)
	}
	if b.Chunks[0].Pos != req.Pos {
		c.Truncate(kv.SeqID(req.Seq), b.Chunks[0].Pos)
		return fmt.Errorf("dist: sequence %d is at position %d on %v, the driver says %d", req.Seq, b.Chunks[0].Pos, m.me, req.Pos)
	}
	in := link.Receive(req.Transfer)
	ctx, cancel := context.WithTimeout(s.ctx, time.Duration(req.TimeoutMs)*time.Millisecond)
	im := &kvImport{seq: kv.SeqID(req.Seq), pos: req.Pos, n: req.N, cancel: cancel, done: make(chan struct{})}
	s.importMu.Lock()
	if s.imports == nil {
		s.imports = map[uint64]*kvImport{}
	}
	s.imports[req.Transfer] = im
	s.importMu.Unlock()
	r := s.runner
	go func() {
		defer close(im.done)
		defer cancel()
		defer in.Close()
		im.err = im.run(ctx, r, in)
		if im.err != nil {
			im.err = fmt.Errorf("dist: %v importing KV transfer %d (sequence %d, positions [%d,%d)): %w",
				m.me, req.Transfer, req.Seq, req.Pos, req.Pos+req.N, im.err)
			// The positions go back; the driver prefills elsewhere.
			c.Truncate(im.seq, im.pos)
		}
	}()
	return nil
}

// run imports pieces until every layer and KV head of the runner's cache
// holds the positions.
func (im *kvImport) run(ctx context.Context, r *model.Runner, in KVInbox) error {
	c := r.Cache()
	cfg := c.Config()
	hlo, hhi := kvHeads(r)
	heads := hhi - hlo
	hd := r.Model().HeadDim
	if heads == 0 {
		return nil // a tensor-parallel member without attention heads
	}
	if heads < 0 || hd <= 0 || cfg.KVDim != heads*hd {
		return fmt.Errorf("the cache holds %d values per position, not %d heads of %d", cfg.KVDim, heads, hd)
	}
	// pieces count a head's words in the cache (its size with F16, its
	// blocks' words with a quantized cache): both sides use the model's
	// cache type
	D := r.KVHeadWords()
	// filled[layer][position*heads + head]
	filled := make([][]bool, cfg.Layers)
	for i := range filled {
		filled[i] = make([]bool, im.n*heads)
	}
	missing := cfg.Layers * im.n * heads
	var k, v []uint16
	for missing > 0 {
		p, err := in.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%d of %d head positions still missing: %w", missing, cfg.Layers*im.n*heads, context.Cause(ctx))
			}
			return err
		}
		l := p.Layer - cfg.FirstLayer
		a, z := max(p.HeadLo, hlo), min(p.HeadHi, hhi)
		ph := p.HeadHi - p.HeadLo
		switch {
		case l < 0 || l >= cfg.Layers:
			return fmt.Errorf("a piece of layer %d, this member holds [%d,%d)", p.Layer, cfg.FirstLayer, cfg.FirstLayer+cfg.Layers)
		case p.Pos < im.pos || p.N <= 0 || p.Pos+p.N > im.pos+im.n:
			return fmt.Errorf("a piece of positions [%d,%d), the transfer is [%d,%d)", p.Pos, p.Pos+p.N, im.pos, im.pos+im.n)
		case a >= z || p.HeadDim != D:
			return fmt.Errorf("a piece of heads [%d,%d) of dim %d, this member holds [%d,%d) of dim %d", p.HeadLo, p.HeadHi, p.HeadDim, hlo, hhi, D)
		case cfg.VInK != (p.V == nil):
			return fmt.Errorf("a piece with V %v for a cache whose V is a view of K: %v", p.V != nil, cfg.VInK)
		case len(p.K) != p.N*ph*D || p.V != nil && len(p.V) != len(p.K):
			return fmt.Errorf("a piece of %d/%d values for %d positions of %d heads", len(p.K), len(p.V), p.N, ph)
		}
		w := (z - a) * D
		k = grow(k, p.N*w)
		if !cfg.VInK {
			v = grow(v, p.N*w)
		}
		for i := 0; i < p.N; i++ {
			src := i*ph*D + (a-p.HeadLo)*D
			copy(k[i*w:(i+1)*w], p.K[src:src+w])
			if !cfg.VInK {
				copy(v[i*w:(i+1)*w], p.V[src:src+w])
			}
			for h := a; h < z; h++ {
				f := &filled[l][(p.Pos-im.pos+i)*heads+h-hlo]
				if !*f {
					*f = true
					missing--
				}
			}
		}
		if err := c.ImportRange(im.seq, p.Layer, p.Pos, p.N, a-hlo, z-hlo, D, k, v); err != nil {
			return err
		}
		im.bytes += int64(2 * cfg.Halves() * p.N * w)
	}
	return nil
}

// kvWait waits for an import (or cancels it) and forgets it.
func (m *Member) kvWait(ctx context.Context, req *kvWaitReq) error {
	s, err := m.session(req.Session)
	if err != nil {
		return err
	}
	s.importMu.Lock()
	im := s.imports[req.Transfer]
	s.importMu.Unlock()
	if im == nil && !req.Cancel {
		return transport.Errorf(http.StatusNotFound, "dist: no KV transfer %d on %v", req.Transfer, m.me)
	}
	if im != nil {
		ended := false // on its own, before any cancel
		select {
		case <-im.done:
			ended = true
		default:
		}
		if req.Cancel {
			im.cancel()
		}
		select {
		case <-im.done:
		case <-ctx.Done():
			return fmt.Errorf("dist: %v waiting for KV transfer %d: %w", m.me, req.Transfer, ctx.Err())
		}
		s.importMu.Lock()
		delete(s.imports, req.Transfer)
		s.importMu.Unlock()
		if !req.Cancel || (ended && im.err != nil) {
			return im.err // a failed import gave its positions back itself
		}
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	if s.runner != nil && s.runner.Cache().Len(kv.SeqID(req.Seq)) > req.Pos {
		s.runner.Cache().Truncate(kv.SeqID(req.Seq), req.Pos)
	}
	return nil
}

// endImports cancels the session's imports and waits for them.
func (s *memberSession) endImports() {
	s.importMu.Lock()
	ims := s.imports
	s.imports = nil
	s.importMu.Unlock()
	for _, im := range ims {
		im.cancel()
		<-im.done
	}
}

// exportKV copies the KV of layer l of the step's one chunk for every
// decode member holding that layer and some of this member's heads, and
// hands each piece to send with the member's index and address.
func (s *memberSession) exportKV(dec *layout, ho *handoffReq, b *model.Batch, l int, send func(i int, addr string, p *KVPiece)) error {
	r := s.runner
	hlo, _ := kvHeads(r)
	// Only the KV heads this member owns: a head a GQA group shares with
	// the next member is sent once, by the member holding its first query
	// head.
	sl := r.Slice()
	olo, ohi := sl.OwnedKVHeads(&r.Model().Config)
	D := r.KVHeadWords()
	c := b.Chunks[0]
	for i, dm := range dec.members() {
		st := dec.Stages[dm.Stage]
		if l < st.Lo || l >= st.Hi {
			continue
		}
		dlo, dhi := dec.kvHeads(dm, &r.Model().Config)
		a, z := max(olo, dlo), min(ohi, dhi)
		if a >= z {
			continue
		}
		k := make([]uint16, c.N*(z-a)*D)
		var v []uint16 // none when V is a view of K
		if !r.Cache().Config().VInK {
			v = make([]uint16, len(k))
		}
		if err := r.Cache().ExportRange(c.Seq, l, c.Pos, c.N, a-hlo, z-hlo, D, k, v); err != nil {
			return err
		}
		send(i, dm.Addr, &KVPiece{Layer: l, Pos: ho.Pos, N: c.N, HeadLo: a, HeadHi: z, HeadDim: D, K: k, V: v})
	}
	return nil
}

// kvHeads is the range of global KV heads member m of the layout holds.
func (l *layout) kvHeads(m memberRef, c *model.Config) (lo, hi int) {
	pm := l.planned[m.Stage][m.Rank]
	if max(pm.TPSize, 1) == 1 {
		return 0, c.NHeadKV
	}
	return (&model.Slice{HeadLo: pm.HeadLo, HeadHi: pm.HeadHi}).KVHeads(c)
}

// transferBase picks a random transfer ID base with its low byte clear:
// decode member i imports transfer base+i.
func transferBase() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) &^ 0xff
}

// Handoff runs b, one prompt chunk of one sequence, on s (a session over a
// plan's prefill pool) while the chunk's KV cache streams to dec (a
// session over the same plan's decode pool), and returns the logits of
// rows as Step does. Once it returns without error, the sequence holds the
// chunk's positions on dec as if dec had run it; s keeps them too (the
// prompt's next chunk needs them; Free them there after the last). The
// sequence must be at the same position on both sessions. A failed handoff
// leaves dec usable and the sequence where it was there; s is unusable
// when its step failed.
func (s *Session) Handoff(ctx context.Context, dec *Session, b *model.Batch, rows []int) ([]float32, error) {
	return s.handoff(ctx, dec, b, rows, nil)
}

// handoff is Handoff, adding the time of its phases to ph (if not nil).
func (s *Session) handoff(ctx context.Context, dec *Session, b *model.Batch, rows []int, ph *HandoffPhases) ([]float32, error) {
	if ph == nil {
		ph = new(HandoffPhases)
	}
	if len(b.Chunks) != 1 {
		return nil, fmt.Errorf("dist: a handoff carries one sequence's chunk, not %d chunks", len(b.Chunks))
	}
	if dec.c.lay.Model != s.c.lay.Model || dec.c.lay.Version != s.c.lay.Version || dec.c.lay.Pool == s.c.lay.Pool {
		return nil, fmt.Errorf("dist: a handoff goes from one pool of a plan to another (%s v%d %q to %s v%d %q)",
			s.c.lay.Model, s.c.lay.Version, s.c.lay.Pool, dec.c.lay.Model, dec.c.lay.Version, dec.c.lay.Pool)
	}
	q, n := b.Chunks[0].Seq, b.Chunks[0].N
	// Neither waits for a step of the decode session in flight (its
	// scheduler steps the other sequences meanwhile).
	if err := dec.Err(); err != nil {
		return nil, err
	}
	pos := dec.len(q)
	spos := s.len(q)
	if spos != pos {
		return nil, fmt.Errorf("dist: sequence %d is at position %d on the prefill session and %d on the decode session", q, spos, pos)
	}
	base := transferBase()
	ho := &handoffReq{Pool: dec.c.lay.Pool, Session: dec.id, Base: base, Pos: pos}
	// The prefill pool's step bounds itself; the import may take a little
	// longer than it (the last layer's KV is on its way when it ends).
	budget := s.c.opt.Timeout + dec.c.opt.Timeout
	t0 := time.Now()
	if err := dec.kvOpen(ctx, base, q, pos, n, budget); err != nil {
		return nil, err
	}
	t1 := time.Now()
	var kvErr error
	logits, _, serr := s.run(ctx, b, rows, nil, ho, &kvErr)
	t2 := time.Now()
	werr := dec.kvWait(ctx, base, q, pos, serr != nil || kvErr != nil, budget)
	ph.Open += t1.Sub(t0).Seconds()
	ph.Step += t2.Sub(t1).Seconds()
	ph.Wait += time.Since(t2).Seconds()
	if serr == nil && kvErr != nil {
		if werr != nil {
			// The receiver's error is the cause (a corrupt frame, a
			// deadline); the sender saw its transfer refused after it.
			return nil, fmt.Errorf("%w (the prefill side: %v)", werr, kvErr)
		}
		return nil, fmt.Errorf("dist: handing the KV to the decode pool: %w", kvErr)
	}
	if serr == nil && werr != nil {
		// Members that imported give the positions back too.
		_ = dec.kvWait(ctx, base, q, pos, true, abortTimeout)
	}
	if serr != nil {
		return nil, serr
	}
	if werr != nil {
		return nil, werr
	}
	dec.lenMu.Lock()
	if dec.seqLen[q] == pos {
		dec.seqLen[q] = pos + n
	}
	dec.lenMu.Unlock()
	return logits, nil
}

// len is sequence q's length on the session's members.
func (s *Session) len(q kv.SeqID) int {
	s.lenMu.Lock()
	defer s.lenMu.Unlock()
	return s.seqLen[q]
}

// kvOpen opens transfer base+i on every decode member i; on error the
// members that opened are cancelled.
func (s *Session) kvOpen(ctx context.Context, base uint64, q kv.SeqID, pos, n int, budget time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, s.c.opt.Timeout)
	defer cancel()
	ms := s.c.lay.members()
	opened := make([]bool, len(ms))
	var mu sync.Mutex
	err := s.c.each(ctx, func(ctx context.Context, i int, m memberRef) error {
		req := kvOpenReq{memberAddr: s.addr(m), Transfer: base + uint64(i), Seq: int32(q), Pos: pos, N: n, TimeoutMs: budget.Milliseconds()}
		_, _, err := s.c.h.call(ctx, m.Addr, methodKVOpen, &req, nil)
		if err == nil {
			mu.Lock()
			opened[i] = true
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		_ = s.c.each(context.Background(), func(ctx context.Context, i int, m memberRef) error {
			if !opened[i] {
				return nil
			}
			ctx, cancel := context.WithTimeout(ctx, abortTimeout)
			defer cancel()
			req := kvWaitReq{memberAddr: s.addr(m), Transfer: base + uint64(i), Seq: int32(q), Pos: pos, Cancel: true}
			_, _, err := s.c.h.call(ctx, m.Addr, methodKVWait, &req, nil)
			return err
		})
		return fmt.Errorf("dist: opening the KV import on the decode pool: %w", err)
	}
	return nil
}

// kvWait waits for (or cancels) transfer base+i on every decode member.
// Every member is asked even after one failed, so that each gives its
// positions back.
func (s *Session) kvWait(ctx context.Context, base uint64, q kv.SeqID, pos int, cancelIt bool, budget time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, budget+time.Second)
	defer cancel()
	ms := s.c.lay.members()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			req := kvWaitReq{memberAddr: s.addr(m), Transfer: base + uint64(i), Seq: int32(q), Pos: pos, Cancel: cancelIt}
			_, _, errs[i] = s.c.h.call(ctx, m.Addr, methodKVWait, &req, nil)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%v: %w", m, errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("dist: importing the KV on the decode pool: %w", err)
	}
	return nil
}
