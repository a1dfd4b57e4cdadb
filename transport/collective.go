package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"shoal/engine/quant"
)

// Collective phases, part of a collective frame's tag.
const (
	phaseExchange  = 1 // all-reduce, direct: the whole vector to every member
	phaseScatter   = 2 // all-reduce, reduce-scatter: chunk j to member j
	phaseGatherSum = 3 // all-reduce, all-gather of the reduced chunks
	phaseAllGather = 4 // AllGather: the part to every member
	numPhases      = 5
)

// DefaultDirectMaxBytes is the default GroupConfig.DirectMaxBytes.
const DefaultDirectMaxBytes = 256 << 10

// maxGone bounds the closed group IDs an endpoint remembers to drop their
// late frames.
const maxGone = 4096

// GroupConfig describes one member of a tensor-parallel group.
type GroupConfig struct {
	// ID names the group and must be the same on every member. It is
	// never reused on an endpoint: after Close or a failure, build the
	// replacement group under a new ID (add an epoch).
	ID string
	// Members are the endpoint addresses of the members in rank order,
	// the same list on every member.
	Members []string
	// Rank is this member's index in Members.
	Rank int
	// DType is the wire encoding (default F32, exact). F16 and Q8_0
	// trade precision for bytes; results stay identical on all members.
	DType DType
	// Timeout bounds one collective call (default 10s).
	Timeout time.Duration
	// Poll is how long a call of a few kilobytes (a decode step's) polls
	// a direct link for the peer's frame before it parks (default
	// DefaultPoll; negative: never). Larger calls park at once.
	Poll time.Duration
	// NoDirect keeps every collective on QUIC streams, even to members
	// that take direct links.
	NoDirect bool
	// DirectMaxBytes: all-reduces of vectors up to this many wire bytes,
	// and every all-reduce of two members, send the whole vector to every
	// member (one round trip); larger ones of more than two members use
	// reduce-scatter + all-gather (default DefaultDirectMaxBytes).
	DirectMaxBytes int
}

// Group runs collectives among the members of a tensor-parallel group over
// streams of KindCollectives. Its method set matches the engine's
// all-reduce interface. Calls on one Group are serialized; every member
// must make the same calls in the same order.
type Group struct {
	cfg  GroupConfig
	hub  *collHub
	tags [numPhases][]string

	ctx       context.Context // ended by Close
	cancel    context.CancelFunc
	closeOnce sync.Once

	direct []directPeer // by rank

	mu     sync.Mutex // one call at a time; guards everything below
	seq    uint64
	err    error // sticky: the failure that broke the group
	acc    []float32
	tmp    []float32
	frame  []byte
	frames [][]byte
}

// NewGroup joins this endpoint to the group described by cfg.
func NewGroup(ep *Endpoint, cfg GroupConfig) (*Group, error) {
	if cfg.ID == "" || len(cfg.ID) > MaxTagLen-4 {
		return nil, fmt.Errorf("transport: group id must have 1 to %d bytes", MaxTagLen-4)
	}
	if len(cfg.Members) == 0 || len(cfg.Members) > 1<<16 {
		return nil, fmt.Errorf("transport: group %q: %d members", cfg.ID, len(cfg.Members))
	}
	if cfg.Rank < 0 || cfg.Rank >= len(cfg.Members) {
		return nil, fmt.Errorf("transport: group %q: rank %d outside [0,%d)", cfg.ID, cfg.Rank, len(cfg.Members))
	}
	seen := map[string]bool{}
	for _, m := range cfg.Members {
		if seen[m] {
			return nil, fmt.Errorf("transport: group %q: member %s listed twice", cfg.ID, m)
		}
		seen[m] = true
	}
	if cfg.DType == 0 {
		cfg.DType = F32
	}
	if !cfg.DType.Valid() {
		return nil, fmt.Errorf("transport: group %q: unknown dtype %d", cfg.ID, byte(cfg.DType))
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.DirectMaxBytes <= 0 {
		cfg.DirectMaxBytes = DefaultDirectMaxBytes
	}
	if cfg.Poll == 0 {
		cfg.Poll = DefaultPoll
	}
	cfg.Members = append([]string(nil), cfg.Members...)
	h := hubOf(ep)
	g := &Group{cfg: cfg, hub: h, frames: make([][]byte, len(cfg.Members)), direct: make([]directPeer, len(cfg.Members))}
	for i := range g.direct {
		g.direct[i].arrived = make(chan struct{})
	}
	for p := range g.tags {
		g.tags[p] = make([]string, len(cfg.Members))
		for r := range cfg.Members {
			g.tags[p][r] = collTag(cfg.ID, byte(p), r)
		}
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if err := h.register(g); err != nil {
		g.cancel()
		return nil, err
	}
	return g, nil
}

// collTag is the tag of a collective frame: group id, a zero byte, the
// phase and the sender's rank (big-endian uint16).
func collTag(id string, phase byte, rank int) string {
	b := make([]byte, 0, len(id)+4)
	b = append(b, id...)
	b = append(b, 0, phase, byte(rank>>8), byte(rank))
	return string(b)
}

func groupOfTag(tag string) string {
	if len(tag) < 4 || tag[len(tag)-4] != 0 {
		return ""
	}
	return tag[:len(tag)-4]
}

// Rank is this member's index.
func (g *Group) Rank() int { return g.cfg.Rank }

// Size is the number of members.
func (g *Group) Size() int { return len(g.cfg.Members) }

// AllReduceSum replaces x by the elementwise sum of x over all members,
// within the group's timeout. Every member gets the same bits: the sum is
// taken in rank order, and with a lossy wire dtype every member sums the
// decoded values, its own included.
func (g *Group) AllReduceSum(x []float32) error {
	return g.AllReduceSumContext(context.Background(), x)
}

// AllReduceSumContext is AllReduceSum bounded by ctx as well.
func (g *Group) AllReduceSumContext(ctx context.Context, x []float32) error {
	if done, err := g.pairExchange(ctx, x); done {
		return err
	}
	return g.run(ctx, "all-reduce", len(x), func(c *call) error {
		switch {
		case len(x) == 0 || g.Size() == 1:
			return nil
		case g.Size() == 2 || g.cfg.DType.EncodedLen(len(x)) <= g.cfg.DirectMaxBytes:
			return c.exchangeSum(x)
		default:
			return c.scatterGatherSum(x)
		}
	})
}

// AllGather writes the parts of all members, concatenated in rank order,
// into out, whose length must be the sum of the parts' lengths. Parts may
// differ in length.
func (g *Group) AllGather(part, out []float32) error {
	return g.AllGatherContext(context.Background(), part, out)
}

// AllGatherContext is AllGather bounded by ctx as well.
func (g *Group) AllGatherContext(ctx context.Context, part, out []float32) error {
	return g.run(ctx, "all-gather", len(out), func(c *call) error {
		if g.Size() == 1 {
			if len(out) != len(part) {
				return fmt.Errorf("transport: group %q all-gather: out holds %d values, parts add up to %d", g.cfg.ID, len(out), len(part))
			}
			copy(out, part)
			return nil
		}
		return c.gather(part, out)
	})
}

// Protocol is the oldest of the protocols negotiated on the streams this
// member sends to the others on: the newest protocol every member speaks.
// A pair negotiates the newest protocol both speak, the older build's
// newest, so every member computes the same minimum, that of the oldest
// build in the group. 0 while it has not sent to every member yet (a
// group's first collective opens the streams), and for a group of one.
func (g *Group) Protocol() int {
	low := 0
	for j, m := range g.cfg.Members {
		if j == g.cfg.Rank {
			continue
		}
		p := g.hub.out.protocol(m)
		if p == 0 {
			return 0
		}
		if low == 0 || p < low {
			low = p
		}
	}
	return low
}

// Close aborts a pending call (it returns an error wrapping ErrClosed) and
// makes later calls fail. It does not close the endpoint.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.cancel()
		g.hub.forget(g.cfg.ID)
		g.closeDirect()
	})
	return nil
}

// call is one collective in progress.
type call struct {
	g      *Group
	op     string
	seq    uint64
	poll   time.Duration // how long a read of a direct link polls
	ctx    context.Context
	cancel context.CancelFunc
	wait   func() error
}

func (g *Group) run(ctx context.Context, op string, values int, f func(c *call) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	if g.ctx.Err() != nil {
		return fmt.Errorf("transport: group %q %s: %w", g.cfg.ID, op, ErrClosed)
	}
	g.seq++
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(g.ctx, cancel)
	defer stop()
	c := &call{g: g, op: op, seq: g.seq, ctx: ctx, cancel: cancel, wait: func() error { return nil }}
	if g.cfg.Poll > 0 && g.cfg.DType.EncodedLen(values) <= pollMaxBytes {
		c.poll = g.cfg.Poll
	}
	if err := f(c); err != nil {
		return g.broke(op, c.seq, err)
	}
	return nil
}

// broke retires the group after call seq failed with err, which it
// returns: the members no longer agree on where the sequence stands, so
// later calls fail and the group's late frames are dropped. g.mu is held.
func (g *Group) broke(op string, seq uint64, err error) error {
	if g.ctx.Err() != nil {
		err = fmt.Errorf("transport: group %q %s #%d: %w", g.cfg.ID, op, seq, ErrClosed)
	}
	g.err = fmt.Errorf("transport: group %q is unusable after a failed collective: %w", g.cfg.ID, err)
	g.hub.forget(g.cfg.ID)
	g.closeDirect()
	return err
}

func (c *call) peerErr(what string, rank int, err error) error {
	return fmt.Errorf("transport: group %q %s #%d: %s rank %d (%s): %w",
		c.g.cfg.ID, c.op, c.seq, what, rank, c.g.cfg.Members[rank], err)
}

// fail ends the call: pending sends are abandoned and waited for, and a
// send error, which names the peer it failed on, wins over err.
func (c *call) fail(err error) error {
	c.cancel()
	if werr := c.wait(); werr != nil {
		return werr
	}
	return err
}

// sendAll writes frame(j) to every other member j, concurrently when there
// are several; c.wait reports the first failure, which also ends the call.
func (c *call) sendAll(frame func(j int) []byte) {
	g := c.g
	var first error
	var once sync.Once
	send := func(j int, f []byte, d *directConn) {
		var err error
		if d != nil {
			err = c.writeDirect(d, f)
		} else {
			err = g.hub.out.write(c.ctx, g.cfg.Members[j], f)
		}
		if err != nil {
			once.Do(func() {
				first = c.peerErr("send to", j, err)
				c.cancel()
			})
		}
	}
	if g.Size() == 2 {
		j := 1 - g.cfg.Rank
		f, d := frame(j), c.directTo(j)
		if d == nil || len(f) <= directInlineMax {
			send(j, f, d)
			c.wait = func() error { return first }
			return
		}
		// Both members may be sending megabytes at once: receive while
		// this one is written.
		done := make(chan struct{})
		go func() {
			defer close(done)
			send(j, f, d)
		}()
		c.wait = func() error {
			<-done
			return first
		}
		return
	}
	var wg sync.WaitGroup
	for j := range g.cfg.Members {
		if j != g.cfg.Rank {
			d := c.directTo(j)
			wg.Go(func() { send(j, frame(j), d) })
		}
	}
	c.wait = func() error {
		wg.Wait()
		return first
	}
}

// recv takes the frame of the given phase from src. want >= 0 is the
// number of values it must carry.
func (c *call) recv(phase, src, want int) (*message, error) {
	g := c.g
	m, err := c.take(phase, src)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("nothing within %v: %w", g.cfg.Timeout, err)
		}
		return nil, c.peerErr("waiting for", src, err)
	}
	if err := g.frameErr(&m.frame, c.seq, g.tags[phase][src], want); err != nil {
		return nil, c.peerErr("from", src, err)
	}
	return m, nil
}

// frameErr says what is wrong with a frame received for call seq under
// tag carrying want values (want < 0: any number): one of another call or
// phase (a direct link's frames come in the order they were sent; the
// inbox hands out only the one asked for), another dtype, another length.
func (g *Group) frameErr(f *TensorFrame, seq uint64, tag string, want int) error {
	switch n := f.Rows * f.Cols; {
	case f.Type != MsgCollective || f.ID != seq || f.Tag != tag:
		return fmt.Errorf("%w: direct link out of step: got %q #%d, want %q #%d", ErrBadTensorFrame, f.Tag, f.ID, tag, seq)
	case f.DType != g.cfg.DType:
		return fmt.Errorf("got %v values, the group uses %v", f.DType, g.cfg.DType)
	case want >= 0 && n != want:
		return fmt.Errorf("got %d values, want %d (members disagree on the length)", n, want)
	}
	return nil
}

// take waits for src's frame of phase: read off src's direct link when
// src sends this call on one, taken from the inbox otherwise.
func (c *call) take(phase, src int) (*message, error) {
	g := c.g
	p := &g.direct[src]
	for {
		p.mu.Lock()
		in, first, arrived := p.in, p.first, p.arrived
		p.mu.Unlock()
		if in != nil && c.seq >= first {
			return c.readDirect(in)
		}
		ctx, stop := c.ctx, func() {}
		if in == nil && c.directPossible(src) {
			// src may open a direct link for this very call: stop waiting
			// on the inbox when it arrives.
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(c.ctx)
			go func() {
				select {
				case <-arrived:
					cancel()
				case <-ctx.Done():
				}
			}()
			stop = cancel
		}
		// Every algorithm sends to src before waiting for it, so a stream
		// to src exists; when it ends (src closed or died) the wait ends
		// at once.
		lost := g.hub.out.lost(g.cfg.Members[src])
		m, err := g.hub.in.take(ctx, inboxKey{c.seq, g.tags[phase][src]}, "", lost)
		stop()
		if err != nil && in == nil && c.ctx.Err() == nil && closed(arrived) {
			continue
		}
		return m, err
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// encode builds this member's frame of phase carrying data in buf.
func (c *call) encode(buf []byte, phase int, data []float32) ([]byte, error) {
	g := c.g
	if n := g.cfg.DType.EncodedLen(len(data)); n > DefaultMaxTensorFrame {
		return buf, fmt.Errorf("transport: group %q %s: %w: %d values take %d bytes in %v, limit %d",
			g.cfg.ID, c.op, ErrFrameTooLarge, len(data), n, g.cfg.DType, DefaultMaxTensorFrame)
	}
	h := TensorHeader{Type: MsgCollective, DType: g.cfg.DType, ID: c.seq, Tag: g.tags[phase][g.cfg.Rank], Rows: 1, Cols: len(data)}
	return AppendTensorMessage(buf[:0], h, data)
}

// decodeOwn decodes this member's frame of phase into dst, which gets the
// values the other members receive.
func (c *call) decodeOwn(frame []byte, phase int, dst []float32) {
	tag := c.g.tags[phase][c.g.cfg.Rank]
	_ = DecodeTensor(c.g.cfg.DType, frame[tensorHeaderLen+len(tag):], dst)
}

func scratch(p *[]float32, n int) []float32 {
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	return (*p)[:n]
}

func addTo(acc, v []float32) {
	v = v[:len(acc)]
	for i := range acc {
		acc[i] += v[i]
	}
}

// exchangeSum: every member sends its whole vector to every other member
// and sums all vectors in rank order. One round of messages.
func (c *call) exchangeSum(x []float32) error {
	g := c.g
	var err error
	if g.frame, err = c.encode(g.frame, phaseExchange, x); err != nil {
		return err
	}
	if g.cfg.DType != F32 { // sum what the others will see of x
		c.decodeOwn(g.frame, phaseExchange, x)
	}
	c.sendAll(func(int) []byte { return g.frame })
	acc, err := c.sumRankOrder(phaseExchange, x)
	if err != nil {
		return err
	}
	if err := c.wait(); err != nil {
		return err
	}
	copy(x, acc)
	return nil
}

// sumRankOrder sums own, this member's values, and the same-length vectors
// the other members send in phase, in rank order, into the group's
// accumulator, which it returns.
func (c *call) sumRankOrder(phase int, own []float32) ([]float32, error) {
	g := c.g
	acc, tmp := scratch(&g.acc, len(own)), scratch(&g.tmp, len(own))
	for src := range g.cfg.Members {
		v := own
		if src != g.cfg.Rank {
			m, err := c.recv(phase, src, len(own))
			if err != nil {
				return nil, c.fail(err)
			}
			_ = m.decode(tmp)
			v = tmp
		}
		if src == 0 {
			copy(acc, v)
		} else {
			addTo(acc, v)
		}
	}
	return acc, nil
}

// chunkOf is the range of x that member i reduces in scatterGatherSum:
// equal chunks on 32-value boundaries, the remainder to the last member.
func chunkOf(n, size, i int) (lo, hi int) {
	per := n / size
	if per >= quant.QK {
		per -= per % quant.QK
	}
	lo, hi = i*per, (i+1)*per
	if i == size-1 {
		hi = n
	}
	return lo, hi
}

// scatterGatherSum: member j receives chunk j of every vector and sums them
// in rank order (reduce-scatter), then sends its reduced chunk to every
// member (all-gather). Each member sends and receives 2(p-1)/p of the
// vector, in two rounds.
func (c *call) scatterGatherSum(x []float32) error {
	g := c.g
	n, size, rank, dt := len(x), g.Size(), g.cfg.Rank, g.cfg.DType
	for j := range size {
		if j == rank {
			continue
		}
		lo, hi := chunkOf(n, size, j)
		var err error
		if g.frames[j], err = c.encode(g.frames[j], phaseScatter, x[lo:hi]); err != nil {
			return err
		}
	}
	c.sendAll(func(j int) []byte { return g.frames[j] })
	lo, hi := chunkOf(n, size, rank)
	own := x[lo:hi]
	g.frame = RoundTrip(dt, own, g.frame)
	acc, err := c.sumRankOrder(phaseScatter, own)
	if err != nil {
		return err
	}
	// The scatter sends read x; they must be done before x is written.
	if err := c.wait(); err != nil {
		return err
	}
	if g.frame, err = c.encode(g.frame, phaseGatherSum, acc); err != nil {
		return err
	}
	if dt != F32 {
		c.decodeOwn(g.frame, phaseGatherSum, acc)
	}
	copy(own, acc)
	c.sendAll(func(int) []byte { return g.frame })
	for src := range size {
		if src == rank {
			continue
		}
		slo, shi := chunkOf(n, size, src)
		m, err := c.recv(phaseGatherSum, src, shi-slo)
		if err != nil {
			return c.fail(err)
		}
		_ = m.decode(x[slo:shi])
	}
	return c.wait()
}

// gather: every member sends its part to every other member; each places
// the parts in rank order.
func (c *call) gather(part, out []float32) error {
	g := c.g
	var err error
	if g.frame, err = c.encode(g.frame, phaseAllGather, part); err != nil {
		return err
	}
	c.sendAll(func(int) []byte { return g.frame })
	tooShort := func() error {
		return fmt.Errorf("transport: group %q all-gather #%d: out holds %d values, parts add up to more", g.cfg.ID, c.seq, len(out))
	}
	off := 0
	for src := range g.cfg.Members {
		if src == g.cfg.Rank {
			k := len(part)
			if off+k > len(out) {
				return c.fail(tooShort())
			}
			// Decode our own frame, so that lossy dtypes give every member
			// the same values (and part may overlap out).
			c.decodeOwn(g.frame, phaseAllGather, out[off:off+k])
			off += k
			continue
		}
		m, err := c.recv(phaseAllGather, src, -1)
		if err != nil {
			return c.fail(err)
		}
		k := m.frame.Rows * m.frame.Cols
		if off+k > len(out) {
			return c.fail(tooShort())
		}
		_ = m.decode(out[off : off+k])
		off += k
	}
	if err := c.wait(); err != nil {
		return err
	}
	if off != len(out) {
		return fmt.Errorf("transport: group %q all-gather #%d: out holds %d values, parts add up to %d", g.cfg.ID, c.seq, len(out), off)
	}
	return nil
}

// collHub is the collectives side of one endpoint, shared by its groups:
// one inbox, one outgoing stream per peer.
type collHub struct {
	in  *inbox
	out *links

	mu       sync.Mutex
	live     map[string]*Group
	gone     map[string]bool
	goneFIFO []string
}

var hubs = struct {
	sync.Mutex
	m map[*Endpoint]*collHub
}{m: map[*Endpoint]*collHub{}}

// hubOf returns the endpoint's hub, serving KindCollectives from the first
// group on; it closes with the endpoint.
func hubOf(ep *Endpoint) *collHub {
	hubs.Lock()
	defer hubs.Unlock()
	if h := hubs.m[ep]; h != nil {
		return h
	}
	h := &collHub{in: newInbox(DefaultMaxBuffered), out: newLinks(ep, KindCollectives), live: map[string]*Group{}, gone: map[string]bool{}}
	h.in.drop = h.dropTag
	ep.Handle(KindCollectives, func(s *Stream) {
		serveTensorStream(s, h.in, MsgCollective, DefaultMaxTensorFrame)
	})
	hubs.m[ep] = h
	context.AfterFunc(ep.ctx, func() {
		hubs.Lock()
		delete(hubs.m, ep)
		hubs.Unlock()
		h.in.close(net.ErrClosed)
		h.out.close()
	})
	return h
}

func (h *collHub) register(g *Group) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := g.cfg.ID
	if h.live[id] != nil || h.gone[id] {
		return fmt.Errorf("transport: group id %q is already in use on this endpoint", id)
	}
	h.live[id] = g
	return nil
}

// forget retires a group: its queued frames and the ones still to come are
// dropped.
func (h *collHub) forget(id string) {
	h.mu.Lock()
	if h.live[id] != nil {
		delete(h.live, id)
		h.gone[id] = true
		h.goneFIFO = append(h.goneFIFO, id)
		if len(h.goneFIFO) > maxGone {
			delete(h.gone, h.goneFIFO[0])
			h.goneFIFO = h.goneFIFO[1:]
		}
	}
	h.mu.Unlock()
	h.in.purge(func(tag string) bool { return groupOfTag(tag) == id })
}

func (h *collHub) dropTag(tag string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gone[groupOfTag(tag)]
}
