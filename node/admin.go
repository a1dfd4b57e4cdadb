package node

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"shoal/api"
	"shoal/catalog"
	"shoal/coordinator"
	"shoal/internal/grantcache"
	"shoal/internal/nodeaddr"
	"shoal/internal/version"
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
	// keys keeps servers' answers about API keys on a client agent.
	keys grantcache.Cache[keyGrant]
}

// newAdmin wires the admin API's backend.
func (a *Agent) newAdmin() *admin {
	return &admin{
		id: a.id, name: a.cfg.Name, role: a.role,
		cluster: a.cluster, srv: a.srv, call: serverCaller(a.ep), members: a.gossip.Members,
		self: func() api.Member {
			return api.Member{ID: a.id, Name: a.cfg.Name, Addr: a.GossipAddr(), RPCAddr: a.RPCAddr(), Role: a.role,
				Status: api.StatusAlive, Version: a.cfg.Version, Protocol: a.protocols().Max, Caps: apiCaps(a.selfCaps())}
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

// askServer calls method on a server: how a client agent, which holds no
// state, answers what only servers know. asked is false when no server
// was known to ask (err says why).
func (b *admin) askServer(ctx context.Context, method string, in, out any) (asked bool, err error) {
	addr, err := b.cluster.ServerAddr()
	if err != nil {
		return false, err
	}
	return true, b.call.Call(ctx, addr, method, in, out)
}

func forbidden(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusForbidden, Msg: fmt.Sprintf(format, args...)}
}

// Status answers from the local server, or asks a server on a client agent.
func (b *admin) Status(ctx context.Context) (*api.Status, error) {
	if b.srv == nil {
		var s api.Status
		if _, err := b.askServer(ctx, methodStatus, nil, &s); err != nil {
			return nil, err
		}
		s.Node, s.NodeName, s.Role = b.id, b.name, b.role
		return &s, nil
	}
	st := b.srv.FSM().State()
	s := &api.Status{Node: b.id, NodeName: b.name, Role: b.role, Index: st.Index, Nodes: len(st.Nodes), Protocol: version.Of(st.Protocol)}
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

// TransferLeader hands the Raft leadership to a server node.
func (b *admin) TransferLeader(ctx context.Context, ref string) error {
	n, err := b.resolveNode(ctx, ref)
	if err != nil {
		return err
	}
	return b.cluster.TransferLeader(ctx, n.ID)
}

// Members is this agent's own gossip view.
func (b *admin) Members(ctx context.Context) ([]api.Member, error) {
	var out []api.Member
	found := false
	for _, m := range b.members() {
		out = append(out, api.Member{ID: m.ID, Name: m.Name, Addr: m.Addr, RPCAddr: m.RPCAddr, Role: m.Role,
			Status: string(m.Status), Version: m.Version, Protocol: version.Of(m.Protocol), Caps: apiCaps(m.Caps)})
		found = found || m.ID == b.id
	}
	if !found {
		out = append(out, b.self())
	}
	return out, nil
}

// ClusterLogits runs on the model's driver (api.ClusterRunner).
func (b *admin) ClusterLogits(ctx context.Context, model string, tokens []int32) (*api.Logits, error) {
	return b.runner.ClusterLogits(ctx, model, tokens)
}

// ClusterMeasured is answered by the model's driver (api.ClusterRunner).
func (b *admin) ClusterMeasured(ctx context.Context, model string) (*api.Measured, error) {
	return b.runner.ClusterMeasured(ctx, model)
}

// ClusterBench runs on the model's driver (api.ClusterRunner).
func (b *admin) ClusterBench(ctx context.Context, model string, req api.BenchRequest) (*api.BenchResult, error) {
	return b.runner.ClusterBench(ctx, model, req)
}
