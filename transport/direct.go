package transport

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"shoal/internal/version"
)

// Direct links: the collectives of a tensor-parallel group travel over TCP
// when both ends speak version.DirectProtocol, on the port number of the
// endpoint's QUIC socket (TCP and UDP ports are separate namespaces). Each
// member opens one connection to every other member per group and only
// writes on it, so a member waiting for a peer reads that peer's frames
// straight off its socket, on the calling goroutine, polling it briefly
// before it parks: no goroutine hand-off and no userspace transport on the
// hot path, which is what a decode step's all-reduces of a few kilobytes
// spend their time on through QUIC. The connection is TLS 1.3 with the
// cluster's certificates on both sides, and the kernel's TCP carries large
// payloads (a prefill's megabytes) at the link's rate. A peer that cannot
// be reached over TCP (a firewall, another program on the port) keeps its
// group on QUIC.

// alpnDirect is the ALPN of a direct link; alpnProbe of a link probe over
// TCP (ProbeDirect).
const (
	alpnDirect = "shoal-direct/4"
	alpnProbe  = "shoal-probe/4"
)

// maxDirectPerPeer bounds the direct links one node (by certificate) holds
// open to this endpoint: one per group it shares with this node.
const maxDirectPerPeer = 64

// maxDirectPending bounds the connections in their handshake at once.
const maxDirectPending = 64

// directHelloMax bounds a hello frame: version, rank, first sequence
// number and the group id.
const directHelloMax = 1 + 2 + 8 + MaxTagLen

// directInlineMax: frames up to this size are written on the calling
// goroutine (the socket's buffer takes them whole); larger ones are written
// concurrently with the receives, so that two members sending each other
// megabytes at once cannot both block on full buffers.
const directInlineMax = 64 << 10

// DefaultPoll is the default GroupConfig.Poll. A member waiting for a
// decode step's all-reduce has nothing else to run (its compute threads
// are done), so polling costs no work, and a peer a little behind is
// caught without a parked goroutine's wake-up.
const DefaultPoll = time.Millisecond

// pollMaxBytes: calls carrying up to this many wire bytes poll (a decode
// step of one sequence: 8,192 values in f16); larger ones park at once.
// The parts of an overlapped step (32 tokens or more, whose all-reduces run
// beside the next part's compute) are larger for any model 512 wide or
// more, so they never take a core from the compute.
const pollMaxBytes = 16 << 10

// directHello opens a direct link: who sends on it and from which call on.
type directHello struct {
	Group string
	Rank  int
	First uint64 // the sequence number of the first call carried
}

func (h directHello) append(b []byte) []byte {
	b = append(b, 1)
	b = binary.BigEndian.AppendUint16(b, uint16(h.Rank))
	b = binary.BigEndian.AppendUint64(b, h.First)
	return append(b, h.Group...)
}

func parseDirectHello(b []byte) (directHello, error) {
	var h directHello
	if len(b) < 11 || b[0] != 1 {
		return h, fmt.Errorf("%w: direct link hello of %d bytes", ErrBadTensorFrame, len(b))
	}
	h.Rank = int(binary.BigEndian.Uint16(b[1:]))
	h.First = binary.BigEndian.Uint64(b[3:])
	h.Group = string(b[11:])
	if h.Group == "" || len(h.Group) > MaxTagLen-4 || h.First == 0 {
		return h, fmt.Errorf("%w: direct link hello for group %q from call %d", ErrBadTensorFrame, h.Group, h.First)
	}
	return h, nil
}

// directConn is one direct link: the TLS connection and the socket it
// polls.
type directConn struct {
	tls  *tls.Conn
	raw  *pollConn
	peer string // node ID of the other end
	ep   *Endpoint

	// Used by the group's calls, one at a time:
	until time.Time // the deadline set on the connection
	buf   []byte    // frames are read into it by pairExchange
}

// extend sets the connection's deadline (by set) to dl, or leaves the one
// it has when that is at most a tenth of the timeout earlier: a call of a
// few microseconds does not rearm a timer.
func (d *directConn) extend(dl time.Time, set func(time.Time) error) {
	if d.until.IsZero() || dl.Before(d.until) || dl.Sub(d.until) > time.Second/10 {
		_ = set(dl)
		d.until = dl
	}
}

func (d *directConn) Close() error {
	err := d.tls.Close()
	d.ep.untrackDirect(d)
	return err
}

// directSide is an endpoint's TCP listener and its open direct links.
type directSide struct {
	ln       net.Listener
	server   *tls.Config
	client   *tls.Config // for direct links
	probe    *tls.Config // for probes
	probeMax atomic.Int64
	pending  chan struct{}

	mu    sync.Mutex
	conns map[*directConn]bool
}

// listenDirect opens the TCP listener on the QUIC socket's address. When
// the port is taken, direct links to this endpoint are not possible and
// its groups' peers keep sending over QUIC.
func (e *Endpoint) listenDirect() {
	ua := e.Addr()
	srv := e.cfg.Identity.ServerTLS()
	srv.ClientAuth = tls.RequireAndVerifyClientCert
	srv.NextProtos = []string{alpnDirect, alpnProbe}
	srv.DynamicRecordSizingDisabled = true
	cli := e.cfg.Identity.ClientTLS()
	cli.NextProtos = []string{alpnDirect}
	cli.DynamicRecordSizingDisabled = true
	probe := cli.Clone()
	probe.NextProtos = []string{alpnProbe}
	e.direct = &directSide{server: srv, client: cli, probe: probe, pending: make(chan struct{}, maxDirectPending), conns: map[*directConn]bool{}}
	if e.cfg.Protocols.Max < version.DirectProtocol {
		return
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ua.IP, Port: ua.Port, Zone: ua.Zone})
	if err != nil {
		e.log.Info("collectives stay on QUIC: the TCP port is not free", zap.Error(err))
		return
	}
	e.direct.ln = ln
	e.wg.Add(1)
	go e.acceptDirect(ln)
}

func (e *Endpoint) acceptDirect(ln net.Listener) {
	defer e.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || e.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case e.direct.pending <- struct{}{}:
		default:
			_ = nc.Close()
			continue
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer func() { <-e.direct.pending }()
			e.serveDirect(nc)
		}()
	}
}

// serveDirect authenticates an incoming direct link and hands it to its
// group. Refusals answer with a reason when the handshake got that far.
func (e *Endpoint) serveDirect(nc net.Conn) {
	pc := newPollConn(nc.(*net.TCPConn))
	tc := tls.Server(pc, e.direct.server)
	_ = nc.SetDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	// Until a group or the probe owns it (and closes it with the
	// endpoint), the endpoint's close ends the connection's wait.
	stop := context.AfterFunc(e.ctx, func() { _ = nc.Close() })
	defer stop()
	refuse := func(why string) {
		_ = WriteFrame(tc, append([]byte{0}, why...))
		_ = tc.Close()
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		_ = nc.Close()
		return
	}
	st := tc.ConnectionState()
	if (st.NegotiatedProtocol != alpnDirect && st.NegotiatedProtocol != alpnProbe) || len(st.VerifiedChains) == 0 {
		_ = nc.Close()
		return
	}
	id, _ := PeerIdentity(st.VerifiedChains[0])
	if e.isRevoked(id) {
		e.log.Warn("refused a direct link from a removed node", zap.String("id", id))
		refuse(revokedMsg(id))
		return
	}
	if st.NegotiatedProtocol == alpnProbe {
		limit := e.direct.probeMax.Load()
		d := &directConn{tls: tc, raw: pc, peer: id, ep: e}
		if limit <= 0 || e.trackDirect(d) != nil {
			_ = nc.Close()
			return
		}
		serveProbe(tc, limit)
		_ = d.Close()
		return
	}
	b, err := ReadFrame(tc, directHelloMax)
	if err != nil {
		_ = nc.Close()
		return
	}
	hello, err := parseDirectHello(b)
	if err != nil {
		e.log.Warn("refused a direct link", zap.String("peer", id), zap.Error(err))
		refuse(err.Error())
		return
	}
	d := &directConn{tls: tc, raw: pc, peer: id, ep: e}
	if err := e.trackDirect(d); err != nil {
		refuse(err.Error())
		return
	}
	hubs.Lock()
	h := hubs.m[e]
	hubs.Unlock()
	if h == nil {
		_ = d.Close()
		return
	}
	// From here on the group reads the link; this side only writes the
	// answer.
	_ = nc.SetReadDeadline(time.Time{})
	if err := h.attach(hello, d); err != nil {
		_ = WriteFrame(tc, append([]byte{0}, err.Error()...))
		_ = d.Close()
		return
	}
	if err := WriteFrame(tc, []byte{1}); err != nil {
		_ = d.Close()
		return
	}
	_ = nc.SetWriteDeadline(time.Time{})
}

func (e *Endpoint) trackDirect(d *directConn) error {
	s := e.direct
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.ctx.Err() != nil {
		return net.ErrClosed
	}
	n := 0
	for c := range s.conns {
		if c.peer == d.peer {
			n++
		}
	}
	if n >= maxDirectPerPeer {
		return fmt.Errorf("node %s already holds %d direct links to this node (the limit)", d.peer, n)
	}
	s.conns[d] = true
	return nil
}

func (e *Endpoint) untrackDirect(d *directConn) {
	s := e.direct
	s.mu.Lock()
	delete(s.conns, d)
	s.mu.Unlock()
}

// closeDirect closes the direct links whose peer match reports (all when
// match is nil) and, with the listener, stops accepting.
func (e *Endpoint) closeDirect(match func(id string) bool, listener bool) {
	s := e.direct
	if s == nil {
		return
	}
	if listener && s.ln != nil {
		_ = s.ln.Close()
	}
	s.mu.Lock()
	var close []*directConn
	for c := range s.conns {
		if match == nil || match(c.peer) {
			close = append(close, c)
		}
	}
	s.mu.Unlock()
	for _, c := range close {
		_ = c.Close()
	}
}

// dialTLS opens a TCP connection to addr (the QUIC port's number) and
// runs TLS with the cluster's certificates and tc's one ALPN protocol; the
// connection keeps ctx's deadline. It is tracked (closed with the endpoint
// or the peer's revocation) until its Close.
func (e *Endpoint) dialTLS(ctx context.Context, addr string, tc *tls.Config) (*directConn, error) {
	var dl net.Dialer
	nc, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	pc := newPollConn(nc.(*net.TCPConn))
	c := tls.Client(pc, tc)
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	fail := func(err error) (*directConn, error) {
		_ = nc.Close()
		return nil, err
	}
	if err := c.HandshakeContext(ctx); err != nil {
		return fail(err)
	}
	st := c.ConnectionState()
	if st.NegotiatedProtocol != tc.NextProtos[0] || len(st.VerifiedChains) == 0 {
		return fail(fmt.Errorf("%s does not serve %s", addr, tc.NextProtos[0]))
	}
	id, _ := PeerIdentity(st.VerifiedChains[0])
	if e.isRevoked(id) {
		return fail(fmt.Errorf("%w (%s)", ErrRevoked, id))
	}
	d := &directConn{tls: c, raw: pc, peer: id, ep: e}
	if err := e.trackDirect(d); err != nil {
		return fail(err)
	}
	return d, nil
}

// dialDirect opens a direct link to addr for hello's group: TCP to the
// QUIC port's number, TLS with the cluster's certificates, the hello and
// the peer's acceptance, all within ctx.
func (e *Endpoint) dialDirect(ctx context.Context, addr string, hello directHello) (*directConn, error) {
	d, err := e.dialTLS(ctx, addr, e.direct.client)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*directConn, error) {
		_ = d.Close()
		return nil, err
	}
	if err := WriteFrame(d.tls, hello.append(nil)); err != nil {
		return fail(err)
	}
	b, err := ReadFrame(d.tls, 1024)
	if err != nil {
		return fail(err)
	}
	if len(b) == 0 || b[0] != 1 {
		if len(b) > 0 {
			b = b[1:]
		}
		return fail(fmt.Errorf("refused: %s", b))
	}
	_ = d.raw.SetDeadline(time.Time{})
	return d, nil
}

// directPeer is a group's direct links with one other member.
type directPeer struct {
	mu      sync.Mutex
	out     *directConn   // this member's link to the peer
	tried   bool          // out was opened or failed to open: not tried again
	in      *directConn   // the peer's link to this member
	first   uint64        // the first call in carries
	arrived chan struct{} // closed when in is attached
}

// Direct is how many of the other members this member exchanges
// collectives with over direct links in both directions.
func (g *Group) Direct() int {
	n := 0
	for j := range g.direct {
		p := &g.direct[j]
		p.mu.Lock()
		if j != g.cfg.Rank && p.out != nil && p.in != nil {
			n++
		}
		p.mu.Unlock()
	}
	return n
}

// closeDirect closes the group's direct links, which ends a peer's read
// of them at once.
func (g *Group) closeDirect() {
	for j := range g.direct {
		p := &g.direct[j]
		p.mu.Lock()
		out, in := p.out, p.in
		p.out = nil
		p.tried = true
		if in != nil {
			p.in = nil
			p.first = ^uint64(0)
		}
		p.mu.Unlock()
		if out != nil {
			_ = out.Close()
		}
		if in != nil {
			_ = in.Close()
		}
	}
}

// attach gives a group the direct link a member opened to it.
func (h *collHub) attach(hello directHello, d *directConn) error {
	h.mu.Lock()
	g := h.live[hello.Group]
	h.mu.Unlock()
	if g == nil {
		return fmt.Errorf("no group %q here (it closed or failed)", hello.Group)
	}
	if hello.Rank >= g.Size() || hello.Rank == g.cfg.Rank {
		return fmt.Errorf("group %q: a link from rank %d", hello.Group, hello.Rank)
	}
	p := &g.direct[hello.Rank]
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case g.ctx.Err() != nil:
		return fmt.Errorf("group %q: %w", hello.Group, ErrClosed)
	case p.in != nil || closed(p.arrived):
		return fmt.Errorf("group %q already has a link from rank %d", hello.Group, hello.Rank)
	}
	p.in, p.first = d, hello.First
	close(p.arrived)
	return nil
}

// directPossible reports whether member j may send this group's
// collectives over a direct link: it speaks DirectProtocol.
func (c *call) directPossible(j int) bool {
	return !c.g.cfg.NoDirect && c.g.hub.out.protocol(c.g.cfg.Members[j]) >= version.DirectProtocol
}

// directTimeout bounds opening a direct link: a peer whose TCP port is
// filtered costs one call this much, once.
const directTimeout = time.Second

// directTo returns this member's direct link to member j, opening it on
// the first call after the QUIC stream to j told j's protocol; nil when j
// is sent to over QUIC.
func (c *call) directTo(j int) *directConn {
	g := c.g
	p := &g.direct[j]
	p.mu.Lock()
	out, tried := p.out, p.tried
	p.mu.Unlock()
	if out != nil || tried {
		return out
	}
	if c.seq < 2 || !c.directPossible(j) {
		return nil
	}
	p.mu.Lock()
	p.tried = true
	p.mu.Unlock()
	ep := g.hub.out.ep
	ctx, cancel := context.WithTimeout(c.ctx, directTimeout)
	defer cancel()
	d, err := ep.dialDirect(ctx, g.cfg.Members[j], directHello{Group: g.cfg.ID, Rank: g.cfg.Rank, First: c.seq})
	if err != nil {
		ep.log.Warn("tensor-parallel collectives stay on QUIC: no direct link (TCP on the QUIC port's number)",
			zap.String("group", g.cfg.ID), zap.String("peer", g.cfg.Members[j]), zap.Error(err))
		return nil
	}
	p.mu.Lock()
	if g.ctx.Err() != nil {
		p.mu.Unlock()
		_ = d.Close()
		return nil
	}
	p.out = d
	p.mu.Unlock()
	return d
}

// directErr is what a failed read or write of a direct link reports: the
// end of the peer's link, or the deadline of the call or of ctx (the
// connection's deadline may fire a moment before ctx's own timer).
func (g *Group) directErr(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("the peer closed its direct link: %w", errLinkLost)
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < time.Millisecond {
			return context.DeadlineExceeded
		}
		return fmt.Errorf("nothing within %v: %w", g.cfg.Timeout, context.DeadlineExceeded)
	}
	return err
}

// writeDirect writes one frame to a direct link within the call's time.
func (c *call) writeDirect(d *directConn, frame []byte) error {
	err := withDeadline(c.ctx, d.tls.SetWriteDeadline, func() error { return d.write(frame) })
	if err != nil {
		return c.g.directErr(c.ctx, err)
	}
	return nil
}

// write writes one frame: the TLS records of a large one gather and go to
// the socket in one system call.
func (d *directConn) write(frame []byte) error {
	if len(frame) <= maxRecord {
		_, err := d.tls.Write(frame)
		return err
	}
	d.raw.cork()
	_, err := d.tls.Write(frame)
	if ferr := d.raw.flush(); err == nil {
		err = ferr
	}
	return err
}

// maxRecord is the payload of a full TLS record.
const maxRecord = 16 << 10

// readDirect reads the next frame off src's direct link. The link carries
// src's frames of this group in the order src sends them, which is the
// order this member asks for them; recv refuses anything else.
func (c *call) readDirect(d *directConn) (*message, error) {
	g := c.g
	d.raw.setPoll(c.poll)
	bp := recvPool.Get().(*[]byte)
	var f TensorFrame
	err := withDeadline(c.ctx, d.tls.SetReadDeadline, func() error {
		var body []byte
		var err error
		f, body, err = readTensorFrame(d.tls, DefaultMaxTensorFrame, *bp)
		if body != nil {
			*bp = body[:0]
		}
		return err
	})
	if err != nil {
		recvPool.Put(bp)
		return nil, g.directErr(c.ctx, err)
	}
	return &message{frame: f, size: len(f.Payload) + len(f.Tag), buf: bp}, nil
}

// pairExchange is the all-reduce of a two-member group whose direct links
// both carry this call, when x fits a frame written inline: the whole call
// on this goroutine, with no context, timer or goroutine of its own. It
// reports false, having done nothing, when the call must take the general
// path. The sum is the one exchangeSum takes (two values add the same in
// either order).
func (g *Group) pairExchange(ctx context.Context, x []float32) (bool, error) {
	if g.Size() != 2 || len(x) == 0 {
		return false, nil
	}
	dt := g.cfg.DType
	if dt.EncodedLen(len(x))+tensorHeaderLen+MaxTagLen > directInlineMax {
		return false, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	j := 1 - g.cfg.Rank
	p := &g.direct[j]
	p.mu.Lock()
	out, in, first := p.out, p.in, p.first
	p.mu.Unlock()
	if g.err != nil || out == nil || in == nil || g.seq+1 < first || g.ctx.Err() != nil || ctx.Err() != nil {
		return false, nil
	}
	g.seq++
	seq := g.seq
	fail := func(what string, err error) (bool, error) {
		return true, g.broke("all-reduce", seq, fmt.Errorf("transport: group %q all-reduce #%d: %s rank %d (%s): %w",
			g.cfg.ID, seq, what, j, g.cfg.Members[j], err))
	}
	deadline := time.Now().Add(g.cfg.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	out.extend(deadline, out.tls.SetWriteDeadline)
	in.extend(deadline, in.tls.SetReadDeadline)
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			_ = out.tls.SetWriteDeadline(time.Unix(1, 0))
			_ = in.tls.SetReadDeadline(time.Unix(1, 0))
		})
		defer stop()
	}
	h := TensorHeader{Type: MsgCollective, DType: dt, ID: seq, Tag: g.tags[phaseExchange][g.cfg.Rank], Rows: 1, Cols: len(x)}
	var err error
	if g.frame, err = AppendTensorMessage(g.frame[:0], h, x); err != nil {
		return fail("send to", err)
	}
	if dt != F32 { // sum what the other member will see of x
		_ = DecodeTensor(dt, g.frame[tensorHeaderLen+len(h.Tag):], x)
	}
	if err := out.write(g.frame); err != nil {
		return fail("send to", g.directErr(ctx, err))
	}
	in.raw.setPoll(g.cfg.Poll)
	f, body, err := readTensorFrame(in.tls, DefaultMaxTensorFrame, in.buf)
	if body != nil {
		in.buf = body[:0]
	}
	if err != nil {
		return fail("waiting for", g.directErr(ctx, err))
	}
	if err := g.frameErr(&f, seq, g.tags[phaseExchange][j], len(x)); err != nil {
		return fail("from", err)
	}
	tmp := scratch(&g.tmp, len(x))
	_ = f.Decode(tmp)
	addTo(x, tmp)
	return true, nil
}
