package parallel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"shoal/transport"
)

// hostRPCTimeout bounds one call on the RPC server a Host makes for
// itself; a step bounds itself by its session's (shorter) timeout.
const hostRPCTimeout = time.Minute

// ErrClosed is returned by calls on a closed Host, Member or Session.
var ErrClosed = errors.New("dist: closed")

// Host serves the dist members of one node and the clusters it drives on
// the node's endpoint: RPC methods "dist.*" on the endpoint's RPC server
// and the activation mailbox.
type Host struct {
	ep    *transport.Endpoint
	mb    *transport.Mailbox
	ownMB bool

	mu      sync.Mutex
	members map[string]*Member
	closed  bool
	kv      KVLink // disaggregated prefill's KV transfers (SetKVLink)
	limits  SessionLimits
	stop    chan struct{} // closed by Close: ends the sweep
	relimit chan struct{} // the limits changed: the sweep takes the new Idle
}

// SessionLimits bound the sessions the members of a Host keep for the
// drivers that open them (dist.open): each session holds a runner and a
// KV cache of the member's layers. A driver keeps one or two per member
// (its served session, a replacement it is moving to, a logits or bench
// run, a prefill pool's), so the limits are far above what one needs.
type SessionLimits struct {
	// PerPeer bounds the sessions of one node (by certificate) on a
	// member (default 8); Total those of all nodes together (default 32).
	// An open beyond either is refused with 429, unless a session of that
	// node (beyond Total: of any node) has been unused for Idle, which is
	// closed to make room.
	PerPeer, Total int
	// Idle: a session unused this long whose driver has no connection to
	// this node any more (it stopped, or lost the close) is closed
	// (default 1 minute).
	Idle time.Duration
}

// Defaults of SessionLimits.
const (
	DefaultSessionsPerPeer = 8
	DefaultSessionsTotal   = 32
	DefaultSessionIdle     = time.Minute
)

// SetSessionLimits changes the limits (zero fields keep their defaults).
func (h *Host) SetSessionLimits(l SessionLimits) {
	if l.PerPeer <= 0 {
		l.PerPeer = DefaultSessionsPerPeer
	}
	if l.Total <= 0 {
		l.Total = DefaultSessionsTotal
	}
	if l.Idle <= 0 {
		l.Idle = DefaultSessionIdle
	}
	h.mu.Lock()
	h.limits = l
	h.mu.Unlock()
	select {
	case h.relimit <- struct{}{}:
	default:
	}
}

func (h *Host) sessionLimits() SessionLimits {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.limits
}

// NewHost serves dist on ep. rpc is the endpoint's KindRPC server and mb
// its activation mailbox; nil makes them (an endpoint has one of each, so
// pass the node's when it has them). The RPC server's timeout must exceed
// the sessions' step timeouts.
func NewHost(ep *transport.Endpoint, rpc *transport.RPCServer, mb *transport.Mailbox) *Host {
	h := &Host{ep: ep, mb: mb, members: map[string]*Member{}, stop: make(chan struct{}), relimit: make(chan struct{}, 1)}
	h.SetSessionLimits(SessionLimits{})
	go h.sweep()
	if rpc == nil {
		rpc = transport.NewRPCServer(ep, transport.KindRPC, hostRPCTimeout)
	}
	if mb == nil {
		h.mb, h.ownMB = transport.NewMailbox(ep, transport.MailboxOptions{}), true
	}
	rpc.Register(methodOpen, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req openReq
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		return ms.open(peerOf(ctx), &req)
	}))
	rpc.Register(methodStep, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req stepReq
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		return ms.step(ctx, &req)
	}))
	rpc.Register(methodFree, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req freeReq
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		return nil, ms.free(&req)
	}))
	rpc.Register(methodKVOpen, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req kvOpenReq
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		return nil, ms.kvOpen(&req)
	}))
	rpc.Register(methodKVWait, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req kvWaitReq
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		return nil, ms.kvWait(ctx, &req)
	}))
	rpc.Register(methodAbort, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req abortReq
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		ms.abort(req.Session, errors.New(req.Reason))
		return nil, nil
	}))
	rpc.Register(methodClose, h.handle(func(ctx context.Context, ms *Member, raw json.RawMessage) (any, error) {
		var req memberAddr
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, badRequest(err)
		}
		ms.closeSession(req.Session)
		return nil, nil
	}))
	return h
}

func badRequest(err error) error {
	return transport.Errorf(http.StatusBadRequest, "dist: malformed request: %v", err)
}

type peerKey struct{}

// peerOf is the caller of the RPC whose context ctx is.
func peerOf(ctx context.Context) transport.Peer {
	p, _ := ctx.Value(peerKey{}).(transport.Peer)
	return p
}

// handle wraps a method: it finds the member the request names (the
// caller is peerOf(ctx)).
func (h *Host) handle(f func(ctx context.Context, m *Member, raw json.RawMessage) (any, error)) transport.RPCHandler {
	return func(ctx context.Context, peer transport.Peer, raw json.RawMessage) (any, error) {
		ctx = context.WithValue(ctx, peerKey{}, peer)
		var a memberAddr
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, badRequest(err)
		}
		h.mu.Lock()
		m, closed := h.members[a.Key], h.closed
		h.mu.Unlock()
		if closed {
			return nil, transport.Errorf(http.StatusServiceUnavailable, "dist: host %s is closed", h.ep.Addr())
		}
		if m == nil {
			return nil, transport.Errorf(http.StatusNotFound, "dist: no member %s on %s", a.Key, h.ep.Addr())
		}
		return f(ctx, m, raw)
	}
}

// Addr is the host's endpoint address.
func (h *Host) Addr() string { return h.ep.Addr().String() }

// Close closes the host's members (their sessions end) and the mailbox
// when the host made it. The endpoint stays open.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.stop)
	ms := make([]*Member, 0, len(h.members))
	for _, m := range h.members {
		ms = append(ms, m)
	}
	h.mu.Unlock()
	for _, m := range ms {
		m.Close()
	}
	if h.ownMB {
		h.mb.Close()
	}
	return nil
}

func (h *Host) add(key string, m *Member) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if h.members[key] != nil {
		return fmt.Errorf("dist: member %s already runs on %s", key, h.ep.Addr())
	}
	h.members[key] = m
	return nil
}

func (h *Host) remove(key string, m *Member) {
	h.mu.Lock()
	if h.members[key] == m {
		delete(h.members, key)
	}
	h.mu.Unlock()
}

// sweep closes, every half Idle (at most 10 s apart), the sessions unused
// for Idle whose driver has no open connection to this node.
func (h *Host) sweep() {
	for {
		every := min(max(h.sessionLimits().Idle/2, 10*time.Millisecond), 10*time.Second)
		t := time.NewTimer(every)
		select {
		case <-h.stop:
			t.Stop()
			return
		case <-h.relimit:
			t.Stop()
			continue
		case <-t.C:
		}
		h.reclaimIdle()
	}
}

// reclaimIdle closes the sessions of every member that are unused for
// Idle and whose driver is gone.
func (h *Host) reclaimIdle() {
	h.mu.Lock()
	ms := make([]*Member, 0, len(h.members))
	for _, m := range h.members {
		ms = append(ms, m)
	}
	idle := h.limits.Idle
	h.mu.Unlock()
	var live map[netip.AddrPort]bool // asked once, when a session is idle
	connected := func(a netip.AddrPort) bool {
		if live == nil {
			live = map[netip.AddrPort]bool{}
			for _, ps := range h.ep.PeerStats() {
				if ps.Conns > 0 {
					live[ps.Peer] = true
				}
			}
		}
		return live[a]
	}
	now := time.Now()
	for _, m := range ms {
		for _, s := range m.idleSessions(now, idle) {
			if !connected(s.from) {
				m.reclaim(s, fmt.Sprintf("unused for %v and its driver %s is gone", idle, s.peer))
			}
		}
	}
}

// call performs one RPC on a fresh stream to addr; ctx ending aborts it at
// once (not only at its deadline). It returns the request and reply body
// sizes.
func (h *Host) call(ctx context.Context, addr, method string, in, out any) (sent, recvd int, err error) {
	body, err := json.Marshal(in)
	if err != nil {
		return 0, 0, err
	}
	st, err := h.ep.Dial(ctx, addr, transport.KindRPC)
	if err != nil {
		return 0, 0, err
	}
	stop := context.AfterFunc(ctx, func() {
		st.Stream.CancelRead(0)
		st.Stream.CancelWrite(0)
	})
	defer stop()
	var raw json.RawMessage
	err = transport.CallStream(ctx, st, method, json.RawMessage(body), &raw)
	if err == nil && out != nil && len(raw) > 0 {
		err = json.Unmarshal(raw, out)
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return len(body), len(raw), err
}
