package identity

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"shoal/internal/version"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/transport"
)

// MethodJoin is the RPC a server that is not the leader passes a join
// request on with (Admission.Forwarded answers it on the leader).
const MethodJoin = "Cluster.Join"

// Admission answers the join requests of nodes without a certificate: a
// server passes them to the leader, which checks the join token and signs
// the node's certificate with the cluster CA. It also answers the
// bootstrap polls of servers started with the bootstrap secret.
type Admission struct {
	cfg AdmissionConfig
}

// AdmissionConfig is what the join handler needs of the agent.
type AdmissionConfig struct {
	ID, Name        string
	Server          *coordinator.Server // nil on clients, which refuse joins
	CA              *transport.CA       // the cluster CA (its key on servers)
	GossipKey       []byte
	BootstrapSecret string             // "" unless started with the servers' secret
	Call            coordinator.Caller // reaches the leader
	Seeds           func() []string    // gossip addresses a new node can join through
	// CheckToken validates a presented token against the state, of one
	// of kinds.
	CheckToken func(st *coordinator.State, presented string, now time.Time, kinds ...string) (*coordinator.Token, error)
	Log        *zap.Logger
	// Protocols and Build are this node's protocol window and version
	// (zero: this build's).
	Protocols version.Window
	Build     string
}

// NewAdmission is the join handler.
func NewAdmission(cfg AdmissionConfig) *Admission { return &Admission{cfg: cfg} }

// Forwarded answers a join request (JSON) another server passed on with
// MethodJoin.
func (j *Admission) Forwarded(ctx context.Context, body json.RawMessage) (any, error) {
	var req joinRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	return j.handle(ctx, &req, true), nil
}

// Serve answers a join stream (transport.KindJoin): servers pass it to the leader, which
// checks the token and signs the certificate.
func (j *Admission) Serve(st *transport.Stream) {
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
		resp = j.answerFinal(req.Bootstrap)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		resp = j.handle(ctx, &req, false)
		cancel()
	}
	if resp.Err != "" {
		j.cfg.Log.Warn("refused join", zap.String("from", st.Peer.Addr.String()), zap.String("name", req.Name), zap.String("reason", resp.Err))
	}
	out, _ := json.Marshal(resp)
	_ = transport.WriteFrame(st, out)
}

func (j *Admission) handle(ctx context.Context, req *joinRequest, forwarded bool) *joinResponse {
	fail := func(err error) *joinResponse { return &joinResponse{Err: err.Error(), Code: transport.StatusOf(err)} }
	// The name goes into the certificate, the state, logs and listings.
	if err := coordinator.CheckNodeName(req.Name); err != nil {
		return &joinResponse{Err: err.Error() + ": start the node with another --name", Code: http.StatusBadRequest}
	}
	if j.cfg.Server == nil {
		return &joinResponse{Err: fmt.Sprintf("agent %s is a client: --join a server", j.cfg.Name), Code: http.StatusBadRequest}
	}
	// The connection's protocol was checked by the transport; a join the
	// leader gets from another server is checked against its own window.
	w, build := j.cfg.Protocols.Or(), version.BuildOr(j.cfg.Build)
	if req.Protocol != 0 && !w.Has(req.Protocol) {
		m := &version.Mismatch{Local: w, LocalBuild: build, Remote: req.Protocol, RemoteMin: req.Protocol, RemoteBuild: req.Version, Peer: "node " + req.Name}
		return &joinResponse{Err: m.Error(), Code: http.StatusBadRequest}
	}
	if !j.cfg.Server.IsLeader() {
		_, addr := j.cfg.Server.Leader()
		if addr == "" || forwarded {
			return &joinResponse{Err: "no cluster leader yet", Code: http.StatusServiceUnavailable}
		}
		var resp joinResponse
		if err := j.cfg.Call.Call(ctx, addr, MethodJoin, req, &resp); err != nil {
			return fail(err)
		}
		return &resp
	}
	st := j.cfg.Server.FSM().State()
	tok, err := j.cfg.CheckToken(st, req.Token, time.Now(), coordinator.TokenJoin, coordinator.TokenBootstrap)
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
	cert, err := j.cfg.CA.Issue(ed25519.PublicKey(req.PublicKey), id, req.Name, req.Role)
	if err != nil {
		return &joinResponse{Err: err.Error(), Code: http.StatusBadRequest}
	}
	resp := &joinResponse{NodeID: id, CACert: j.cfg.CA.DER, Cert: cert, GossipKey: j.cfg.GossipKey, Seeds: j.cfg.Seeds()}
	if req.Role == coordinator.RoleServer {
		if resp.CAKey, err = marshalPKCS8(j.cfg.CA.Key); err != nil {
			return fail(err)
		}
	}
	j.cfg.Log.Info("admitted node", zap.String("name", req.Name), zap.String("id", id), zap.String("role", req.Role),
		zap.String("version", req.Version), zap.Int("protocol", version.Of(req.Protocol)))
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

// finalCandidate is the answer a running server gives a bootstrap poll.
func (j *Admission) finalCandidate() (*candidate, error) {
	key, err := marshalPKCS8(j.cfg.CA.Key)
	if err != nil {
		return nil, err
	}
	return &candidate{NodeID: j.cfg.ID, Name: j.cfg.Name, CACert: j.cfg.CA.DER, CAKey: key, GossipKey: j.cfg.GossipKey}, nil
}

// answerFinal answers a bootstrap poll on a running node: servers that
// know the bootstrap secret give the cluster's CA while the bootstrap
// token is valid.
func (j *Admission) answerFinal(sealed []byte) *joinResponse {
	if j.cfg.Server == nil {
		return &joinResponse{Err: fmt.Sprintf("agent %s is a client: --join a server", j.cfg.Name), Code: http.StatusBadRequest}
	}
	if j.cfg.BootstrapSecret == "" {
		return &joinResponse{Err: fmt.Sprintf("server %s was started without the bootstrap secret", j.cfg.Name), Code: http.StatusServiceUnavailable}
	}
	var tok *coordinator.Token
	j.cfg.Server.FSM().View(func(st *coordinator.State) { tok = st.Tokens[coordinator.TokenBootstrap] })
	if tok != nil && !tok.Valid(time.Now()) {
		return &joinResponse{Err: "the bootstrap secret was revoked: join with a token from 'shoal token create'", Code: http.StatusForbidden}
	}
	seal, err := newSealer(j.cfg.BootstrapSecret)
	if err != nil {
		return &joinResponse{Err: err.Error(), Code: http.StatusInternalServerError}
	}
	final, err := j.finalCandidate()
	if err != nil {
		return &joinResponse{Err: err.Error(), Code: http.StatusServiceUnavailable}
	}
	return answerBootstrap(seal, nil, final, sealed)
}
