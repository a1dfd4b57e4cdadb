package node

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"time"

	"shoal/api"
	"shoal/catalog"
	"shoal/coordinator"
	"shoal/internal/nodeaddr"
	"shoal/transport"
)

// admin implements api.Backend: it reads and writes the cluster state
// through the coordinator client and answers in the API's wire types.
type admin struct {
	id, name, role string
	cluster        *coordinator.Client
	srv            *coordinator.Server         // nil on client agents
	call           coordinator.Caller          // to servers
	members        func() []coordinator.Member // this agent's gossip view
	self           func() api.Member           // this agent as a gossip member
	caHash         string                      // the cluster CA's hash, carried by join tokens
	// bootstrapSecret is the servers' shared secret, an API key until
	// operators create admin keys.
	bootstrapSecret string
	runner          api.ClusterRunner
	// cat answers for the models: load, list, unload.
	cat *catalog.Catalog
}

// newAdmin wires the admin API's backend.
func (a *Agent) newAdmin() *admin {
	return &admin{
		id: a.id, name: a.cfg.Name, role: a.role,
		cluster: a.cluster, srv: a.srv, call: serverCaller(a.ep), members: a.gossip.Members,
		self: func() api.Member {
			return api.Member{ID: a.id, Name: a.cfg.Name, Addr: a.GossipAddr(), RPCAddr: a.RPCAddr(), Role: a.role,
				Status: api.StatusAlive, Version: a.cfg.Version, Caps: apiCaps(a.caps)}
		},
		caHash: strings.TrimPrefix(transport.CAHash(a.ident.CA.Cert), "sha256:"), bootstrapSecret: a.bootstrapSecret,
		cat: a.catalog,
	}
}

// rpcCaller is coordinator.Caller over the agent's QUIC endpoint. role,
// when set, is the role the callee's certificate must have: calls to
// servers carry API keys, join tokens and writes, so they never reach a
// client node that gossip lists as a server. An address tagged with a
// node ID (internal/nodeaddr) reaches only that node.
type rpcCaller struct {
	ep   *transport.Endpoint
	role string
}

// serverCaller calls servers only; nodeCaller any node.
func serverCaller(ep *transport.Endpoint) rpcCaller { return rpcCaller{ep, coordinator.RoleServer} }
func nodeCaller(ep *transport.Endpoint) rpcCaller   { return rpcCaller{ep, ""} }

func (c rpcCaller) Call(ctx context.Context, addr, method string, in, out any) error {
	id, hostport := nodeaddr.Split(addr)
	return transport.CallAs(ctx, c.ep, hostport, transport.KindRPC, id, c.role, method, in, out)
}

func forbidden(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusForbidden, Msg: fmt.Sprintf(format, args...)}
}

// scopeKinds lists the key kinds that have each scope.
var scopeKinds = map[api.Scope][]string{
	api.ScopeAdmin:     {coordinator.TokenAdmin, coordinator.TokenBootstrap},
	api.ScopeRead:      {coordinator.TokenAdmin, coordinator.TokenRead, coordinator.TokenBootstrap},
	api.ScopeInference: {coordinator.TokenAdmin, coordinator.TokenInference, coordinator.TokenBootstrap},
}

// Authorize checks that key has scope: an admin key has every scope, a
// read or inference key its own; the bootstrap secret acts as an admin key
// until operators create one.
func (b *admin) Authorize(ctx context.Context, key string, scope api.Scope) error {
	_, err := b.grant(ctx, key, scope)
	return err
}

// InferenceKey checks a key of the OpenAI endpoint and returns the models
// it is limited to (none: every model). A read key may list the models
// (list: the dashboard shows them).
func (b *admin) InferenceKey(ctx context.Context, key string, list bool) ([]string, error) {
	tok, err := b.grant(ctx, key, api.ScopeInference)
	if err != nil && list {
		return nil, b.ReadKey(ctx, key)
	}
	if err != nil || tok == nil {
		return nil, err
	}
	return tok.Models, nil
}

// ReadKey checks a key of the dashboard.
func (b *admin) ReadKey(ctx context.Context, key string) error {
	return b.Authorize(ctx, key, api.ScopeRead)
}

// grant finds key's token and checks it has scope; the token is nil for
// the local bootstrap secret before the cluster stored it.
func (b *admin) grant(ctx context.Context, key string, scope api.Scope) (*coordinator.Token, error) {
	if fr, ok := ctx.Value(forwardedKey{}).(forwardedReq); ok {
		// The agent that passed the request on checked the user's key
		// and kept it; the peer's certificate is the credential here,
		// for the one model and the routes peers may forward.
		if key != forwardGrant || scope == api.ScopeRead {
			return nil, forbidden("a forwarded request carries no API key")
		}
		return &coordinator.Token{Kind: coordinator.TokenInference, Models: []string{fr.model}}, nil
	}
	if b.srv == nil {
		return b.grantRemote(ctx, key, scope)
	}
	tok, err := b.authorize(ctx, key, scopeKinds[scope], false)
	if err != nil && b.srv != nil && !b.srv.IsLeader() {
		// A follower may not have applied a key created a moment ago:
		// check once more against the leader's state.
		return b.authorize(ctx, key, scopeKinds[scope], true)
	}
	return tok, err
}

// grantRemote asks a server about key: a client agent sees no token
// hashes. Before it knows a server, it accepts only its own bootstrap
// secret.
func (b *admin) grantRemote(ctx context.Context, key string, scope api.Scope) (*coordinator.Token, error) {
	addr, err := b.cluster.ServerAddr()
	if err != nil {
		if b.bootstrapSecret != "" && subtle.ConstantTimeCompare([]byte(key), []byte(b.bootstrapSecret)) == 1 {
			return nil, nil
		}
		return nil, err
	}
	var g keyGrant
	if err := b.call.Call(ctx, addr, methodCheckKey, checkKeyRequest{Key: key, Scope: scope}, &g); err != nil {
		return nil, err
	}
	if g.Kind == "" {
		return nil, nil // the server's own bootstrap secret before it was stored
	}
	return &coordinator.Token{Kind: g.Kind, Models: g.Models}, nil
}

func (b *admin) authorize(ctx context.Context, key string, kinds []string, viaLeader bool) (*coordinator.Token, error) {
	var st *coordinator.State
	var err error
	switch {
	case b.srv != nil && !viaLeader:
		st = b.srv.FSM().State() // servers check locally, so a dead leader cannot lock operators out
	case b.srv != nil:
		// The key is not in this server's copy, which may lag (a server
		// just restarted holds its last snapshot until the leader
		// contacts it): only the leader's state can say no.
		if st, err = b.cluster.LeaderState(ctx); err != nil {
			return nil, &coordinator.Error{Code: http.StatusServiceUnavailable,
				Msg: fmt.Sprintf("this server does not know the key and no leader answered to confirm it (an election may be under way; retry): %v", err)}
		}
	default:
		if st, err = b.cluster.State(ctx); err != nil {
			st = coordinator.NewState() // still allow the local bootstrap secret below
		}
	}
	now := time.Now()
	tok, err := checkToken(st, key, now, kinds...)
	if err == nil {
		if tok.Kind == coordinator.TokenBootstrap && adminKeysExist(st, now) {
			return nil, forbidden("the bootstrap secret is no longer an API key once admin keys exist: use an admin key")
		}
		return tok, nil
	}
	// Before the cluster has stored the bootstrap token, the agent that
	// was given the secret accepts it itself.
	if b.bootstrapSecret != "" && st.Tokens[coordinator.TokenBootstrap] == nil && !adminKeysExist(st, now) &&
		subtle.ConstantTimeCompare([]byte(key), []byte(b.bootstrapSecret)) == 1 {
		return nil, nil
	}
	if strings.Contains(err.Error(), "invalid token") {
		return nil, forbidden("invalid API key")
	}
	return nil, err
}

// Status answers from the local server, or asks a server on a client agent.
func (b *admin) Status(ctx context.Context) (*api.Status, error) {
	if b.srv == nil {
		addr, err := b.cluster.ServerAddr()
		if err != nil {
			return nil, err
		}
		var s api.Status
		if err := b.call.Call(ctx, addr, methodStatus, nil, &s); err != nil {
			return nil, err
		}
		s.Node, s.NodeName, s.Role = b.id, b.name, b.role
		return &s, nil
	}
	st := b.srv.FSM().State()
	s := &api.Status{Node: b.id, NodeName: b.name, Role: b.role, Index: st.Index, Nodes: len(st.Nodes)}
	for _, n := range st.Nodes {
		if n.Status == coordinator.StatusAlive {
			s.NodesAlive++
		}
	}
	s.Leader, s.LeaderAddr = b.srv.Leader()
	if n := st.Nodes[s.Leader]; n != nil {
		s.LeaderName = n.Name
	}
	servers, err := b.srv.Servers()
	if err != nil {
		return nil, err
	}
	gossipStatus := map[string]string{b.id: api.StatusAlive}
	for _, m := range b.members() {
		if m.ID != b.id {
			gossipStatus[m.ID] = string(m.Status)
		}
	}
	voters, healthy := 0, 0
	for _, srv := range servers {
		ss := api.ServerStatus{ID: srv.ID, Address: srv.Address, Voter: srv.Voter, Leader: srv.Leader, Status: gossipStatus[srv.ID]}
		if n := st.Nodes[srv.ID]; n != nil {
			ss.Name = n.Name
		}
		if ss.Status == "" {
			ss.Status = api.StatusFailed
		}
		if srv.Voter {
			voters++
			if ss.Status == api.StatusAlive {
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

// Nodes lists the nodes of the cluster state.
func (b *admin) Nodes(ctx context.Context) ([]*api.Node, error) {
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	return apiNodes(st.SortedNodes()), nil
}

func (b *admin) resolveNode(ctx context.Context, ref string) (*api.Node, error) {
	nodes, err := b.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	return api.FindNode(nodes, ref)
}

// Drain marks a node draining (or lifts the mark).
func (b *admin) Drain(ctx context.Context, ref string, drain bool) error {
	n, err := b.resolveNode(ctx, ref)
	if err != nil {
		return err
	}
	return b.cluster.Apply(ctx, coordinator.NodeDrainType, coordinator.NodeDrainRequest{ID: n.ID, Drain: drain})
}

// RemoveNode removes a node, by reference or, when the state no longer
// has it, by its exact ID.
func (b *admin) RemoveNode(ctx context.Context, ref string) error {
	id := ref
	if n, err := b.resolveNode(ctx, ref); err == nil {
		id = n.ID
	} else if transport.StatusOf(err) != http.StatusNotFound {
		return err
	}
	return b.cluster.RemoveNode(ctx, id)
}

// Members is this agent's own gossip view.
func (b *admin) Members(ctx context.Context) ([]api.Member, error) {
	var out []api.Member
	found := false
	for _, m := range b.members() {
		out = append(out, api.Member{ID: m.ID, Name: m.Name, Addr: m.Addr, RPCAddr: m.RPCAddr, Role: m.Role,
			Status: string(m.Status), Version: m.Version, Caps: apiCaps(m.Caps)})
		found = found || m.ID == b.id
	}
	if !found {
		out = append(out, b.self())
	}
	return out, nil
}

// CreateToken stores a new token's hash; the secret is returned once.
func (b *admin) CreateToken(ctx context.Context, req api.TokenRequest, ttl time.Duration) (*api.NewToken, error) {
	id, secret := randomString(6), randomString(16)
	now := time.Now().UTC()
	kind := req.Kind
	tok := coordinator.Token{ID: id, Kind: kind, Models: req.Models, Role: req.Role, SecretHash: hashSecret(secret),
		Description: req.Description, CreatedAt: now}
	if ttl > 0 {
		exp := now.Add(ttl)
		tok.ExpiresAt = &exp
	}
	if err := b.cluster.Apply(ctx, coordinator.TokenCreateType, coordinator.TokenCreateRequest{Token: tok}); err != nil {
		return nil, err
	}
	return &api.NewToken{Token: apiToken(&tok), Secret: b.fullToken(&tok, secret)}, nil
}

// fullToken is the string a user presents: "<id>.<secret>", and for join
// tokens the CA hash after it.
func (b *admin) fullToken(t *coordinator.Token, secret string) string {
	full := t.ID + "." + secret
	if t.Kind == coordinator.TokenJoin {
		full += "." + b.caHash
	}
	return full
}

// RotateToken gives a token a new secret: the old one stops working at
// once, everything else about the token stays.
func (b *admin) RotateToken(ctx context.Context, id string) (*api.NewToken, error) {
	secret := randomString(16)
	now := time.Now().UTC()
	if err := b.cluster.Apply(ctx, coordinator.TokenRotateType, coordinator.TokenRotateRequest{ID: id, SecretHash: hashSecret(secret), Now: now}); err != nil {
		return nil, err
	}
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	t := st.Tokens[id]
	if t == nil {
		return nil, fmt.Errorf("token %s vanished after its rotation", id)
	}
	return &api.NewToken{Token: apiToken(t), Secret: b.fullToken(t, secret)}, nil
}

// Tokens lists the tokens (hashes only).
func (b *admin) Tokens(ctx context.Context) ([]*api.Token, error) {
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	return apiTokens(st.SortedTokens()), nil
}

// RevokeToken revokes a token by ID.
func (b *admin) RevokeToken(ctx context.Context, id string) error {
	return b.cluster.Apply(ctx, coordinator.TokenRevokeType, coordinator.TokenRevokeRequest{ID: id, Now: time.Now().UTC()})
}

// ClusterLogits runs on the model's driver (api.ClusterRunner).
func (b *admin) ClusterLogits(ctx context.Context, model string, tokens []int32) (*api.Logits, error) {
	return b.runner.ClusterLogits(ctx, model, tokens)
}

// ClusterBench runs on the model's driver (api.ClusterRunner).
func (b *admin) ClusterBench(ctx context.Context, model string, req api.BenchRequest) (*api.BenchResult, error) {
	return b.runner.ClusterBench(ctx, model, req)
}
