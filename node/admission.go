package node

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/transport"
)

// admission answers the join requests of nodes without a certificate: a
// server passes them to the leader, which checks the join token and signs
// the node's certificate with the cluster CA.
type admission struct {
	name      string
	srv       *coordinator.Server // nil on clients, which refuse joins
	ca        *transport.CA
	gossipKey []byte
	call      coordinator.Caller
	seeds     func() []string // gossip addresses a new node can join through
	bootstrap func(sealed []byte) *joinResponse
	log       *zap.Logger
}

// newAdmission wires the join handler.
func (a *Agent) newAdmission() *admission {
	return &admission{name: a.cfg.Name, srv: a.srv, ca: a.ident.CA, gossipKey: a.gossipKey, call: serverCaller(a.ep),
		seeds: a.aliveGossipAddrs, bootstrap: a.answerFinal, log: a.log}
}

// serve answers a join stream: servers pass it to the leader, which
// checks the token and signs the certificate.
func (j *admission) serve(st *transport.Stream) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := transport.ReadFrame(st, maxJoinFrame)
	if err != nil {
		return
	}
	var req joinRequest
	var resp *joinResponse
	if err := json.Unmarshal(b, &req); err != nil {
		resp = &joinResponse{Err: "malformed join request", Code: http.StatusBadRequest}
	} else if req.Bootstrap != nil {
		resp = j.bootstrap(req.Bootstrap)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		resp = j.handle(ctx, &req, false)
		cancel()
	}
	if resp.Err != "" {
		j.log.Warn("refused join", zap.String("from", st.Peer.Addr.String()), zap.String("name", req.Name), zap.String("reason", resp.Err))
	}
	out, _ := json.Marshal(resp)
	_ = transport.WriteFrame(st, out)
}

func (j *admission) handle(ctx context.Context, req *joinRequest, forwarded bool) *joinResponse {
	fail := func(err error) *joinResponse { return &joinResponse{Err: err.Error(), Code: transport.StatusOf(err)} }
	// The name goes into the certificate, the state, logs and listings.
	if err := coordinator.CheckNodeName(req.Name); err != nil {
		return &joinResponse{Err: err.Error() + ": start the node with another --name", Code: http.StatusBadRequest}
	}
	if j.srv == nil {
		return &joinResponse{Err: fmt.Sprintf("agent %s is a client: --join a server", j.name), Code: http.StatusBadRequest}
	}
	if !j.srv.IsLeader() {
		_, addr := j.srv.Leader()
		if addr == "" || forwarded {
			return &joinResponse{Err: "no cluster leader yet", Code: http.StatusServiceUnavailable}
		}
		var resp joinResponse
		if err := j.call.Call(ctx, addr, methodJoin, req, &resp); err != nil {
			return fail(err)
		}
		return &resp
	}
	st := j.srv.FSM().State()
	tok, err := checkToken(st, req.Token, time.Now(), coordinator.TokenJoin, coordinator.TokenBootstrap)
	if err != nil {
		return fail(err)
	}
	if resp := impostor(st, req); resp != nil {
		return resp
	}
	// The token grants the role: only a server join token (or the
	// servers' bootstrap secret) admits a server, which gets the CA key.
	if req.Role == coordinator.RoleServer && tok.Kind == coordinator.TokenJoin && tok.Role != coordinator.RoleServer {
		return &joinResponse{Err: fmt.Sprintf("token %s admits clients, not servers: make a server join token with 'shoal token create --role server'", tok.ID),
			Code: http.StatusForbidden}
	}
	if len(req.PublicKey) != ed25519.PublicKeySize || len(req.NodeID) != 36 {
		return &joinResponse{Err: "join request without a valid node ID and ed25519 public key", Code: http.StatusBadRequest}
	}
	// The cluster names the node: a node ID is never the joiner's choice.
	id, err := newNodeID()
	if err != nil {
		return fail(err)
	}
	cert, err := j.ca.Issue(ed25519.PublicKey(req.PublicKey), id, req.Name, req.Role)
	if err != nil {
		return &joinResponse{Err: err.Error(), Code: http.StatusBadRequest}
	}
	resp := &joinResponse{NodeID: id, CACert: j.ca.DER, Cert: cert, GossipKey: j.gossipKey, Seeds: j.seeds()}
	if req.Role == coordinator.RoleServer {
		if resp.CAKey, err = marshalPKCS8(j.ca.Key); err != nil {
			return fail(err)
		}
	}
	j.log.Info("admitted node", zap.String("name", req.Name), zap.String("id", id), zap.String("role", req.Role))
	return resp
}

// impostor refuses a join from a data dir that names a node the cluster
// knows (a copy of another node's, or a removed node's), and a join under
// the name of a live node: names and IDs are how operators and the
// planner tell nodes apart.
func impostor(st *coordinator.State, req *joinRequest) *joinResponse {
	if _, gone := st.RevokedNodes[req.NodeID]; gone {
		return &joinResponse{Err: fmt.Sprintf("node %s was removed from the cluster (shoal node rm): start it with a fresh --data-dir", req.NodeID),
			Code: http.StatusForbidden}
	}
	if n := st.Nodes[req.NodeID]; n != nil && n.Status != coordinator.StatusAlive && n.Status != coordinator.StatusSuspect {
		return &joinResponse{Err: fmt.Sprintf("node ID %s belongs to node %s (%s): remove it with 'shoal node rm %s' first, or start the new node with a fresh --data-dir", n.ID, n.Name, n.Status, n.Name),
			Code: http.StatusConflict}
	}
	for _, n := range st.SortedNodes() {
		if n.Status != coordinator.StatusAlive && n.Status != coordinator.StatusSuspect {
			continue
		}
		switch {
		case n.ID == req.NodeID:
			return &joinResponse{Err: fmt.Sprintf("node ID %s is already a live member (%s): start the new node with a fresh --data-dir", n.ID, n.Name),
				Code: http.StatusConflict}
		case n.Name == req.Name:
			return &joinResponse{Err: fmt.Sprintf("the name %q is taken by live node %s: give the new node another --name", n.Name, n.ID),
				Code: http.StatusConflict}
		}
	}
	return nil
}
