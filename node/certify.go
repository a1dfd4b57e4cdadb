package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"shoal/coordinator"
	"shoal/transport"
)

// methodHello asks a node what it would gossip about itself; the leader
// asks it over a connection that verified the node's certificate, so the
// answer is the node's own (coordinator.Config.Certify).
const methodHello = "Node.Hello"

// registerHello answers methodHello with this agent's gossip metadata.
func (a *Agent) registerHello() {
	a.rpc.Register(methodHello, func(context.Context, transport.Peer, json.RawMessage) (any, error) {
		return a.meta, nil
	})
}

// certify is coordinator.Config.Certify: it dials the QUIC address gossip
// gives for m, requires the certificate there to be m.ID's, and asks the
// node for its metadata on that connection. Identity (ID, name, role)
// comes from the certificate, the addresses from the connection that
// reached it, the version and capacities from the node's answer.
func (a *Agent) certify(ctx context.Context, m coordinator.Member) (coordinator.Member, error) {
	if m.ID == a.id {
		return a.memberFromMeta(m, a.ident.ID, a.ident.Name, a.ident.Role, a.meta), nil
	}
	if m.RPCAddr == "" {
		return coordinator.Member{}, errors.New("gossip gives no QUIC address")
	}
	st, err := a.ep.DialAs(ctx, m.RPCAddr, transport.KindRPC, m.ID, "")
	if err != nil {
		return coordinator.Member{}, err
	}
	peer := st.Peer
	var got meta
	if err := transport.CallStream(ctx, st, methodHello, nil, &got); err != nil {
		if transport.StatusOf(err) != http.StatusNotFound {
			return coordinator.Member{}, fmt.Errorf("asking %s who it is: %w", m.RPCAddr, err)
		}
		// An agent of a version before Node.Hello: its certificate still
		// proves who it is; its capacities are gossip's.
		got = meta{Name: m.Name, Version: m.Version, Expect: m.Expect, Mem: m.Caps.MemTotal, Free: m.Caps.MemFree, Cores: m.Caps.Cores,
			GFLOPS: m.Caps.GFLOPS, GBps: m.Caps.MemGBps, Accel: m.Caps.Accel, Serves: m.Caps.Serves}
		if _, p, err := net.SplitHostPort(m.HTTPAddr); err == nil {
			got.HTTP, _ = strconv.Atoi(p)
		}
	}
	return a.memberFromMeta(m, peer.ID, peer.Name, peer.Role, got), nil
}

// memberFromMeta is gossip member m as certified: identity from the
// certificate (a certificate from before names were bound keeps gossip's
// name), the rest from the node's own metadata.
func (a *Agent) memberFromMeta(m coordinator.Member, id, name, role string, md meta) coordinator.Member {
	if name == "" {
		name = m.Name
	}
	out := coordinator.Member{
		ID: id, Name: name, Role: role, Addr: m.Addr, RPCAddr: m.RPCAddr, Version: md.Version, Status: m.Status, Expect: md.Expect,
		Caps: coordinator.Capabilities{MemTotal: md.Mem, MemFree: md.Free, Cores: md.Cores, GFLOPS: md.GFLOPS, MemGBps: md.GBps,
			Accel: md.Accel, Serves: md.Serves},
	}
	if host, _, err := net.SplitHostPort(m.RPCAddr); err == nil && md.HTTP > 0 {
		out.HTTPAddr = net.JoinHostPort(host, strconv.Itoa(md.HTTP))
	}
	return out
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
