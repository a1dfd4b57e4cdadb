package transport

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"shoal/internal/version"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/zap"
)

// Application error codes sent when the endpoint refuses a peer or stream.
const (
	codeOK            quic.ApplicationErrorCode = 0
	codeNoCertificate quic.ApplicationErrorCode = 0x10
	codeRevoked       quic.ApplicationErrorCode = 0x13
	codeForbidden     quic.StreamErrorCode      = 0x11
	codeUnknownKind   quic.StreamErrorCode      = 0x12
)

// Peer is who opened a stream, taken from the verified TLS chain.
type Peer struct {
	ID       string // node ID (certificate common name); empty without a certificate
	Name     string // the node name the certificate binds ("" for older certificates)
	Role     string // server or client
	Addr     net.Addr
	Verified bool
	// Protocol is the protocol negotiated on the connection (1 with a
	// build from before protocols were negotiated).
	Protocol int
}

// Handler serves one accepted stream. It owns the stream and must close it.
type Handler func(s *Stream)

// Stream is one QUIC stream of a given kind. It implements net.Conn so that
// stream-oriented libraries (raft) can use it directly.
type Stream struct {
	*quic.Stream
	Kind  Kind
	Peer  Peer
	local net.Addr
}

// LocalAddr implements net.Conn.
func (s *Stream) LocalAddr() net.Addr { return s.local }

// RemoteAddr implements net.Conn.
func (s *Stream) RemoteAddr() net.Addr { return s.Peer.Addr }

// Close closes both directions of the stream.
func (s *Stream) Close() error {
	s.Stream.CancelRead(0)
	return s.Stream.Close()
}

// CloseWrite sends FIN and keeps the read side open for the reply.
func (s *Stream) CloseWrite() error { return s.Stream.Close() }

// Config of an Endpoint.
type Config struct {
	Bind     string // host:port to listen on; port 0 picks one
	Identity *Identity
	// Idle timeout of a connection; keep-alives are sent at a third of it.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds a dial to a silent peer.
	HandshakeTimeout time.Duration
	// Protocols is the window of protocols the endpoint speaks (zero:
	// this build's, version.This); Build its version for the refusals of
	// peers outside it (empty: version.String()). Tests set other ones.
	Protocols version.Window
	Build     string
}

// Endpoint is the node's one QUIC endpoint.
type Endpoint struct {
	cfg  Config
	udp  *net.UDPConn
	tr   *quic.Transport
	ln   *quic.Listener
	qcfg *quic.Config
	log  *zap.Logger

	mu       sync.Mutex
	handlers map[Kind]Handler
	conns    map[string]*dialEntry
	accepted map[*quic.Conn]string        // node ID of each accepted connection's peer
	live     map[*quic.Conn]tracked       // every open connection, for PeerStats
	retired  map[netip.AddrPort]*PeerStat // what closed connections carried, by peer
	closed   bool
	revoked  atomic.Pointer[func(id string) bool]
	self     sync.Map // address -> whether it reaches this endpoint (IsSelf)
	direct   *directSide

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type dialEntry struct {
	done chan struct{}
	conn *quic.Conn
	err  error
}

// Listen opens the UDP socket and starts accepting connections.
func Listen(cfg Config) (*Endpoint, error) {
	if cfg.Identity == nil {
		return nil, errors.New("transport: an identity is required")
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 6 * time.Second
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 3 * time.Second
	}
	cfg.Protocols, cfg.Build = cfg.Protocols.Or(), version.BuildOr(cfg.Build)
	ua, err := net.ResolveUDPAddr("udp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("quic bind address %q: %w", cfg.Bind, err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("quic listen on %s: %w", cfg.Bind, err)
	}
	e := &Endpoint{
		cfg: cfg,
		udp: udp,
		tr:  &quic.Transport{Conn: udp, StatelessResetKey: resetKey(cfg.Identity)},
		qcfg: &quic.Config{
			MaxIdleTimeout:        cfg.IdleTimeout,
			KeepAlivePeriod:       cfg.IdleTimeout / 3,
			HandshakeIdleTimeout:  cfg.HandshakeTimeout,
			MaxIncomingStreams:    MaxStreamsPerConn,
			MaxIncomingUniStreams: -1,
		},
		log:      zap.L().Named("transport"),
		handlers: map[Kind]Handler{},
		conns:    map[string]*dialEntry{},
		accepted: map[*quic.Conn]string{},
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.ln, err = e.tr.Listen(listenTLS(cfg.Identity.ServerTLS(), cfg.Protocols, func(offered []string) {
		e.log.Warn("refused a node of another protocol", zap.Strings("offered", offered), zap.Stringer("window", cfg.Protocols))
	}), e.qcfg)
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("quic listen: %w", err)
	}
	e.listenDirect()
	e.wg.Add(1)
	go e.acceptLoop()
	return e, nil
}

// resetKey derives the stateless reset key from the node's private key, so
// a node restarted on the same address resets the connections its peers
// still hold to its previous run instead of leaving them to time out.
func resetKey(id *Identity) *quic.StatelessResetKey {
	var k quic.StatelessResetKey
	h := sha256.New()
	h.Write([]byte("shoal stateless reset v1"))
	if pk, ok := id.Cert.PrivateKey.(ed25519.PrivateKey); ok {
		h.Write(pk.Seed())
	} else {
		h.Write(id.Cert.Certificate[0])
	}
	copy(k[:], h.Sum(nil))
	return &k
}

// Addr is the bound UDP address.
func (e *Endpoint) Addr() *net.UDPAddr { return e.udp.LocalAddr().(*net.UDPAddr) }

// Identity of this endpoint.
func (e *Endpoint) Identity() *Identity { return e.cfg.Identity }

// Handle registers the handler of a stream kind.
func (e *Endpoint) Handle(k Kind, h Handler) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handlers[k] = h
}

func (e *Endpoint) acceptLoop() {
	defer e.wg.Done()
	for {
		conn, err := e.ln.Accept(e.ctx)
		if err != nil {
			return
		}
		e.wg.Add(1)
		go e.serveConn(conn)
	}
}

func peerOf(conn *quic.Conn) Peer {
	st := conn.ConnectionState().TLS
	p := Peer{Addr: conn.RemoteAddr(), Protocol: connProtocol(conn)}
	if len(st.VerifiedChains) > 0 {
		p.ID, p.Role = PeerIdentity(st.VerifiedChains[0])
		p.Name = certName(st.VerifiedChains[0][0])
		p.Verified = true
	}
	return p
}

// SetRevoked gives the endpoint the cluster's revocation list: connections
// from or to a node whose certificate it names are refused.
func (e *Endpoint) SetRevoked(revoked func(id string) bool) { e.revoked.Store(&revoked) }

func (e *Endpoint) isRevoked(id string) bool {
	f := e.revoked.Load()
	return id != "" && f != nil && (*f)(id)
}

// ErrRevoked is the error of a connection refused because a certificate
// was revoked.
var ErrRevoked = errors.New("certificate revoked: the node was removed from the cluster (shoal node rm); start it with a fresh --data-dir and a new join token")

// asRevoked turns a peer's revocation close into ErrRevoked.
func asRevoked(err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote && ae.ErrorCode == codeRevoked {
		return fmt.Errorf("%w (%s)", ErrRevoked, ae.ErrorMessage)
	}
	return err
}

func revokedMsg(id string) string {
	return "certificate of node " + id + " is revoked: it was removed from the cluster (shoal node rm)"
}

// CloseRevoked closes the open connections of nodes revoked since they
// connected.
func (e *Endpoint) CloseRevoked() {
	var close []*quic.Conn
	var ids []string
	e.mu.Lock()
	for c, id := range e.accepted {
		if e.isRevoked(id) {
			close, ids = append(close, c), append(ids, id)
		}
	}
	for addr, d := range e.conns {
		select {
		case <-d.done:
		default:
			continue
		}
		if d.err == nil {
			if id, _ := PeerIdentity(d.conn.ConnectionState().TLS.PeerCertificates); e.isRevoked(id) {
				close, ids = append(close, d.conn), append(ids, id)
				delete(e.conns, addr)
			}
		}
	}
	e.mu.Unlock()
	for i, c := range close {
		_ = c.CloseWithError(codeRevoked, revokedMsg(ids[i]))
	}
	e.closeDirect(e.isRevoked, false)
}

// Limits on what one peer may hold open on this endpoint. The cluster's
// own traffic between two nodes needs far less: one long-lived stream per
// tensor kind (activations, collectives) in each direction, a few Raft
// streams, one RPC stream per call in flight (a driver's step to each
// member, control calls), one kv stream per KV transfer in flight, a few
// weights and probe streams, and one forward stream per HTTP request a
// gateway passes to the driver (the driver's queue bounds them: beyond it
// requests get 429 at once).
const (
	// MaxStreamsPerConn bounds the bidirectional streams a peer may have
	// open at once on one connection (QUIC's stream limit: the peer's
	// next stream waits until one ends).
	MaxStreamsPerConn = 1024
	// MaxConnsPerPeer bounds the connections one node (by certificate)
	// may hold open to this endpoint; a node dials each address of a peer
	// once, so it has one or two, and a restarted node briefly a few
	// more until the old ones are reset.
	MaxConnsPerPeer = 8
	// maxTensorStreams bounds the streams of each tensor kind
	// (activations, collectives) per connection: they stay open idle by
	// design, and a sender keeps one per peer and kind.
	maxTensorStreams = 16
	// codeTooManyConns closes a connection over MaxConnsPerPeer;
	// codeTooManyStreams resets a tensor stream over maxTensorStreams.
	codeTooManyConns   quic.ApplicationErrorCode = 0x14
	codeTooManyStreams quic.StreamErrorCode      = 0x15
)

// connStreams counts the tensor streams open on one accepted connection.
type connStreams struct {
	mu     sync.Mutex
	tensor map[Kind]int
}

// take reserves a place for a stream of kind k; false when the kind is at
// its limit. Kinds without a limit always get one.
func (c *connStreams) take(k Kind) bool {
	if k != KindActivations && k != KindCollectives {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tensor[k] >= maxTensorStreams {
		return false
	}
	if c.tensor == nil {
		c.tensor = map[Kind]int{}
	}
	c.tensor[k]++
	return true
}

func (c *connStreams) done(k Kind) {
	if k != KindActivations && k != KindCollectives {
		return
	}
	c.mu.Lock()
	c.tensor[k]--
	c.mu.Unlock()
}

func (e *Endpoint) serveConn(conn *quic.Conn) {
	defer e.wg.Done()
	if conn.ConnectionState().TLS.NegotiatedProtocol == alpnVersion {
		answerVersion(conn, e.cfg.Build, e.cfg.Protocols)
		return
	}
	peer := peerOf(conn)
	if e.isRevoked(peer.ID) {
		e.log.Warn("refused a removed node", zap.String("id", peer.ID), zap.Stringer("addr", peer.Addr))
		_ = conn.CloseWithError(codeRevoked, revokedMsg(peer.ID))
		return
	}
	e.mu.Lock()
	n := 0
	if peer.ID != "" {
		for _, id := range e.accepted {
			if id == peer.ID {
				n++
			}
		}
	}
	if n >= MaxConnsPerPeer {
		e.mu.Unlock()
		e.log.Warn("refused a connection: the node holds too many", zap.String("id", peer.ID), zap.Stringer("addr", peer.Addr), zap.Int("limit", MaxConnsPerPeer))
		_ = conn.CloseWithError(codeTooManyConns, fmt.Sprintf("node %s already holds %d connections to this node (the limit): reuse one", peer.ID, n))
		return
	}
	e.accepted[conn] = peer.ID
	e.mu.Unlock()
	e.track(conn, peer.ID)
	defer func() {
		e.mu.Lock()
		delete(e.accepted, conn)
		e.mu.Unlock()
	}()
	var open connStreams
	for {
		s, err := conn.AcceptStream(e.ctx)
		if err != nil {
			return
		}
		go e.serveStream(conn, peer, s, &open)
	}
}

func (e *Endpoint) serveStream(conn *quic.Conn, peer Peer, s *quic.Stream, open *connStreams) {
	_ = s.SetReadDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	var b [1]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		s.CancelRead(codeUnknownKind)
		s.CancelWrite(codeUnknownKind)
		return
	}
	_ = s.SetReadDeadline(time.Time{})
	k := Kind(b[0])
	if !peer.Verified && k != KindJoin {
		e.log.Warn("refused peer without a cluster certificate", zap.Stringer("addr", peer.Addr), zap.Stringer("kind", k))
		_ = conn.CloseWithError(codeNoCertificate, "a cluster certificate is required")
		return
	}
	if k == KindRaft && peer.Role != RoleServer {
		e.log.Warn("refused raft stream from a non-server", zap.String("peer", peer.ID))
		s.CancelRead(codeForbidden)
		s.CancelWrite(codeForbidden)
		return
	}
	e.mu.Lock()
	h := e.handlers[k]
	e.mu.Unlock()
	if h == nil {
		s.CancelRead(codeUnknownKind)
		s.CancelWrite(codeUnknownKind)
		return
	}
	if !open.take(k) {
		e.log.Warn("refused a stream: the connection holds too many of its kind", zap.String("peer", peer.ID), zap.Stringer("kind", k), zap.Int("limit", maxTensorStreams))
		s.CancelRead(codeTooManyStreams)
		s.CancelWrite(codeTooManyStreams)
		return
	}
	defer open.done(k)
	h(&Stream{Stream: s, Kind: k, Peer: peer, local: e.Addr()})
}

// IsSelf reports whether addr reaches this endpoint: the node at the other
// end of a connection to addr (opened if none is) presents this endpoint's
// own node ID. The answer is remembered per address; a failed dial answers
// false and is asked again next time.
func (e *Endpoint) IsSelf(ctx context.Context, addr string) bool {
	if v, ok := e.self.Load(addr); ok {
		return v.(bool)
	}
	conn, err := e.conn(ctx, addr)
	if err != nil {
		return false
	}
	id, _ := PeerIdentity(conn.ConnectionState().TLS.PeerCertificates)
	self := id != "" && id == e.cfg.Identity.ID
	e.self.Store(addr, self)
	return self
}

// PeerAt is the verified identity of the node at addr: the certificate
// its end of a connection (opened if none is) presents.
func (e *Endpoint) PeerAt(ctx context.Context, addr string) (Peer, error) {
	conn, err := e.conn(ctx, addr)
	if err != nil {
		return Peer{}, err
	}
	p := Peer{Addr: conn.RemoteAddr(), Verified: true}
	if certs := conn.ConnectionState().TLS.PeerCertificates; len(certs) > 0 {
		p.ID, p.Role = PeerIdentity(certs)
		p.Name = certName(certs[0])
	}
	return p, nil
}

// selfPeer is this endpoint as the sender of what it delivers to itself.
func (e *Endpoint) selfPeer() Peer {
	return Peer{ID: e.cfg.Identity.ID, Name: e.cfg.Identity.Name, Role: e.cfg.Identity.Role, Addr: e.Addr(), Verified: true}
}

// Dial opens a stream of kind k to the endpoint at addr, reusing the
// connection to that address when one is open.
func (e *Endpoint) Dial(ctx context.Context, addr string, k Kind) (*Stream, error) {
	return e.DialAs(ctx, addr, k, "", "")
}

// ErrWrongPeer is the error of a dial whose peer's certificate is not the
// node or role the caller expected: what gossip or a stale record said
// lives at an address is a hint, the certificate is the answer.
var ErrWrongPeer = errors.New("the peer's certificate is not the expected node")

// DialAs is Dial that opens the stream only when the peer's certificate
// names node wantID (when not empty) with role wantRole (when not empty):
// nothing of the stream, not even its kind, reaches another peer.
func (e *Endpoint) DialAs(ctx context.Context, addr string, k Kind, wantID, wantRole string) (*Stream, error) {
	for attempt := 0; attempt < 2; attempt++ {
		conn, err := e.conn(ctx, addr)
		if err != nil {
			return nil, err
		}
		if wantID != "" || wantRole != "" {
			id, role := PeerIdentity(conn.ConnectionState().TLS.PeerCertificates)
			if wantID != "" && id != wantID || wantRole != "" && role != wantRole {
				return nil, fmt.Errorf("dial %s: %w: want node %q role %q, it presents node %q role %q", addr, ErrWrongPeer, wantID, wantRole, id, role)
			}
		}
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			e.forget(addr, conn)
			if ctx.Err() != nil {
				return nil, err
			}
			if err := e.refused(err, addr); err != nil {
				return nil, err
			}
			continue
		}
		if _, err := s.Write([]byte{byte(k)}); err != nil {
			s.CancelRead(0)
			s.Close()
			e.forget(addr, conn)
			if err := e.refused(err, addr); err != nil {
				return nil, err
			}
			continue
		}
		p := peerOf(conn)
		p.Verified = true // the client config verified the server against the CA
		st := conn.ConnectionState().TLS
		if len(st.PeerCertificates) > 0 {
			p.ID, p.Role = PeerIdentity(st.PeerCertificates)
			p.Name = certName(st.PeerCertificates[0])
		}
		return &Stream{Stream: s, Kind: k, Peer: p, local: e.Addr()}, nil
	}
	return nil, fmt.Errorf("dial %s: connection lost", addr)
}

// refused is err as the refusal it is (a revoked certificate, a protocol
// outside the peer's window), or nil when it is none: retrying cannot
// help a refusal.
func (e *Endpoint) refused(err error, addr string) error {
	if err := asRevoked(err); errors.Is(err, ErrRevoked) {
		return err
	}
	return nil
}

// IsVersionMismatch reports whether err is a refusal for want of a shared
// protocol (a *version.Mismatch).
func IsVersionMismatch(err error) bool {
	var m *version.Mismatch
	return errors.As(err, &m)
}

func (e *Endpoint) conn(ctx context.Context, addr string) (*quic.Conn, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, net.ErrClosed
	}
	if d, ok := e.conns[addr]; ok {
		e.mu.Unlock()
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if d.err == nil && d.conn.Context().Err() == nil {
			return d.conn, nil
		}
		e.mu.Lock()
		if e.conns[addr] == d {
			delete(e.conns, addr)
		}
		e.mu.Unlock()
		if d.err != nil {
			return nil, d.err
		}
		return e.conn(ctx, addr)
	}
	d := &dialEntry{done: make(chan struct{})}
	e.conns[addr] = d
	e.mu.Unlock()

	d.conn, d.err = e.dialConn(ctx, addr, dialTLS(e.cfg.Identity.ClientTLS(), e.cfg.Protocols))
	if d.err == nil {
		if id, _ := PeerIdentity(d.conn.ConnectionState().TLS.PeerCertificates); e.isRevoked(id) {
			_ = d.conn.CloseWithError(codeRevoked, revokedMsg(id))
			d.conn, d.err = nil, fmt.Errorf("dial %s: %s", addr, revokedMsg(id))
		}
	}
	if d.err == nil {
		id, _ := PeerIdentity(d.conn.ConnectionState().TLS.PeerCertificates)
		e.track(d.conn, id)
	}
	close(d.done)
	if d.err != nil {
		e.mu.Lock()
		if e.conns[addr] == d {
			delete(e.conns, addr)
		}
		e.mu.Unlock()
		return nil, d.err
	}
	return d.conn, nil
}

func (e *Endpoint) dialConn(ctx context.Context, addr string, tc *tls.Config) (*quic.Conn, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HandshakeTimeout)
	defer cancel()
	c, err := e.tr.Dial(ctx, ua, tc, e.qcfg)
	if noSharedProtocol(err) {
		err = mismatch(context.WithoutCancel(ctx), e.tr, addr, e.cfg.Protocols, e.cfg.Build, e.cfg.HandshakeTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

func (e *Endpoint) forget(addr string, c *quic.Conn) {
	e.mu.Lock()
	if d, ok := e.conns[addr]; ok && d.conn == c {
		delete(e.conns, addr)
	}
	e.mu.Unlock()
	_ = c.CloseWithError(codeOK, "")
}

// Close stops accepting, closes every connection and the socket.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	conns := e.conns
	e.conns = map[string]*dialEntry{}
	var accepted []*quic.Conn
	for c := range e.accepted {
		accepted = append(accepted, c)
	}
	e.mu.Unlock()
	e.cancel()
	for _, d := range conns {
		<-d.done
		if d.conn != nil {
			_ = d.conn.CloseWithError(codeOK, "shutdown")
		}
	}
	// Peers that dialed this endpoint learn of the shutdown now, not
	// after their idle timeout: their calls and forwarded answers fail
	// at once.
	for _, c := range accepted {
		_ = c.CloseWithError(codeOK, "shutdown")
	}
	e.closeDirect(nil, true)
	_ = e.ln.Close()
	err := e.tr.Close()
	_ = e.udp.Close()
	e.wg.Wait()
	return err
}

// DialPinned opens a one-off connection from a fresh UDP socket to addr,
// trusting the server only if its CA matches caHash, and opens one stream
// of kind k. It is how a node without a certificate joins. Release the
// connection with the returned func.
func DialPinned(ctx context.Context, addr, caHash string, k Kind, timeout time.Duration) (*Stream, func(), error) {
	return DialPinnedAs(ctx, addr, caHash, k, timeout, version.Window{}, "")
}

// DialPinnedAs is DialPinned for a dialer of protocol window w and version
// build (zero: this build's). A server that refuses w fails the stream with
// a *version.Mismatch naming both sides (AsVersionMismatch).
func DialPinnedAs(ctx context.Context, addr, caHash string, k Kind, timeout time.Duration, w version.Window, build string) (*Stream, func(), error) {
	var ca *x509.Certificate
	tc := PinnedTLS(caHash, &ca)
	var mismatch atomic.Bool // the handshake's error does not survive quic's wrapping
	verify := tc.VerifyPeerCertificate
	tc.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		err := verify(raw, chains)
		mismatch.Store(errors.Is(err, ErrCAMismatch))
		return err
	}
	return dialOnce(ctx, addr, dialTLS(tc, w.Or()), k, timeout, &mismatch, w, build)
}

// DialUnverified is DialPinned without any check of the server: only for
// exchanges whose messages authenticate themselves (the bootstrap servers
// seal theirs with a key derived from their shared secret).
func DialUnverified(ctx context.Context, addr string, k Kind, timeout time.Duration) (*Stream, func(), error) {
	tc := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, NextProtos: alpnFor(version.This)}
	return dialOnce(ctx, addr, tc, k, timeout, nil, version.Window{}, "")
}

func dialOnce(ctx context.Context, addr string, tc *tls.Config, k Kind, timeout time.Duration, caMismatch *atomic.Bool, w version.Window, build string) (*Stream, func(), error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("join address %q: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, nil, err
	}
	tr := &quic.Transport{Conn: udp}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := tr.Dial(ctx, ua, tc, &quic.Config{HandshakeIdleTimeout: timeout, MaxIdleTimeout: 2 * timeout})
	if err != nil {
		if caMismatch != nil && caMismatch.Load() {
			err = ErrCAMismatch
		}
		if noSharedProtocol(err) {
			err = mismatch(context.Background(), tr, addr, w.Or(), version.BuildOr(build), timeout)
		}
		tr.Close()
		udp.Close()
		return nil, nil, fmt.Errorf("join %s: %w", addr, err)
	}
	cleanup := func() {
		_ = conn.CloseWithError(codeOK, "")
		tr.Close()
		udp.Close()
	}
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("join %s: %w", addr, err)
	}
	if _, err := s.Write([]byte{byte(k)}); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("join %s: %w", addr, err)
	}
	return &Stream{Stream: s, Kind: k, Peer: Peer{Addr: conn.RemoteAddr(), Protocol: connProtocol(conn)}, local: udp.LocalAddr()}, cleanup, nil
}
