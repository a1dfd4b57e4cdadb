package coordinator

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

const applyTimeout = 5 * time.Second

func (s *Server) monitorLeadership() {
	defer s.wg.Done()
	var stop chan struct{}
	var loop sync.WaitGroup
	end := func() {
		if stop != nil {
			close(stop)
			loop.Wait()
			stop = nil
		}
	}
	defer end()
	for {
		select {
		case <-s.shutdown:
			return
		case leader := <-s.notify:
			if leader && stop == nil {
				s.log.Info("gained leadership")
				stop = make(chan struct{})
				loop.Add(1)
				go func(stop chan struct{}) {
					defer loop.Done()
					s.leaderLoop(stop)
				}(stop)
			} else if !leader && stop != nil {
				s.log.Info("lost leadership")
				end()
			}
		}
	}
}

// leaderLoop runs while this server leads: a barrier so the FSM holds every
// committed entry, then reconcile on membership events and on a timer.
func (s *Server) leaderLoop(stop chan struct{}) {
	for attempt := 0; ; attempt++ {
		if err := s.wait(s.raft.Barrier(applyTimeout)); err == nil {
			break
		} else {
			s.log.Warn("barrier failed", zap.Error(err))
		}
		select {
		case <-stop:
			return
		case <-time.After(s.cfg.ReconcileInterval):
		}
	}
	if s.cfg.OnLeader != nil {
		s.cfg.OnLeader()
	}
	s.mu.Lock()
	s.seen = map[string]time.Time{}
	s.failed = map[string]time.Time{}
	s.planSig = map[string]string{}
	s.mu.Unlock()
	s.certs.init()
	certified := s.certifyDone()
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		s.reconcile()
		s.planModels()
		// Model loads and drains arrive as state changes: plan on them
		// too, without another membership pass.
		for again := true; again; {
			select {
			case <-stop:
				return
			case <-t.C:
				again = false
			case <-s.cfg.Members.Events():
				again = false
			case <-certified:
				again = false
			case <-s.fsm.Changed():
				s.planModels()
			}
		}
	}
}

// reconcile brings the state's node list and the Raft configuration in
// line with gossip: liveness from gossip, identity, addresses and
// capacities from each member's certified answer (certify.go).
func (s *Server) reconcile() {
	members := s.cfg.Members.Members()
	st := s.fsm.State()
	now := time.Now().UTC()
	seen := map[string]bool{}

	s.mu.Lock()
	for id, at := range s.removed {
		if now.Sub(at) > 30*time.Second {
			delete(s.removed, id)
		}
	}
	removed := make(map[string]bool, len(s.removed))
	for id := range s.removed {
		removed[id] = true
	}
	s.mu.Unlock()

	var certified []Member
	for _, m := range members {
		seen[m.ID] = true
		if removed[m.ID] {
			continue
		}
		old, known := st.Nodes[m.ID]
		var n Node
		if live(m.Status) {
			c, refused := s.certified(m)
			if c == nil {
				if known && old.Status != m.Status && (!refused || m.Status != StatusAlive) {
					// Registered before, by an earlier leader: liveness is
					// gossip's while this leader's certification is under
					// way (under load leadership can move faster than a
					// certification ends, and a node left at suspect is
					// planned around for nothing). Nothing else changes;
					// a node that failed this leader's certification may
					// still turn suspect, never alive.
					if err := s.Apply(NodeStatusType, NodeStatusRequest{ID: m.ID, Status: m.Status, Now: now}, applyTimeout); err != nil {
						s.log.Warn("node status", zap.String("node", old.Name), zap.String("id", m.ID), zap.Error(err))
						return
					}
				}
				continue // not proven yet (or never): nothing else gossip says is written
			}
			certified = append(certified, *c)
			n = Node{
				ID: c.ID, Name: c.Name, Role: c.Role, Addr: c.Addr, RPCAddr: c.RPCAddr, HTTPAddr: c.HTTPAddr,
				Version: c.Version, Protocol: c.Protocol, Status: m.Status, Caps: c.Caps,
			}
			if !known && m.Status != StatusAlive {
				continue // only live nodes join the state
			}
		} else {
			if !known {
				continue
			}
			n = *old // failed or left: gossip's liveness, nothing else, changes
			n.Status = m.Status
		}
		if known {
			n.Draining, n.RegisteredAt, n.StatusSince = old.Draining, old.RegisteredAt, old.StatusSince
			if *old == n {
				continue
			}
		}
		if err := s.Apply(RegisterNodeType, RegisterNodeRequest{Node: n, Now: now}, applyTimeout); err != nil {
			s.log.Warn("register node", zap.String("node", n.Name), zap.String("id", n.ID), zap.Error(err))
			if e, ok := err.(*Error); ok && e.Code >= 400 && e.Code < 500 {
				continue // this node's record is refused: the others still register
			}
			return
		}
	}
	// Nodes gossip has forgotten entirely are failed (unless they left).
	for id, n := range st.Nodes {
		if seen[id] || n.Status == StatusFailed || n.Status == StatusLeft {
			continue
		}
		if err := s.Apply(NodeStatusType, NodeStatusRequest{ID: id, Status: StatusFailed, Now: now}, applyTimeout); err != nil {
			s.log.Warn("mark node failed", zap.String("node", n.Name), zap.Error(err))
			return
		}
	}
	s.raiseProtocol()
	s.manageVoters(members, certified, removed)
}

// manageVoters adds live servers as non-voters, promotes stable non-voters
// to keep an odd voter count (3 or 5), and replaces or removes voters that
// stayed failed past the grace period. Health is gossip's; a server is
// added, promoted or moved only as certified (its certificate's role
// server, at the address that presented it).
func (s *Server) manageVoters(members, certified []Member, removed map[string]bool) {
	f := s.raft.GetConfiguration()
	if s.wait(f) != nil {
		return
	}
	conf := f.Configuration()
	byID := map[string]Member{} // liveness
	for _, m := range members {
		byID[m.ID] = m
	}
	certByID := map[string]Member{} // identity and addresses
	for _, m := range certified {
		certByID[m.ID] = m
	}
	inConf := map[string]raft.Server{}
	for _, srv := range conf.Servers {
		inConf[string(srv.ID)] = srv
	}
	now := time.Now()
	self := s.cfg.NodeID

	if s.updateAddress(certified, inConf, removed) {
		return // one configuration change per pass
	}

	// New live servers join as non-voters.
	for _, m := range certified {
		if m.Role != RoleServer || m.Status != StatusAlive || removed[m.ID] {
			continue
		}
		if _, ok := inConf[m.ID]; ok {
			continue
		}
		s.log.Info("adding server as non-voter", zap.String("node", m.Name), zap.String("addr", m.RPCAddr))
		if err := s.wait(s.raft.AddNonvoter(raft.ServerID(m.ID), raft.ServerAddress(m.RPCAddr), 0, applyTimeout)); err != nil {
			s.log.Warn("add non-voter", zap.String("node", m.Name), zap.Error(err))
		}
		return // one configuration change per pass
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	healthy := func(id string) bool {
		if id == self {
			return true
		}
		m, ok := byID[id]
		return ok && m.Status == StatusAlive
	}
	var liveVoters, deadVoters, readyNonvoters, deadNonvoters []string
	unhealthyVoters := 0
	for _, srv := range conf.Servers {
		id := string(srv.ID)
		if healthy(id) {
			delete(s.failed, id)
		} else if _, ok := s.failed[id]; !ok {
			s.failed[id] = now
		}
		pastGrace := !healthy(id) && now.Sub(s.failed[id]) >= s.cfg.DeadServerGrace
		switch {
		case srv.Suffrage == raft.Voter && healthy(id):
			liveVoters = append(liveVoters, id)
		case srv.Suffrage == raft.Voter && pastGrace:
			deadVoters = append(deadVoters, id)
		case srv.Suffrage != raft.Voter && healthy(id):
			if _, ok := s.seen[id]; !ok {
				s.seen[id] = now
			}
			if now.Sub(s.seen[id]) >= s.cfg.ServerStabilization {
				readyNonvoters = append(readyNonvoters, id)
			}
		case srv.Suffrage != raft.Voter && pastGrace:
			deadNonvoters = append(deadNonvoters, id)
		}
		if !healthy(id) {
			delete(s.seen, id)
			if srv.Suffrage == raft.Voter {
				unhealthyVoters++
			}
		}
	}
	sort.Strings(readyNonvoters)
	voters := 0
	for _, srv := range conf.Servers {
		if srv.Suffrage == raft.Voter {
			voters++
		}
	}

	// A failed voter past grace: replace it by a ready non-voter, or drop it
	// when enough voters remain.
	if len(deadVoters) > 0 {
		dead := deadVoters[0]
		if len(readyNonvoters) > 0 {
			s.promote(readyNonvoters[0], certByID)
			readyNonvoters = readyNonvoters[1:]
			voters++
		}
		if voters > 3 {
			s.log.Info("removing failed voter", zap.String("id", dead))
			if err := s.wait(s.raft.RemoveServer(raft.ServerID(dead), 0, applyTimeout)); err != nil {
				s.log.Warn("remove failed voter", zap.Error(err))
			}
			delete(s.failed, dead)
		}
		return
	}
	for _, id := range deadNonvoters {
		s.log.Info("removing failed non-voter", zap.String("id", id))
		_ = s.wait(s.raft.RemoveServer(raft.ServerID(id), 0, applyTimeout))
		delete(s.failed, id)
	}

	// Change the voter count only while every voter is healthy: a voter
	// that is down but within its grace may come back.
	if unhealthyVoters > 0 {
		return
	}
	// Keep an odd number of voters, at most 5.
	target := oddTarget(len(liveVoters) + len(readyNonvoters))
	for len(liveVoters) < target && len(readyNonvoters) > 0 {
		s.promote(readyNonvoters[0], certByID)
		liveVoters = append(liveVoters, readyNonvoters[0])
		readyNonvoters = readyNonvoters[1:]
	}
	if len(liveVoters) > target {
		// Demote a follower, never ourselves.
		sort.Strings(liveVoters)
		for _, id := range liveVoters {
			if id == self {
				continue
			}
			s.log.Info("demoting voter to keep an odd voter count", zap.String("id", id))
			if err := s.wait(s.raft.DemoteVoter(raft.ServerID(id), 0, applyTimeout)); err != nil {
				s.log.Warn("demote voter", zap.Error(err))
			}
			break
		}
	}
}

// updateAddress rewrites the Raft address of one server that gossip says
// is alive at another address than the configuration holds (it restarted
// on a new IP with the same data dir, so the same ID). Adding a server
// with its ID and the new address keeps its suffrage. The transport
// already dials it by ID; this makes the stored configuration converge,
// so servers that restart later start from current addresses. It reports
// whether a change was proposed.
func (s *Server) updateAddress(members []Member, inConf map[string]raft.Server, removed map[string]bool) bool {
	owner := map[raft.ServerAddress]string{}
	for id, srv := range inConf {
		owner[srv.Address] = id
	}
	for _, m := range members {
		srv, ok := inConf[m.ID]
		addr := raft.ServerAddress(m.RPCAddr)
		if !ok || m.Status != StatusAlive || removed[m.ID] || addr == "" || srv.Address == addr {
			continue
		}
		if o, taken := owner[addr]; taken && o != m.ID {
			// Raft refuses two servers at one address: the other one's
			// entry is stale too (an IP reused); it is updated first, or
			// this one waits.
			s.log.Debug("new raft address still held by another server's entry",
				zap.String("node", m.Name), zap.String("addr", m.RPCAddr), zap.String("held_by", o))
			continue
		}
		s.log.Info("updating a moved server's raft address", zap.String("node", m.Name), zap.String("id", m.ID),
			zap.String("old", string(srv.Address)), zap.String("addr", m.RPCAddr), zap.Bool("voter", srv.Suffrage == raft.Voter))
		var f raft.IndexFuture
		if srv.Suffrage == raft.Voter {
			f = s.raft.AddVoter(srv.ID, addr, 0, applyTimeout)
		} else {
			f = s.raft.AddNonvoter(srv.ID, addr, 0, applyTimeout)
		}
		if err := s.wait(f); err != nil {
			s.log.Warn("update raft address", zap.String("node", m.Name), zap.Error(err))
		}
		return true
	}
	return false
}

// oddTarget is the voter count for n healthy servers: 1, 3 or 5.
func oddTarget(n int) int {
	switch {
	case n >= 5:
		return 5
	case n >= 3:
		return 3
	}
	return 1
}

func (s *Server) promote(id string, byID map[string]Member) {
	addr := byID[id].RPCAddr
	if addr == "" || byID[id].Role != RoleServer {
		return
	}
	s.log.Info("promoting non-voter", zap.String("id", id))
	if err := s.wait(s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, applyTimeout)); err != nil {
		s.log.Warn("promote", zap.String("id", id), zap.Error(err))
	}
}

// RemoveNode removes a node from Raft (if a server) and from the state. The
// caller tells the node to leave gossip. Runs on the leader.
func (s *Server) RemoveNode(id string) error {
	if err := s.ForgetNode(id); err != nil {
		return err
	}
	return s.DeregisterNode(id)
}

// ForgetNode is the first step of removing node id, on the leader: it
// applies every entry committed before, finds the node in the state or
// the Raft configuration (a 404 error when in neither), removes it from
// the configuration if there, and keeps the reconcile loop from adding it
// back for a while. The node stays in the state (DeregisterNode).
func (s *Server) ForgetNode(id string) error {
	if !s.IsLeader() {
		return ErrNotLeader
	}
	if id == s.cfg.NodeID {
		return errorf(http.StatusConflict, "node %s is the leader; hand the leadership to another server first (shoal node lead ID) or stop it", id)
	}
	// A leader just elected may not have applied every entry committed
	// before its term yet: the node the caller found in its own state
	// would be "not found" here. The barrier applies them first.
	if err := s.wait(s.raft.Barrier(applyTimeout)); err != nil {
		return raftError("raft barrier", err)
	}
	found := false
	s.fsm.View(func(st *State) { _, found = st.Nodes[id] })
	if f := s.raft.GetConfiguration(); s.wait(f) == nil {
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == id {
				found = true
				if err := s.wait(s.raft.RemoveServer(srv.ID, 0, applyTimeout)); err != nil {
					return raftError("removing the server from raft", err)
				}
			}
		}
	}
	if !found {
		return errorf(http.StatusNotFound, "node %q not found", id)
	}
	s.mu.Lock()
	s.removed[id] = time.Now()
	s.mu.Unlock()
	return nil
}

// TransferLeadership hands this leader's leadership to voter id and
// returns once id leads (nothing to do when id is this server). A node
// that is no voter (a client node, a server not promoted yet) is refused
// with 409, one the cluster does not know with 404.
func (s *Server) TransferLeadership(id string) error {
	if !s.IsLeader() {
		return ErrNotLeader
	}
	if id == s.cfg.NodeID {
		return nil
	}
	f := s.raft.GetConfiguration()
	if err := s.wait(f); err != nil {
		return raftError("reading the raft configuration", err)
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) != id {
			continue
		}
		if srv.Suffrage != raft.Voter {
			return errorf(http.StatusConflict, "node %s is a Raft non-voter (not promoted yet): only voters can lead", id)
		}
		s.log.Info("transferring leadership", zap.String("to", id))
		if err := s.wait(s.raft.LeadershipTransferToServer(srv.ID, srv.Address)); err != nil {
			if strings.Contains(err.Error(), "leadership transfer timeout") {
				// Raft gave up: the node did not win an election within
				// a term (a busy host, a slow link). This server leads
				// on; the transfer may be asked again.
				return fmt.Errorf("%w: to node %s", ErrTransferTimeout, id)
			}
			return raftError("leadership transfer", err)
		}
		return nil
	}
	known := false
	s.fsm.View(func(st *State) { _, known = st.Nodes[id] })
	if known {
		return errorf(http.StatusConflict, "node %s holds no Raft vote (a client node): only servers can lead", id)
	}
	return errorf(http.StatusNotFound, "node %q not found", id)
}

// DeregisterNode deletes node id from the state (nothing when it is not
// there: it was only in Raft, or an earlier try deleted it).
func (s *Server) DeregisterNode(id string) error {
	err := s.Apply(DeregisterNodeType, DeregisterNodeRequest{ID: id}, applyTimeout)
	if e, ok := err.(*Error); ok && e.Code == http.StatusNotFound {
		return nil
	}
	return err
}

// ErrTransferTimeout is a leadership transfer Raft gave up on: the node
// asked to lead did not win an election within a term. The leader stays;
// the transfer may be asked again.
var ErrTransferTimeout = &Error{Code: http.StatusServiceUnavailable, Msg: "the leadership transfer timed out (the node did not win an election within a term, as on a busy host); the leader stays, ask again"}

// raftError is err of a Raft operation on the leader: ErrNotLeader when
// leadership was lost (a caller may try again on the next leader).
func raftError(what string, err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return ErrNotLeader
	}
	return fmt.Errorf("%s: %w", what, err)
}
