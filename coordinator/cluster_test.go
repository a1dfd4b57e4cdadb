package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"shoal/internal/version"
	"shoal/transport"
)

// fakeMembers is a scripted gossip view.
type fakeMembers struct {
	mu      sync.Mutex
	members map[string]Member
	ev      chan struct{}
}

func newFakeMembers() *fakeMembers {
	return &fakeMembers{members: map[string]Member{}, ev: make(chan struct{}, 1)}
}

func (f *fakeMembers) Members() []Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Member
	for _, m := range f.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (f *fakeMembers) Events() <-chan struct{} { return f.ev }

func (f *fakeMembers) set(m Member) {
	f.mu.Lock()
	f.members[m.ID] = m
	f.mu.Unlock()
	select {
	case f.ev <- struct{}{}:
	default:
	}
}

func (f *fakeMembers) setStatus(id string, st NodeStatus) {
	f.mu.Lock()
	m := f.members[id]
	m.Status = st
	f.mu.Unlock()
	f.set(m)
}

type testServer struct {
	snaps uint64        // SnapshotThreshold (0: 16)
	slow  time.Duration // how long its FSM takes over each command
	// protocols is the window it speaks (zero: this build's): a server
	// of another build.
	protocols version.Window
	id        string
	dir       string
	addr      string
	expect    int
	ep        *transport.Endpoint
	srv       *Server
}

type testCluster struct {
	t       *testing.T
	base    string
	ca      *transport.CA
	members *fakeMembers

	// servers and their srv fields are written by the test and read by
	// the servers' bootstrap goroutines (PeerHasState): under mu.
	mu      sync.Mutex
	servers []*testServer
}

func newTestCluster(t *testing.T) *testCluster {
	ca, err := transport.DeriveCA("coordinator-test-secret")
	if err != nil {
		t.Fatal(err)
	}
	// The base dir is created before the stop cleanup, so it is removed
	// only after every server has stopped writing to it.
	c := &testCluster{t: t, base: t.TempDir(), ca: ca, members: newFakeMembers()}
	t.Cleanup(func() {
		for _, s := range c.servers {
			c.stop(s)
		}
	})
	return c
}

func (c *testCluster) add(expect int) *testServer {
	id := fmt.Sprintf("node-%d", len(c.servers))
	s := &testServer{id: id, dir: filepath.Join(c.base, id), addr: "127.0.0.1:0", expect: expect}
	c.addServer(s)
	c.start(s)
	return s
}

func (c *testCluster) addServer(s *testServer) {
	c.mu.Lock()
	c.servers = append(c.servers, s)
	c.mu.Unlock()
}

// running returns the server with this ID, nil if it is stopped or unknown.
func (c *testCluster) running(id string) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.servers {
		if o.id == id {
			return o.srv
		}
	}
	return nil
}

func (c *testCluster) start(s *testServer) {
	c.t.Helper()
	if err := c.tryStart(s); err != nil {
		c.t.Fatal(err)
	}
}

// tryStart starts s, or returns why its server did not start.
func (c *testCluster) tryStart(s *testServer) error {
	ident, err := transport.SelfIssue(c.ca, s.id, transport.RoleServer)
	if err != nil {
		return err
	}
	var ep *transport.Endpoint
	for i := 0; i < 20; i++ { // the old port may linger for a moment
		ep, err = transport.Listen(transport.Config{Bind: s.addr, Identity: ident, IdleTimeout: 3 * time.Second, HandshakeTimeout: time.Second, Protocols: s.protocols})
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	s.ep = ep
	s.addr = ep.Addr().String()
	srv, err := NewServer(Config{
		NodeID: s.id, DataDir: s.dir, Layer: transport.NewRaftLayer(ep, ep.Addr()), Members: c.members,
		Bootstrap:        s.expect,
		HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond, LeaderLeaseTimeout: 100 * time.Millisecond,
		ReconcileInterval: 100 * time.Millisecond, ServerStabilization: 200 * time.Millisecond, DeadServerGrace: time.Second,
		SnapshotThreshold: cmp.Or(s.snaps, 16), SnapshotInterval: 200 * time.Millisecond,
		Certify: certifyByPeer(ep), Protocols: s.protocols,
		fsmHook: func() { time.Sleep(s.slow) },
		PeerHasState: func(ctx context.Context, m Member) (bool, error) {
			if o := c.running(m.ID); o != nil {
				return o.HasState(), nil
			}
			return false, fmt.Errorf("no server %s", m.ID)
		},
	})
	if err != nil {
		ep.Close()
		s.ep = nil
		return err
	}
	c.mu.Lock()
	s.srv = srv
	c.mu.Unlock()
	c.members.set(Member{ID: s.id, Name: s.id, Role: RoleServer, RPCAddr: s.addr, Status: StatusAlive, Expect: s.expect,
		Protocol: cmp.Or(s.protocols, version.This).Max})
	return nil
}

// blockedCerts holds, by RPC address, the certifications that wait for
// their channel to close and then fail.
var blockedCerts sync.Map

// certifyByPeer certifies a gossip member by the certificate at its RPC
// address (the agent also asks the node for its capacities; these tests
// take gossip's). A certificate without a name keeps gossip's name. A
// member without an RPC address stands for a node these tests do not run
// (a worker with made-up capacities): the test vouches for it.
func certifyByPeer(ep *transport.Endpoint) func(ctx context.Context, m Member) (Member, error) {
	return func(ctx context.Context, m Member) (Member, error) {
		if m.RPCAddr == "" {
			return m, nil
		}
		if gate, ok := blockedCerts.Load(m.RPCAddr); ok {
			<-gate.(chan struct{}) // a certification still under way, until the test ends it
			return Member{}, fmt.Errorf("%s proved no identity", m.RPCAddr)
		}
		p, err := ep.PeerAt(ctx, m.RPCAddr)
		if err != nil {
			return Member{}, err
		}
		got := m
		got.ID, got.Role = p.ID, p.Role
		if p.Name != "" {
			got.Name = p.Name
		}
		return got, nil
	}
}

func (c *testCluster) stop(s *testServer) {
	if s.srv == nil {
		return
	}
	c.members.setStatus(s.id, StatusFailed)
	_ = s.srv.Shutdown()
	_ = s.ep.Close()
	c.mu.Lock()
	s.srv, s.ep = nil, nil
	c.mu.Unlock()
}

func (c *testCluster) leader(timeout time.Duration) *testServer {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, s := range c.servers {
			if s.srv != nil && s.srv.IsLeader() {
				return s
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("no leader")
	return nil
}

// onLeader runs f on the server that leads now, and again on the next
// one while f finds that it lost the leadership: on a loaded host the
// short election timeouts of these tests end terms between finding the
// leader and using it.
func (c *testCluster) onLeader(f func(l *testServer) error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f(c.leader(10 * time.Second))
		if err == nil || !LeaderMissing(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// apply applies a command through the leader, on the next one when
// leadership moves meanwhile (a test's 150 ms terms end on a loaded
// host): a failure for any other reason fails the test.
func (c *testCluster) apply(t *testing.T, typ MessageType, req any) {
	t.Helper()
	if err := c.onLeader(func(l *testServer) error { return l.srv.Apply(typ, req, 2*time.Second) }); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func voters(s *Server) (v, nv int) {
	servers, err := s.Servers()
	if err != nil {
		return 0, 0
	}
	for _, x := range servers {
		if x.Voter {
			v++
		} else {
			nv++
		}
	}
	return
}

// TestApplyWhileKillingServers applies commands while servers are stopped
// and restarted from their data dirs; at the end every server holds the
// same state and no acknowledged command is missing.
func TestApplyWhileKillingServers(t *testing.T) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		c.add(3)
	}
	c.leader(10 * time.Second)

	var acked []string
	var down *testServer
	deadline := time.Now().Add(40 * time.Second)
	for i := 0; i < 120 && time.Now().Before(deadline); i++ {
		switch {
		case i%30 == 10: // stop a server: every other time the leader
			l := c.leader(5 * time.Second)
			victim := l
			if (i/30)%2 == 1 {
				for _, s := range c.servers {
					if s != l {
						victim = s // a follower
						break
					}
				}
			}
			t.Logf("cmd %d: stopping %s (leader=%v)", i, victim.id, victim.srv.IsLeader())
			c.stop(victim)
			down = victim
		case i%30 == 25 && down != nil:
			t.Logf("cmd %d: restarting %s", i, down.id)
			c.start(down)
			down = nil
		}
		name := fmt.Sprintf("m-%03d", i)
		l := c.leader(5 * time.Second)
		if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: name}}, 2*time.Second); err == nil {
			acked = append(acked, name)
		} else {
			t.Logf("cmd %d not acknowledged: %v", i, err)
		}
	}
	if down != nil {
		c.start(down)
	}
	if len(acked) < 60 {
		t.Fatalf("only %d commands acknowledged", len(acked))
	}
	l := c.leader(5 * time.Second)
	if err := l.srv.Raft().Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	want := l.srv.FSM().State().Index
	waitFor(t, 10*time.Second, "all servers to apply the last index", func() bool {
		for _, s := range c.servers {
			if s.srv.FSM().State().Index < want {
				return false
			}
		}
		return true
	})
	// Reconcile may still be writing node records; compare models, and the
	// whole state at one index.
	ref := l.srv.FSM().State()
	for _, name := range acked {
		if _, ok := ref.Models[name]; !ok {
			t.Errorf("acknowledged command %s lost", name)
		}
	}
	for _, s := range c.servers {
		st := s.srv.FSM().State()
		if !reflect.DeepEqual(st.Models, ref.Models) {
			t.Errorf("%s models differ from the leader's (%d vs %d)", s.id, len(st.Models), len(ref.Models))
		}
	}
	// Stop the writers and compare complete states.
	for _, s := range c.servers {
		c.members.setStatus(s.id, StatusAlive)
	}
	waitFor(t, 10*time.Second, "identical states", func() bool {
		var first *State
		for _, s := range c.servers {
			st := s.srv.FSM().State()
			if first == nil {
				first = st
			} else if !reflect.DeepEqual(first, st) {
				return false
			}
		}
		return true
	})
	t.Logf("%d acknowledged commands, final index %d, all %d servers identical", len(acked), want, len(c.servers))
}

// TestVoterManagement: late servers join as non-voters, are promoted in
// pairs to keep an odd voter count, removal and dead voters keep it odd.
func TestVoterManagement(t *testing.T) {
	c, l := threeVotersAndOne(t)
	time.Sleep(500 * time.Millisecond) // past stabilization: still 3 voters, 4 would be even
	if v, nv := voters(l.srv); v != 3 || nv != 1 {
		t.Fatalf("after stabilization: %d voters %d non-voters, want 3+1", v, nv)
	}
	c.add(0)
	waitFor(t, 5*time.Second, "5 voters", func() bool { v, nv := voters(l.srv); return v == 5 && nv == 0 })

	// Removing a voter leaves 4: one is demoted to keep 3.
	var victim *testServer
	for _, s := range c.servers {
		if s != l {
			victim = s
			break
		}
	}
	if err := c.onLeader(func(l *testServer) error {
		if l == victim {
			// It took over meanwhile: hand the leadership to a voter
			// of the first three, and let that one remove it.
			to := c.servers[0]
			if to == victim {
				to = c.servers[1]
			}
			if err := l.srv.TransferLeadership(to.id); err != nil {
				return err
			}
			return ErrNotLeader
		}
		return l.srv.RemoveNode(victim.id)
	}); err != nil {
		t.Fatal(err)
	}
	c.stop(victim)
	l = c.leader(10 * time.Second)
	waitFor(t, 5*time.Second, "3 voters + 1 non-voter after removal", func() bool { v, nv := voters(l.srv); return v == 3 && nv == 1 })
	if err := c.onLeader(func(l *testServer) error { return l.srv.RemoveNode("nobody") }); StatusCode(err) != 404 {
		t.Fatalf("remove unknown: %v", err)
	}

	// A voter that stays failed past the grace is replaced by the non-voter.
	servers, _ := l.srv.Servers()
	var deadID string
	for _, s := range servers {
		if s.Voter && !s.Leader {
			deadID = s.ID
			break
		}
	}
	for _, s := range c.servers {
		if s.id == deadID {
			c.stop(s)
		}
	}
	waitFor(t, 10*time.Second, "dead voter replaced", func() bool {
		servers, _ := l.srv.Servers()
		v := 0
		for _, s := range servers {
			if s.ID == deadID {
				return false
			}
			if s.Voter {
				v++
			}
		}
		return v == 3
	})
	st := l.srv.FSM().State()
	if n := st.Nodes[deadID]; n == nil || n.Status != StatusFailed {
		t.Fatalf("dead node in state: %+v", n)
	}
	if _, ok := st.Nodes[victim.id]; ok {
		t.Fatal("removed node still in state")
	}
}

// threeVotersAndOne starts three servers that bootstrap together and a
// fourth that joins late, as a non-voter; it returns the cluster and its
// leader.
func threeVotersAndOne(t *testing.T) (*testCluster, *testServer) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		c.add(3)
	}
	l := c.leader(10 * time.Second)
	waitFor(t, 5*time.Second, "3 voters", func() bool { v, _ := voters(l.srv); return v == 3 })
	c.add(0)
	waitFor(t, 5*time.Second, "4th server as non-voter", func() bool { v, nv := voters(l.srv); return v == 3 && nv == 1 })
	return c, l
}

func StatusCode(err error) int { return transport.StatusOf(err) }

func TestLateServerDoesNotBootstrapAlone(t *testing.T) {
	c := newTestCluster(t)
	c.add(1)
	l := c.leader(10 * time.Second)
	// A second server also told to expect 1 must not form its own cluster:
	// it asks its peers first (the node wires this over RPC).
	late := &testServer{id: "late", dir: filepath.Join(c.base, "late"), addr: "127.0.0.1:0", expect: 1}
	c.addServer(late)
	c.start(late)
	waitFor(t, 5*time.Second, "late server added", func() bool { v, nv := voters(l.srv); return v+nv == 2 })
	time.Sleep(300 * time.Millisecond)
	if late.srv.IsLeader() {
		t.Fatal("late server leads a cluster of its own")
	}
	if id, _ := late.srv.Leader(); id != l.id {
		t.Fatalf("late server follows %q, want %q", id, l.id)
	}
}

// TestTransferLeadership: the leader hands its leadership to the voter an
// operator names, again and again (no election decides who wins); a
// non-voter, a client node, an unknown node and a follower asked to
// transfer are refused with the reason.
func TestTransferLeadership(t *testing.T) {
	c, l := threeVotersAndOne(t)
	c.members.set(Member{ID: "client-1", Name: "client-1", Role: RoleClient, Status: StatusAlive})
	waitFor(t, 5*time.Second, "the client node in the state", func() bool {
		_, ok := l.srv.FSM().State().Nodes["client-1"]
		return ok
	})

	for round := range 4 {
		l = c.leader(10 * time.Second)
		var to *testServer
		for _, s := range c.servers[:3] {
			if s != l {
				to = s
				if round%2 == 1 {
					break // the first follower on odd rounds, the last on even ones
				}
			}
		}
		// A follower asked to transfer refuses (one that took over since
		// it was found, as a loaded host ends terms, is skipped).
		for _, s := range c.servers[:3] {
			if s == l || s == to {
				continue
			}
			if err := s.srv.TransferLeadership(to.id); !s.srv.IsLeader() && !errors.Is(err, ErrNotLeader) {
				t.Fatalf("round %d: a follower asked to transfer: %v, want ErrNotLeader", round, err)
			}
		}
		// The leader hands it over; under load the new leader's term may
		// end at once, and the transfer is asked again.
		deadline := time.Now().Add(20 * time.Second)
		for !to.srv.IsLeader() {
			err := c.onLeader(func(l *testServer) error { return l.srv.TransferLeadership(to.id) })
			if err != nil && !errors.Is(err, ErrTransferTimeout) {
				t.Fatalf("round %d: transfer to %s: %v", round, to.id, err)
			}
			for wait := time.Now().Add(2 * time.Second); !to.srv.IsLeader() && time.Now().Before(wait); {
				time.Sleep(10 * time.Millisecond)
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %s never led", round, to.id)
			}
		}
		if err := to.srv.TransferLeadership(to.id); err != nil && !errors.Is(err, ErrNotLeader) {
			t.Fatalf("round %d: to itself: %v", round, err)
		}
	}
	for _, x := range []struct {
		id   string
		code int
	}{{c.servers[3].id, http.StatusConflict}, {"client-1", http.StatusConflict}, {"nobody", http.StatusNotFound}} {
		if err := c.onLeader(func(l *testServer) error { return l.srv.TransferLeadership(x.id) }); StatusCode(err) != x.code {
			t.Errorf("transfer to %s: %v, want status %d", x.id, err, x.code)
		}
	}
}

// TestRecoverFromLostMajority: three voters, two of them gone for good.
// The one left cannot elect itself; its recovery file names it alone, and
// on its next start it leads with the state it had, and the file is gone.
// A malformed file stops the start with an error naming the file.
func TestRecoverFromLostMajority(t *testing.T) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		c.add(3)
	}
	if err := c.onLeader(func(l *testServer) error {
		return l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "kept"}}, 5*time.Second)
	}); err != nil {
		t.Fatal(err)
	}
	left := c.servers[0]
	waitFor(t, 10*time.Second, "the model on the server that stays", func() bool {
		return left.srv.FSM().State().Models["kept"] != nil
	})
	for _, s := range c.servers {
		c.stop(s)
	}
	before, err := ReadStored(left.dir)
	if err != nil || before == nil || len(before.Servers) != 3 || before.LastIndex == 0 || before.LastTerm == 0 {
		t.Fatalf("stored: %+v, %v; want 3 servers and a log", before, err)
	}

	// Alone, without recovery: no leader.
	c.start(left)
	time.Sleep(2 * time.Second)
	if left.srv.IsLeader() {
		t.Fatal("one of three voters elected itself")
	}
	c.stop(left)

	if err := os.WriteFile(RecoveryPath(left.dir), []byte("[{\"id\": "), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.tryStart(left); err == nil || !strings.Contains(err.Error(), RecoveryPath(left.dir)) {
		t.Fatalf("a malformed recovery file: %v, want an error naming it", err)
	}

	if err := WriteRecovery(left.dir, []RecoveryEntry{{ID: left.id, Address: left.addr}}); err != nil {
		t.Fatal(err)
	}
	c.start(left)
	if l := c.leader(10 * time.Second); l != left {
		t.Fatalf("leader %s, want %s", l.id, left.id)
	}
	if left.srv.FSM().State().Models["kept"] == nil {
		t.Fatal("the recovered server lost the state it had")
	}
	if _, err := os.Stat(RecoveryPath(left.dir)); !os.IsNotExist(err) {
		t.Fatalf("the recovery file stays after it was applied: %v", err)
	}
	if err := left.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "after"}}, 5*time.Second); err != nil {
		t.Fatalf("the recovered cluster does not take commands: %v", err)
	}
	c.stop(left)
	after, err := ReadStored(left.dir)
	if err != nil || after == nil || len(after.Servers) != 1 || after.Servers[0].ID != left.id || !after.Servers[0].Voter {
		t.Fatalf("stored after recovery: %+v, %v", after, err)
	}
	if !after.After(before) {
		t.Fatalf("the log after recovery and a command (%d/%d) is not after the one before (%d/%d)", after.LastTerm, after.LastIndex, before.LastTerm, before.LastIndex)
	}
}
