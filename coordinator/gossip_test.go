package coordinator

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"shoal/transport"
)

// TestGossipIsNoAuthority: gossip may list any member with any ID, name,
// role, address and capacity (any holder of the gossip key can). The
// leader registers, plans on and adds to Raft only what a member's
// certificate proves: a client node that gossips a fake server, claims to
// be a server or takes a server's name, and a phantom with no certificate
// claiming 4,000 GiB, change nothing but the client's own record, which
// keeps its certificate's name and role.
func TestGossipIsNoAuthority(t *testing.T) {
	c := newTestCluster(t)
	c.add(1)
	l := c.leader(10 * time.Second)

	ident, err := transport.SelfIssueNamed(c.ca, "client-id", "mallory", transport.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident, HandshakeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	var raftStreams atomic.Int32
	ep.Handle(transport.KindRaft, func(s *transport.Stream) { raftStreams.Add(1); s.Close() })
	addr := ep.Addr().String()
	huge := Capabilities{MemTotal: 4000 << 30, MemFree: 4000 << 30, Cores: 512, GFLOPS: 1e6, MemGBps: 1e4}

	// The client itself, claiming a server's role and the leader's name.
	c.members.set(Member{ID: "client-id", Name: l.id, Role: RoleServer, RPCAddr: addr, Status: StatusAlive,
		Caps: Capabilities{MemTotal: 8 << 30, MemFree: 8 << 30, Cores: 4}})
	// A server it made up, at its own address.
	c.members.set(Member{ID: "rogue-server", Name: "rogue", Role: RoleServer, RPCAddr: addr, Status: StatusAlive, Caps: huge})
	// A phantom: no endpoint at all.
	c.members.set(Member{ID: "phantom", Name: "phantom", Role: RoleClient, RPCAddr: "127.0.0.1:9", Status: StatusAlive, Caps: huge})
	// Another server's ID at the client's address.
	c.members.set(Member{ID: "node-9", Name: "node-9", Role: RoleServer, RPCAddr: addr, Status: StatusAlive, Caps: huge})

	waitFor(t, 10*time.Second, "the client registered", func() bool {
		n := l.srv.FSM().State().Nodes["client-id"]
		return n != nil
	})
	time.Sleep(15 * c.servers[0].srv.cfg.ReconcileInterval) // several passes with every fake listed
	st := l.srv.FSM().State()
	n := st.Nodes["client-id"]
	if n.Name != "mallory" || n.Role != RoleClient {
		t.Errorf("the client is registered as %q role %q, want its certificate's mallory, client", n.Name, n.Role)
	}
	for _, id := range []string{"rogue-server", "phantom", "node-9"} {
		if _, ok := st.Nodes[id]; ok {
			t.Errorf("gossip alone registered %s", id)
		}
	}
	if len(st.Nodes) != 2 {
		t.Errorf("%d nodes in the state, want the server and the client", len(st.Nodes))
	}
	f := l.srv.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	for _, s := range f.Configuration().Servers {
		if s.ID != raft.ServerID(l.id) {
			t.Errorf("raft configuration has %s at %s", s.ID, s.Address)
		}
	}
	if n := raftStreams.Load(); n != 0 {
		t.Errorf("the client's endpoint got %d raft streams", n)
	}
}

// TestLivenessWhileCertifying: a leader that has not certified a node
// registered before (a new leader; under load leadership moves faster than
// certifications end) writes gossip's liveness for it meanwhile, so the
// node is not left suspect and planned around; once this leader's
// certification of it failed, gossip may still make it suspect, never
// alive.
func TestLivenessWhileCertifying(t *testing.T) {
	c := newTestCluster(t)
	c.add(1)
	l := c.leader(10 * time.Second)
	status := func() NodeStatus {
		if n := l.srv.FSM().State().Nodes["w"]; n != nil {
			return n.Status
		}
		return ""
	}
	w := Member{ID: "w", Name: "w", Role: RoleClient, Status: StatusAlive, Caps: Capabilities{MemTotal: 8 << 30, MemFree: 8 << 30, Cores: 4}}
	c.members.set(w) // no RPC address: the test vouches for it
	waitFor(t, 10*time.Second, "w registered alive", func() bool { return status() == StatusAlive })
	c.members.setStatus("w", StatusSuspect)
	waitFor(t, 10*time.Second, "w suspect", func() bool { return status() == StatusSuspect })

	// The leader forgets its certification (as a new leader has none) and
	// gossip's hint for w changes to one whose certification waits.
	gate := make(chan struct{})
	blockedCerts.Store("blocked:w", gate)
	defer blockedCerts.Delete("blocked:w")
	l.srv.certs.mu.Lock()
	delete(l.srv.certs.entries, "w")
	l.srv.certs.mu.Unlock()
	w.RPCAddr = "blocked:w"
	c.members.set(w)
	waitFor(t, 10*time.Second, "w alive again while its certification is under way", func() bool { return status() == StatusAlive })
	if n := l.srv.FSM().State().Nodes["w"]; n.RPCAddr != "" {
		t.Errorf("w's address is %q: an unproven hint was written", n.RPCAddr)
	}

	close(gate) // the certification fails
	waitFor(t, 10*time.Second, "w's certification refused", func() bool {
		l.srv.certs.mu.Lock()
		defer l.srv.certs.mu.Unlock()
		e := l.srv.certs.entries["w"]
		return e != nil && !e.running && e.err != nil
	})
	c.members.setStatus("w", StatusSuspect)
	waitFor(t, 10*time.Second, "w suspect after its refusal", func() bool { return status() == StatusSuspect })
	c.members.setStatus("w", StatusAlive)
	time.Sleep(10 * l.srv.cfg.ReconcileInterval)
	if st := status(); st != StatusSuspect {
		t.Errorf("w is %s: a node that failed its certification turned alive on gossip's word", st)
	}
}
