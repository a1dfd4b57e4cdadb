package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"shoal/coordinator"
	"shoal/node/membership"
	"shoal/transport"
)

// methodHello asks a node what it would gossip about itself; the leader
// asks it over a connection that verified the node's certificate, so the
// answer is the node's own (coordinator.Config.Certify).
const methodHello = "Node.Hello"

// registerHello answers methodHello with this agent's gossip metadata.
func (a *Agent) registerHello() {
	a.rpc.Register(methodHello, func(context.Context, transport.Peer, json.RawMessage) (any, error) {
		return a.selfMeta(), nil
	})
}

// certify is coordinator.Config.Certify: it dials the QUIC address gossip
// gives for m, requires the certificate there to be m.ID's, and asks the
// node for its metadata on that connection. Identity (ID, name, role)
// comes from the certificate, the addresses from the connection that
// reached it, the version and capacities from the node's answer.
func (a *Agent) certify(ctx context.Context, m coordinator.Member) (coordinator.Member, error) {
	if m.ID == a.id {
		return membership.Certified(m, a.ident.ID, a.ident.Name, a.ident.Role, a.selfMeta()), nil
	}
	if m.RPCAddr == "" {
		return coordinator.Member{}, errors.New("gossip gives no QUIC address")
	}
	st, err := a.ep.DialAs(ctx, m.RPCAddr, transport.KindRPC, m.ID, "")
	if err != nil {
		return coordinator.Member{}, err
	}
	peer := st.Peer
	var got membership.Meta
	if err := transport.CallStream(ctx, st, methodHello, nil, &got); err != nil {
		if transport.StatusOf(err) != http.StatusNotFound {
			return coordinator.Member{}, fmt.Errorf("asking %s who it is: %w", m.RPCAddr, err)
		}
		// An agent of a version before Node.Hello: its certificate still
		// proves who it is; its capacities are gossip's.
		got = membership.MetaOf(m)
	}
	return membership.Certified(m, peer.ID, peer.Name, peer.Role, got), nil
}

// certifiedAt tells whether the cluster registered node id, from its
// certificate, at QUIC address addr (this agent's copy of the state):
// the peers worth measuring links to, not whatever gossip lists.
func (a *Agent) certifiedAt(id, addr string) bool {
	var ok bool
	a.viewState(func(st *coordinator.State) {
		n := st.Nodes[id]
		ok = n != nil && n.RPCAddr == addr
	})
	return ok
}
