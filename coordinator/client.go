package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/internal/nodeaddr"
)

// Caller makes one call on the node-to-node RPC of the agent at addr
// (host:port, or ID@host:port to reach only node ID: internal/nodeaddr).
// The node provides it over its transport, so this package needs none.
type Caller interface {
	Call(ctx context.Context, addr, method string, in, out any) error
}

// RPC methods a server answers for Client (see Client.Handle), and the one
// the leader calls on a node it removed.
const (
	MethodHasState   = "Cluster.HasState"
	MethodState      = "Cluster.State"
	MethodApply      = "Cluster.Apply"
	MethodRemoveNode = "Cluster.RemoveNode"
	// MethodTransferLeader hands the Raft leadership to a voter.
	MethodTransferLeader = "Cluster.TransferLeader"
	MethodLeave          = "Agent.Leave"
	MethodHTTPSCert      = "Cluster.HTTPSCert"
)

// ServerMethods are the methods Client.Handle answers.
var ServerMethods = []string{MethodHasState, MethodState, MethodApply, MethodRemoveNode, MethodTransferLeader, MethodHTTPSCert}

// ApplyRequest is a command sent to the leader. Forwarded marks a request
// a server passed on, so it travels at most one hop.
type ApplyRequest struct {
	Type      MessageType     `json:"type"`
	Body      json.RawMessage `json:"body"`
	Forwarded bool            `json:"forwarded"`
	Key       string          `json:"key,omitempty"` // the operator's API key, for a write a client node relays
}

// NodeRequest names a node for the leader to act on: remove it
// (MethodRemoveNode) or hand it the leadership (MethodTransferLeader).
type NodeRequest struct {
	ID        string `json:"id"`
	Forwarded bool   `json:"forwarded"`
	Key       string `json:"key,omitempty"` // the operator's API key, when a client node relays it
}

// Peer is the node a call came from, as its certificate says.
type Peer struct {
	ID, Role string
	Name     string // the node name its certificate binds ("" for older certificates)
	Addr     string // the address the call came from (host:port), when known
}

// WriteTimeout bounds a write applied on the leader.
const WriteTimeout = 5 * time.Second

// Client reads and writes the cluster state through the leader: on the
// leader it uses the local Server, elsewhere it calls a server over the
// node's RPC (the leader for a follower, any live server for a client
// agent).
type Client struct {
	srv     *Server    // nil on client agents
	members Membership // the gossip view, where a client agent finds servers
	call    Caller
	log     *zap.Logger

	// KeyOf gives the API key of the operator a write is made for (the
	// API puts it in the request's context); it travels with the writes
	// this agent forwards, so that a server can check it.
	KeyOf func(ctx context.Context) string
	// CheckAdmin, on servers, accepts an admin API key: what a client node
	// needs to relay a write beyond its own reports.
	CheckAdmin func(key string) error
	// Certified, on a client agent, tells whether node id is a server as
	// the cluster certified it (its copy of the state); ServerAddr prefers
	// those.
	Certified func(id string) bool
	// CallNode reaches a node that may be a client (the leave request of
	// a removed node), by an address tagged with its ID
	// (internal/nodeaddr); nil uses the server caller.
	CallNode Caller
	// LeaderWait bounds how long Apply and RemoveNode wait for a leader
	// (DefaultLeaderWait if 0; < 0: they do not wait).
	LeaderWait time.Duration
}

func (c *Client) keyOf(ctx context.Context) string {
	if c.KeyOf == nil {
		return ""
	}
	return c.KeyOf(ctx)
}

// NewClient builds a client. srv is the local server or nil.
func NewClient(srv *Server, members Membership, call Caller, log *zap.Logger) *Client {
	return &Client{srv: srv, members: members, call: call, log: log}
}

// ServerAddr is where this agent sends cluster calls: the leader for a
// server that is not leading, any live server for a client.
func (c *Client) ServerAddr() (string, error) {
	if c.srv != nil {
		_, addr := c.srv.Leader()
		if addr == "" {
			return "", ErrNoLeader
		}
		return addr, nil
	}
	// Gossip says who is a server and where, but anyone with the gossip
	// key can list a member as a server: the address is tagged with the
	// member's ID, and the caller checks that the certificate there is
	// that node's, with role server. Servers the cluster certified (this
	// agent's copy of the state) come first, so a rogue entry cannot
	// stand in the way.
	var first string
	for _, m := range c.members.Members() {
		if m.Role != RoleServer || m.Status != StatusAlive || m.RPCAddr == "" {
			continue
		}
		addr := nodeaddr.Tag(m.ID, m.RPCAddr)
		if c.Certified == nil || c.Certified(m.ID) {
			return addr, nil
		}
		if first == "" {
			first = addr
		}
	}
	if first != "" {
		return first, nil
	}
	return "", errNoServer
}

// errNoServer is the answer of a client agent that knows no live server.
var errNoServer = &Error{Code: http.StatusServiceUnavailable, Msg: "no server known yet: is this agent joined?"}

// State reads the cluster state from the leader, as Consul's default
// consistency does, so a server that is still catching up never answers
// with an old view. Without a leader a server answers from its own copy
// once that copy is whole (ownState).
func (c *Client) State(ctx context.Context) (*State, error) {
	if c.srv != nil && c.srv.IsLeader() {
		return c.srv.FSM().State(), nil
	}
	addr, err := c.ServerAddr()
	if err != nil {
		if c.srv != nil {
			return c.ownState(ctx)
		}
		return nil, err
	}
	timeout := 5 * time.Second
	if c.srv != nil {
		timeout = time.Second // a dead leader must not stall reads
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var st State
	if err := c.call.Call(cctx, addr, MethodState, nil, &st); err != nil {
		if c.srv != nil {
			return c.ownState(ctx)
		}
		return nil, err
	}
	return &st, nil
}

// ErrCatchingUp answers a read on a server that restarted a moment ago
// and has heard from no leader since: its copy of the state may be far
// behind (empty, before a first snapshot), and a read from it would list
// the cluster as it was long ago.
var ErrCatchingUp = &Error{Code: http.StatusServiceUnavailable,
	Msg: "this server restarted a moment ago and has not caught up with the cluster (no leader has answered yet): try again shortly"}

// ownState is this server's copy for a read no leader answered, once the
// copy is whole (Server.CaughtUp). Before that it waits for a leader as
// LeaderState does, and fails with ErrCatchingUp when none answers.
func (c *Client) ownState(ctx context.Context) (*State, error) {
	if c.srv.CaughtUp() {
		return c.srv.FSM().State(), nil
	}
	if st, err := c.LeaderState(ctx); err == nil {
		return st, nil
	}
	if c.srv.CaughtUp() {
		return c.srv.FSM().State(), nil
	}
	return nil, ErrCatchingUp
}

// LeaderState reads the leader's state, waiting for a leader as writes do
// (LeaderWait). Unlike State it never answers from this server's own copy,
// which may lag far behind: a server just restarted holds its last
// snapshot until the leader contacts it. It fails when no leader answers.
func (c *Client) LeaderState(ctx context.Context) (*State, error) {
	var st *State
	err := c.holdForLeader(ctx, func() error {
		if c.srv != nil && c.srv.IsLeader() {
			st = c.srv.FSM().State()
			return nil
		}
		addr, err := c.ServerAddr()
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var s State
		if err := c.call.Call(cctx, addr, MethodState, nil, &s); err != nil {
			return err
		}
		st = &s
		return nil
	})
	return st, err
}

// DefaultLeaderWait is how long a write waits for a leader when the
// cluster has none (an election is under way), as Consul holds requests.
const DefaultLeaderWait = 7 * time.Second

// Apply applies a command on the leader. Without a leader, or when the
// server it went to could not be reached, it retries until a leader takes
// it, ctx ends or the client's LeaderWait passes.
func (c *Client) Apply(ctx context.Context, t MessageType, req any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	// Refused here, with the field and the bound, rather than by the
	// server this goes to.
	if err := ValidateCommand(t, b); err != nil {
		return err
	}
	r := ApplyRequest{Type: t, Body: b, Key: c.keyOf(ctx)}
	uncertain := false
	err = c.holdForLeader(ctx, func() error {
		err := c.applyRaw(ctx, r)
		if err != nil && strings.Contains(err.Error(), outcomeUnknown) {
			uncertain = true
		}
		return err
	})
	// A delete sent again after a try that may have been applied finds
	// nothing to delete: it was done (an unload answered "not loaded" after
	// a leader change under load).
	var hs interface{ HTTPStatus() int }
	if uncertain && t == ModelDeleteType && errors.As(err, &hs) && hs.HTTPStatus() == http.StatusNotFound {
		return nil
	}
	return err
}

// holdForLeader runs write until it succeeds, fails for another reason
// than a missing leader, ctx ends or LeaderWait passes.
func (c *Client) holdForLeader(ctx context.Context, write func() error) error {
	wait := c.LeaderWait
	if wait == 0 {
		wait = DefaultLeaderWait
	}
	deadline := time.Now().Add(wait)
	pause := 50 * time.Millisecond
	for {
		err := write()
		if err == nil || !LeaderMissing(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		if c.log != nil {
			c.log.Debug("no leader for a write yet; retrying", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// LeaderMissing reports whether err means that a write found no leader to
// take it: the cluster has none, the server it reached is no longer the
// leader, or the server could not be reached (the old leader is down)
// before it served the write. Such a write may be sent again.
func LeaderMissing(err error) bool {
	if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNoLeader) || errors.Is(err, errNoServer) {
		return true
	}
	var u interface{ Unreachable() bool }
	if errors.As(err, &u) && u.Unreachable() {
		return true
	}
	var hs interface{ HTTPStatus() int }
	return errors.As(err, &hs) && hs.HTTPStatus() == http.StatusServiceUnavailable &&
		(strings.Contains(err.Error(), ErrNotLeader.Msg) || strings.Contains(err.Error(), ErrNoLeader.Msg))
}

// applyRaw applies on the leader, forwarding at most one hop. A command
// that fails ValidateCommand is refused before it goes anywhere.
func (c *Client) applyRaw(ctx context.Context, req ApplyRequest) error {
	if err := ValidateCommand(req.Type, req.Body); err != nil {
		return err
	}
	if c.srv != nil && c.srv.IsLeader() {
		return c.srv.Apply(req.Type, req.Body, WriteTimeout)
	}
	addr, err := c.forwardTo(req.Forwarded)
	if err != nil {
		return err
	}
	req.Forwarded = c.srv != nil
	return c.call.Call(ctx, addr, MethodApply, req, nil)
}

// forwardTo is the server a request goes to from here, refusing a second
// hop.
func (c *Client) forwardTo(forwarded bool) (string, error) {
	if forwarded && c.srv != nil {
		return "", ErrNotLeader
	}
	return c.ServerAddr()
}

// RemoveNode removes a node from Raft and the state on the leader, which
// then asks the node to leave.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	r := NodeRequest{ID: id, Key: c.keyOf(ctx)}
	return c.holdForLeader(ctx, func() error { return c.removeNode(ctx, r) })
}

func (c *Client) removeNode(ctx context.Context, req NodeRequest) error {
	if c.srv != nil && c.srv.IsLeader() {
		// The steps are ordered so that a try cut short (the leader lost
		// its term, the answer lost) is finished by the next: the node
		// stays in the state until its certificate is revoked, so a
		// second try finds it and revokes it; once it is gone and
		// revoked, a try answers that it is done.
		if err := c.srv.ForgetNode(req.ID); err != nil {
			revoked := false
			c.srv.FSM().View(func(st *State) { _, revoked = st.RevokedNodes[req.ID] })
			var e *Error
			if errors.As(err, &e) && e.Code == http.StatusNotFound && revoked {
				return nil
			}
			return err
		}
		var target string
		c.srv.FSM().View(func(st *State) {
			if n := st.Nodes[req.ID]; n != nil {
				target = n.RPCAddr
			}
		})
		if target != "" {
			call := c.CallNode
			if call == nil {
				call = c.call
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := call.Call(cctx, nodeaddr.Tag(req.ID, target), MethodLeave, nil, nil); err != nil {
				c.log.Info("removed node did not answer the leave request", zap.String("id", req.ID), zap.Error(err))
			}
			cancel()
		}
		// Revoked after the leave request, which travels on a connection
		// the revocation closes.
		if err := c.srv.Apply(NodeRevokeType, NodeRevokeRequest{ID: req.ID, Now: time.Now().UTC()}, 5*time.Second); err != nil {
			if LeaderMissing(err) {
				return err // the next leader's try revokes it
			}
			return fmt.Errorf("node %s left, but revoking its certificate failed (run 'shoal node rm' again): %w", req.ID, err)
		}
		if err := c.srv.DeregisterNode(req.ID); err != nil {
			if LeaderMissing(err) {
				return err
			}
			return fmt.Errorf("node %s left and its certificate is revoked, but deleting it from the state failed (run 'shoal node rm' again): %w", req.ID, err)
		}
		c.log.Info("removed node; its certificate is revoked", zap.String("id", req.ID))
		return nil
	}
	addr, err := c.forwardTo(req.Forwarded)
	if err != nil {
		return err
	}
	req.Forwarded = c.srv != nil
	return c.call.Call(ctx, addr, MethodRemoveNode, req, nil)
}

// TransferLeader makes server id the Raft leader: the leader hands its
// leadership to it (an operator's way to move the coordinator before
// stopping or removing the leader's machine, instead of an election).
func (c *Client) TransferLeader(ctx context.Context, id string) error {
	r := NodeRequest{ID: id, Key: c.keyOf(ctx)}
	return c.holdForLeader(ctx, func() error { return c.transferLeader(ctx, r) })
}

func (c *Client) transferLeader(ctx context.Context, req NodeRequest) error {
	if c.srv != nil && c.srv.IsLeader() {
		return c.srv.TransferLeadership(req.ID)
	}
	addr, err := c.forwardTo(req.Forwarded)
	if err != nil {
		return err
	}
	req.Forwarded = c.srv != nil
	return c.call.Call(ctx, addr, MethodTransferLeader, req, nil)
}

// Handle answers a server's side of ServerMethods for a peer's Client. A
// client node (peer role client) reads the state without token hashes or
// the HTTPS CA key and writes only its own reports unless it relays an
// operator's admin key. Any server signs a node's HTTPS certificate, for
// the names the cluster knows that node by.
func (c *Client) Handle(ctx context.Context, peer Peer, method string, body json.RawMessage) (any, error) {
	if c.srv == nil {
		return nil, &Error{Code: http.StatusBadRequest, Msg: "this agent is not a server"}
	}
	client := peer.Role != RoleServer
	switch method {
	case MethodHasState:
		return c.srv.HasState(), nil
	case MethodState:
		if client {
			return c.srv.FSM().State().Redacted(), nil
		}
		return c.srv.FSM().State(), nil
	case MethodApply:
		var req ApplyRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, &Error{Code: http.StatusBadRequest, Msg: "malformed apply request"}
		}
		if err := admitApply(peer, req, c.srv.FSM().State, c.admin); err != nil {
			return nil, err
		}
		return nil, c.applyRaw(ctx, req)
	case MethodRemoveNode:
		var req NodeRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, &Error{Code: http.StatusBadRequest, Msg: "malformed remove request"}
		}
		if client && !c.admin(req.Key) {
			return nil, &Error{Code: http.StatusForbidden, Msg: "removing a node needs an admin key"}
		}
		return nil, c.removeNode(ctx, req)
	case MethodTransferLeader:
		var req NodeRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, &Error{Code: http.StatusBadRequest, Msg: "malformed leadership transfer request"}
		}
		if client && !c.admin(req.Key) {
			return nil, &Error{Code: http.StatusForbidden, Msg: "moving the leadership needs an admin key"}
		}
		return nil, c.transferLeader(ctx, req)
	case MethodHTTPSCert:
		req, err := decodeHTTPSCertRequest(body)
		if err != nil {
			return nil, err
		}
		return c.issueHTTPS(peer, req)
	}
	return nil, &Error{Code: http.StatusNotFound, Msg: "unknown cluster method " + method}
}

// admitApply is Handle's check of a write from peer, before anything is
// proposed: the FSM's own checks (ValidateCommand: an unknown type or a
// command out of bounds never reaches the log), then, for a client node,
// that it is the node's own report (ownReport, against the state) or
// comes with an admin key.
func admitApply(peer Peer, req ApplyRequest, state func() *State, admin func(key string) bool) error {
	if err := ValidateCommand(req.Type, req.Body); err != nil {
		return err
	}
	if peer.Role != RoleServer && !ownReport(peer, req, state()) && !admin(req.Key) {
		return &Error{Code: http.StatusForbidden, Msg: "a client node may write only its own shard, link, model-file and file-copy reports: this change needs an admin key"}
	}
	return nil
}

// admin reports whether key is an admin API key.
func (c *Client) admin(key string) bool {
	return key != "" && c.CheckAdmin != nil && c.CheckAdmin(key) == nil
}

// ownReport reports whether req is one a node makes about itself: its
// shards' status, its links, its copy of a model file, a model file it holds (under a name no other
// node's model has, and planned on no node but itself if pinned).
func ownReport(peer Peer, req ApplyRequest, st *State) bool {
	switch req.Type &^ IgnoreUnknownTypeFlag {
	case ShardStatusType:
		var r ShardStatusRequest
		return json.Unmarshal(req.Body, &r) == nil && r.Shard.Node == peer.ID
	case ModelHolderType:
		var r ModelHolderRequest
		return json.Unmarshal(req.Body, &r) == nil && r.Holder.Node == peer.ID
	case LinkReportType:
		var r LinkReportRequest
		if json.Unmarshal(req.Body, &r) != nil {
			return false
		}
		for _, l := range r.Links {
			if l.From != peer.ID {
				return false
			}
		}
		return true
	case ModelUpsertType:
		var r ModelUpsertRequest
		if json.Unmarshal(req.Body, &r) != nil || r.Model.SourceNode != peer.ID {
			return false
		}
		if old := st.Models[r.Model.Name]; old != nil && old.SourceNode != peer.ID {
			return false
		}
		for _, n := range r.Model.Pin {
			if n != peer.ID {
				return false
			}
		}
		return true
	}
	return false
}
