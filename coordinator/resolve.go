package coordinator

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"shoal/internal/nodeaddr"
)

// resolveTTL bounds how stale a resolved Raft address may be: the
// transport asks for an address on every RPC (heartbeats included), so the
// view is rebuilt at most this often.
const resolveTTL = 250 * time.Millisecond

// addrResolver is the Raft transport's raft.ServerAddressProvider. Raft
// keeps each server's address in its configuration, but a server is its
// node ID: a pod or container that restarts with the same data dir comes
// back on a new IP. The transport therefore dials a server where the
// cluster says it is now, by ID:
//
//  1. gossip, when the node is alive there (what it advertises now);
//  2. the committed state's node record (the leader's last view, known
//     to a server that restarted before gossip found its peers);
//  3. gossip's last record of a failed or departed node;
//  4. the address in the Raft configuration.
type addrResolver struct {
	members Membership
	fsm     *FSM
	raft    atomic.Pointer[raft.Raft] // set once Raft exists; source 4
	log     *zap.Logger

	mu     sync.Mutex
	at     time.Time
	addrs  map[raft.ServerID]raft.ServerAddress
	logged map[raft.ServerID]raft.ServerAddress // addresses that differ from the configuration, logged once
}

var _ raft.ServerAddressProvider = (*addrResolver)(nil)

var errUnknownServer = errors.New("server unknown to gossip, state and configuration")

func newAddrResolver(m Membership, fsm *FSM, log *zap.Logger) *addrResolver {
	return &addrResolver{members: m, fsm: fsm, log: log, logged: map[raft.ServerID]raft.ServerAddress{}}
}

// ServerAddr implements raft.ServerAddressProvider. An error makes the
// transport use the configured address.
func (r *addrResolver) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.addrs == nil || time.Since(r.at) >= resolveTTL {
		r.rebuild()
	}
	if a, ok := r.addrs[id]; ok {
		// The layer dials it only if the peer's certificate is id's.
		return raft.ServerAddress(nodeaddr.Tag(string(id), string(a))), nil
	}
	return "", errUnknownServer
}

// rebuild recomputes every server's address; under r.mu.
func (r *addrResolver) rebuild() {
	addrs := map[raft.ServerID]raft.ServerAddress{}
	set := func(id string, addr string) {
		if id != "" && addr != "" {
			addrs[raft.ServerID(id)] = raft.ServerAddress(addr)
		}
	}
	// Lowest precedence first; later sources overwrite.
	var conf []raft.Server
	if rf := r.raft.Load(); rf != nil {
		if f := rf.GetConfiguration(); f.Error() == nil {
			conf = f.Configuration().Servers
		}
	}
	for _, srv := range conf {
		addrs[srv.ID] = srv.Address
	}
	members := r.members.Members()
	for _, m := range members {
		if !live(m.Status) {
			set(m.ID, m.RPCAddr)
		}
	}
	r.fsm.View(func(st *State) {
		for id, n := range st.Nodes {
			set(id, n.RPCAddr)
		}
	})
	for _, m := range members {
		if live(m.Status) {
			set(m.ID, m.RPCAddr)
		}
	}
	for _, srv := range conf {
		a := addrs[srv.ID]
		if a != srv.Address && r.logged[srv.ID] != a {
			r.logged[srv.ID] = a
			r.log.Info("raft server moved: dialing it at its current address",
				zap.String("id", string(srv.ID)), zap.String("configured", string(srv.Address)), zap.String("addr", string(a)))
		} else if a == srv.Address {
			delete(r.logged, srv.ID)
		}
	}
	r.addrs, r.at = addrs, time.Now()
}

// live: gossip hears from the node now (suspect included: it may only be
// slow), so its advertised address is current.
func live(st NodeStatus) bool { return st == StatusAlive || st == StatusSuspect }
