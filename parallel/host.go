package parallel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
}

// NewHost serves dist on ep. rpc is the endpoint's KindRPC server and mb
// its activation mailbox; nil makes them (an endpoint has one of each, so
// pass the node's when it has them). The RPC server's timeout must exceed
// the sessions' step timeouts.
func NewHost(ep *transport.Endpoint, rpc *transport.RPCServer, mb *transport.Mailbox) *Host {
	h := &Host{ep: ep, mb: mb, members: map[string]*Member{}}
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
		return ms.open(&req)
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

// handle wraps a method: it finds the member the request names.
func (h *Host) handle(f func(ctx context.Context, m *Member, raw json.RawMessage) (any, error)) transport.RPCHandler {
	return func(ctx context.Context, peer transport.Peer, raw json.RawMessage) (any, error) {
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
