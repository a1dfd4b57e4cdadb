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
