package node

import (
	"context"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/node/identity"
	"shoal/transport"
)

// The agent's view of the cluster state: seeding it as a new leader, and
// reading it (a server's FSM, or a client's last copy) for certified
// servers and revoked nodes.

// onLeader creates the cluster's HTTPS CA the first time, and seeds the
// state with the bootstrap secret's hash, so every server can check it as
// a join token and API key.
func (a *Agent) onLeader() {
	identity.EnsureHTTPSCA(a.srv, a.log)
	if a.bootstrapSecret == "" {
		return
	}
	var have bool
	a.srv.FSM().View(func(st *coordinator.State) { _, have = st.Tokens[coordinator.TokenBootstrap] })
	if have {
		return
	}
	tok := coordinator.Token{
		ID: coordinator.TokenBootstrap, Kind: coordinator.TokenBootstrap, SecretHash: hashSecret(a.bootstrapSecret),
		Description: "shared by the bootstrap servers", CreatedAt: time.Now().UTC(),
	}
	if err := a.srv.Apply(coordinator.TokenCreateType, coordinator.TokenCreateRequest{Token: tok}, 5*time.Second); err != nil {
		a.log.Warn("storing the bootstrap token", zap.Error(err))
	}
}

func (a *Agent) peerHasState(ctx context.Context, m coordinator.Member) (bool, error) {
	var has bool
	err := transport.Call(ctx, a.ep, m.RPCAddr, transport.KindRPC, coordinator.MethodHasState, nil, &has)
	return has, err
}

// certifiedServer tells whether node id is a server in this agent's copy
// of the state (registered from its certificate by the leader).
func (a *Agent) certifiedServer(id string) bool {
	var ok bool
	a.viewState(func(st *coordinator.State) {
		n := st.Nodes[id]
		ok = n != nil && n.Role == coordinator.RoleServer
	})
	return ok
}

// viewState calls fn with this agent's view of the state, if it has one:
// a server's FSM, or the copy a client's serving loop read last. fn must
// not keep or modify it.
func (a *Agent) viewState(fn func(st *coordinator.State)) {
	if f := a.fsm.Load(); f != nil {
		f.View(fn)
	} else if st := a.lastState.Load(); st != nil {
		fn(st)
	}
}

// isRevoked tells whether node id was removed from the cluster: servers
// read their state, clients the copy the serving loop keeps.
func (a *Agent) isRevoked(id string) bool {
	if f := a.fsm.Load(); f != nil {
		var gone bool
		f.View(func(st *coordinator.State) { _, gone = st.RevokedNodes[id] })
		return gone
	}
	m := a.revoked.Load()
	return m != nil && (*m)[id]
}

// noteRevoked takes the revocation list from st and closes the
// connections of nodes revoked since the last call.
func (a *Agent) noteRevoked(st *coordinator.State) {
	old := a.revoked.Load()
	if old != nil && len(*old) == len(st.RevokedNodes) {
		return
	}
	m := make(map[string]bool, len(st.RevokedNodes))
	for id := range st.RevokedNodes {
		m[id] = true
	}
	a.revoked.Store(&m)
	a.ep.CloseRevoked()
}
