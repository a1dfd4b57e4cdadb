package node

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/transport"
)

const writeTimeout = 5 * time.Second

type applyRequest struct {
	Type      coordinator.MessageType `json:"type"`
	Body      json.RawMessage         `json:"body"`
	Forwarded bool                    `json:"forwarded"`
}

type removeRequest struct {
	ID        string `json:"id"`
	Forwarded bool   `json:"forwarded"`
}

func forbidden(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusForbidden, Msg: fmt.Sprintf(format, args...)}
}

func (a *Agent) registerRPC() {
	server := func(h transport.RPCHandler) transport.RPCHandler {
		return func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
			if a.srv == nil {
				return nil, &coordinator.Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf("agent %s is not a server", a.cfg.Name)}
			}
			return h(ctx, p, body)
		}
	}
	a.rpc.Register("Cluster.Seeds", func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		return a.aliveGossipAddrs(), nil
	})
	a.rpc.Register("Cluster.HasState", server(func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		return a.srv.HasState(), nil
	}))
	a.rpc.Register("Cluster.State", server(func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		return a.srv.FSM().State(), nil
	}))
	a.rpc.Register("Cluster.Status", server(func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		return a.Status(ctx)
	}))
	a.rpc.Register("Cluster.Apply", server(func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		var req applyRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return nil, a.applyRaw(ctx, req)
	}))
	a.rpc.Register("Cluster.RemoveNode", server(func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		var req removeRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return nil, a.removeNode(ctx, req)
	}))
	a.rpc.Register("Cluster.Join", server(func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		var req joinRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return a.handleJoin(ctx, &req, true), nil
	}))
	a.rpc.Register("Agent.Leave", func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		if p.Role != transport.RoleServer {
			return nil, forbidden("only servers may ask a node to leave")
		}
		a.log.Warn("removed from the cluster by an operator; leaving", zap.String("by", p.ID))
		go a.close(true)
		return nil, nil
	})
}

// serverRPCAddr is where this agent sends cluster calls: the leader for a
// server that is not leading, any live server for a client.
func (a *Agent) serverRPCAddr() (string, error) {
	if a.srv != nil {
		_, addr := a.srv.Leader()
		if addr == "" {
			return "", coordinator.ErrNoLeader
		}
		return addr, nil
	}
	for _, m := range a.gossip.Members() {
		if m.Role == coordinator.RoleServer && m.Status == coordinator.StatusAlive && m.RPCAddr != "" {
			return m.RPCAddr, nil
		}
	}
	return "", &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: "no server known yet: is this agent joined?"}
}

// state reads the cluster state from the leader, as Consul's default
// consistency does, so a server that is still catching up never answers
// with an old view. Without a leader a server answers from its own copy.
func (a *Agent) state(ctx context.Context) (*coordinator.State, error) {
	if a.srv != nil && a.srv.IsLeader() {
		return a.srv.FSM().State(), nil
	}
	addr, err := a.serverRPCAddr()
	if err != nil {
		if a.srv != nil {
			return a.srv.FSM().State(), nil
		}
		return nil, err
	}
	timeout := 5 * time.Second
	if a.srv != nil {
		timeout = time.Second // a dead leader must not stall reads
	}
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var st coordinator.State
	if err := transport.Call(c, a.ep, addr, transport.KindRPC, "Cluster.State", nil, &st); err != nil {
		if a.srv != nil {
			return a.srv.FSM().State(), nil
		}
		return nil, err
	}
	return &st, nil
}

func (a *Agent) apply(ctx context.Context, t coordinator.MessageType, req any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return a.applyRaw(ctx, applyRequest{Type: t, Body: b})
}

// applyRaw applies on the leader, forwarding at most one hop.
func (a *Agent) applyRaw(ctx context.Context, req applyRequest) error {
	if a.srv != nil && a.srv.IsLeader() {
		return a.srv.Apply(req.Type, req.Body, writeTimeout)
	}
	if req.Forwarded && a.srv != nil {
		return coordinator.ErrNotLeader
	}
	addr, err := a.serverRPCAddr()
	if err != nil {
		return err
	}
	req.Forwarded = a.srv != nil
	return transport.Call(ctx, a.ep, addr, transport.KindRPC, "Cluster.Apply", req, nil)
}

func (a *Agent) removeNode(ctx context.Context, req removeRequest) error {
	if a.srv != nil && a.srv.IsLeader() {
		var target string
		a.srv.FSM().View(func(st *coordinator.State) {
			if n := st.Nodes[req.ID]; n != nil {
				target = n.RPCAddr
			}
		})
		if err := a.srv.RemoveNode(req.ID); err != nil {
			return err
		}
		if target != "" {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := transport.Call(c, a.ep, target, transport.KindRPC, "Agent.Leave", nil, nil); err != nil {
				a.log.Info("removed node did not answer the leave request", zap.String("id", req.ID), zap.Error(err))
			}
			cancel()
		}
		a.log.Info("removed node", zap.String("id", req.ID))
		return nil
	}
	if req.Forwarded && a.srv != nil {
		return coordinator.ErrNotLeader
	}
	addr, err := a.serverRPCAddr()
	if err != nil {
		return err
	}
	req.Forwarded = a.srv != nil
	return transport.Call(ctx, a.ep, addr, transport.KindRPC, "Cluster.RemoveNode", req, nil)
}

// Authorize implements api.Backend: an admin key, or the bootstrap secret
// until operators create admin keys.
func (a *Agent) Authorize(ctx context.Context, key string) error {
	err := a.authorize(ctx, key, false)
	if err != nil && a.srv != nil && !a.srv.IsLeader() {
		// A follower may not have applied a key created a moment ago:
		// check once more against the leader's state.
		return a.authorize(ctx, key, true)
	}
	return err
}

func (a *Agent) authorize(ctx context.Context, key string, viaLeader bool) error {
	var st *coordinator.State
	var err error
	if a.srv != nil && !viaLeader {
		st = a.srv.FSM().State() // servers check locally, so a dead leader cannot lock operators out
	} else if st, err = a.state(ctx); err != nil {
		st = coordinator.NewState() // still allow the local bootstrap secret below
	}
	now := time.Now()
	tok, err := checkToken(st, key, now, coordinator.TokenAdmin, coordinator.TokenBootstrap)
	if err == nil {
		if tok.Kind == coordinator.TokenBootstrap && adminKeysExist(st, now) {
			return forbidden("the bootstrap secret is no longer an API key once admin keys exist: use an admin key")
		}
		return nil
	}
	// Before the cluster has stored the bootstrap token, the agent that
	// was given the secret accepts it itself.
	if a.bootstrapSecret != "" && st.Tokens[coordinator.TokenBootstrap] == nil && !adminKeysExist(st, now) &&
		subtle.ConstantTimeCompare([]byte(key), []byte(a.bootstrapSecret)) == 1 {
		return nil
	}
	if strings.Contains(err.Error(), "invalid token") {
		return forbidden("invalid API key")
	}
	return err
}

// Status implements api.Backend.
func (a *Agent) Status(ctx context.Context) (*api.Status, error) {
	if a.srv == nil {
		addr, err := a.serverRPCAddr()
		if err != nil {
			return nil, err
		}
		var s api.Status
		if err := transport.Call(ctx, a.ep, addr, transport.KindRPC, "Cluster.Status", nil, &s); err != nil {
			return nil, err
		}
		s.Node, s.NodeName, s.Role = a.id, a.cfg.Name, a.role
		return &s, nil
	}
	st := a.srv.FSM().State()
	s := &api.Status{Node: a.id, NodeName: a.cfg.Name, Role: a.role, Index: st.Index, Nodes: len(st.Nodes)}
	for _, n := range st.Nodes {
		if n.Status == coordinator.StatusAlive {
			s.NodesAlive++
		}
	}
	s.Leader, s.LeaderAddr = a.srv.Leader()
	if n := st.Nodes[s.Leader]; n != nil {
		s.LeaderName = n.Name
	}
	servers, err := a.srv.Servers()
	if err != nil {
		return nil, err
	}
	gossipStatus := map[string]coordinator.NodeStatus{}
	for _, m := range a.gossip.Members() {
		gossipStatus[m.ID] = m.Status
	}
	gossipStatus[a.id] = coordinator.StatusAlive
	voters, healthy := 0, 0
	for _, srv := range servers {
		ss := api.ServerStatus{ID: srv.ID, Address: srv.Address, Voter: srv.Voter, Leader: srv.Leader, Status: gossipStatus[srv.ID]}
		if n := st.Nodes[srv.ID]; n != nil {
			ss.Name = n.Name
		}
		if ss.Status == "" {
			ss.Status = coordinator.StatusFailed
		}
		if srv.Voter {
			voters++
			if ss.Status == coordinator.StatusAlive {
				healthy++
			}
		}
		s.Servers = append(s.Servers, ss)
	}
	switch {
	case s.Leader == "":
		s.Health = "no-leader"
	case healthy < voters:
		s.Health = "degraded"
	default:
		s.Health = "healthy"
	}
	if q := voters/2 + 1; healthy > q {
		s.FailureTolerance = healthy - q
	}
	return s, nil
}

// Nodes implements api.Backend.
func (a *Agent) Nodes(ctx context.Context) ([]*coordinator.Node, error) {
	st, err := a.state(ctx)
	if err != nil {
		return nil, err
	}
	return st.SortedNodes(), nil
}

func (a *Agent) resolveNode(ctx context.Context, ref string) (*coordinator.Node, error) {
	nodes, err := a.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	return api.FindNode(nodes, ref)
}

// Drain implements api.Backend.
func (a *Agent) Drain(ctx context.Context, ref string, drain bool) error {
	n, err := a.resolveNode(ctx, ref)
	if err != nil {
		return err
	}
	return a.apply(ctx, coordinator.NodeDrainType, coordinator.NodeDrainRequest{ID: n.ID, Drain: drain})
}

// RemoveNode implements api.Backend.
func (a *Agent) RemoveNode(ctx context.Context, ref string) error {
	id := ref
	if n, err := a.resolveNode(ctx, ref); err == nil {
		id = n.ID
	} else if transport.StatusOf(err) != http.StatusNotFound {
		return err
	}
	return a.removeNode(ctx, removeRequest{ID: id})
}

// Members implements api.Backend: this agent's own gossip view.
func (a *Agent) Members(ctx context.Context) ([]api.Member, error) {
	var out []api.Member
	for _, m := range a.gossip.Members() {
		out = append(out, api.Member{ID: m.ID, Name: m.Name, Addr: m.Addr, RPCAddr: m.RPCAddr, Role: m.Role, Status: m.Status, Version: m.Version, Caps: m.Caps})
	}
	if len(out) == 0 || !containsMember(out, a.id) {
		out = append(out, api.Member{ID: a.id, Name: a.cfg.Name, Addr: a.GossipAddr(), RPCAddr: a.RPCAddr(), Role: a.role, Status: coordinator.StatusAlive, Version: a.cfg.Version, Caps: a.caps})
	}
	return out, nil
}

func containsMember(ms []api.Member, id string) bool {
	for _, m := range ms {
		if m.ID == id {
			return true
		}
	}
	return false
}

// CreateToken implements api.Backend.
func (a *Agent) CreateToken(ctx context.Context, kind, desc string, ttl time.Duration) (*api.NewToken, error) {
	id, secret := randomString(6), randomString(16)
	now := time.Now().UTC()
	tok := coordinator.Token{ID: id, Kind: kind, SecretHash: hashSecret(secret), Description: desc, CreatedAt: now}
	if ttl > 0 {
		exp := now.Add(ttl)
		tok.ExpiresAt = &exp
	}
	if err := a.apply(ctx, coordinator.TokenCreateType, coordinator.TokenCreateRequest{Token: tok}); err != nil {
		return nil, err
	}
	full := id + "." + secret
	if kind == coordinator.TokenJoin {
		full += "." + strings.TrimPrefix(transport.CAHash(a.ident.CA.Cert), "sha256:")
	}
	return &api.NewToken{Token: tok, Secret: full}, nil
}

// Tokens implements api.Backend.
func (a *Agent) Tokens(ctx context.Context) ([]*coordinator.Token, error) {
	st, err := a.state(ctx)
	if err != nil {
		return nil, err
	}
	return st.SortedTokens(), nil
}

// RevokeToken implements api.Backend.
func (a *Agent) RevokeToken(ctx context.Context, id string) error {
	return a.apply(ctx, coordinator.TokenRevokeType, coordinator.TokenRevokeRequest{ID: id, Now: time.Now().UTC()})
}
