package coordinator

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// moveTo restarts s from its data dir (same node ID) on a new QUIC address,
// as a Kubernetes or Docker server does when its pod comes back with a new
// IP; gossip then advertises the new address. The address is one no
// server used before, so a stale configuration entry cannot reach anyone.
func (c *testCluster) moveTo(s *testServer, used map[string]bool) {
	c.t.Helper()
	for i := 0; ; i++ {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			c.t.Fatal(err)
		}
		a := pc.LocalAddr().String()
		pc.Close()
		if !used[a] {
			s.addr = a
			break
		}
		if i > 100 {
			c.t.Fatal("no unused port")
		}
	}
	c.start(s)
	used[s.addr] = true
}

// applyRetry writes a model through whichever server leads, retrying
// through elections.
func (c *testCluster) applyRetry(name string, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := c.leader(time.Until(deadline))
		err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: name}}, 2*time.Second)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("write %s: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func hasModel(s *Server, name string) bool {
	ok := false
	s.FSM().View(func(st *State) { _, ok = st.Models[name] })
	return ok
}

// serverAt reports whether s's Raft configuration holds id as a voter at addr.
func serverAt(s *Server, id, addr string) bool {
	servers, err := s.Servers()
	if err != nil {
		return false
	}
	for _, x := range servers {
		if x.ID == id {
			return x.Voter && x.Address == addr
		}
	}
	return false
}

// TestServerMovedRejoins: a follower restarted with its data dir on a new
// address is reached there, its address in the configuration is updated
// (it stays a voter) and it applies what is written after the move.
func TestServerMovedRejoins(t *testing.T) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		c.add(3)
	}
	l := c.leader(10 * time.Second)
	waitFor(t, 5*time.Second, "3 voters", func() bool { v, _ := voters(l.srv); return v == 3 })
	c.applyRetry("before", 5*time.Second)
	used := map[string]bool{}
	var moved *testServer
	for _, s := range c.servers {
		used[s.addr] = true
		if s != l && moved == nil {
			moved = s
		}
	}
	old := moved.addr
	c.stop(moved)
	c.moveTo(moved, used)
	t.Logf("%s moved from %s to %s", moved.id, old, moved.addr)

	c.applyRetry("after", 5*time.Second)
	waitFor(t, 15*time.Second, "the moved server to apply a write made after the move", func() bool {
		return hasModel(moved.srv, "after") && hasModel(moved.srv, "before")
	})
	waitFor(t, 10*time.Second, "the moved server as a voter at its new address", func() bool {
		l := c.leader(5 * time.Second)
		return serverAt(l.srv, moved.id, moved.addr)
	})
	waitFor(t, 5*time.Second, "the moved server to follow a leader and know its own new address", func() bool {
		id, _ := moved.srv.Leader()
		return id != "" && serverAt(moved.srv, moved.id, moved.addr)
	})
	if v, nv := voters(c.leader(5 * time.Second).srv); v != 3 || nv != 0 {
		t.Fatalf("%d voters %d non-voters, want 3+0", v, nv)
	}
}

// TestAllServersMovedElectLeader: every server restarted with its data
// dir on a new address, so each one's configuration lists the others at
// addresses nobody listens on. They find each other by ID through gossip,
// elect a leader, keep their state, and the configuration converges on
// the new addresses.
func TestAllServersMovedElectLeader(t *testing.T) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		c.add(3)
	}
	l := c.leader(10 * time.Second)
	waitFor(t, 5*time.Second, "3 voters", func() bool { v, _ := voters(l.srv); return v == 3 })
	c.applyRetry("before", 5*time.Second)
	waitFor(t, 5*time.Second, "every server to apply the write", func() bool {
		for _, s := range c.servers {
			if !hasModel(s.srv, "before") {
				return false
			}
		}
		return true
	})
	used := map[string]bool{}
	for _, s := range c.servers {
		used[s.addr] = true
	}
	for _, s := range c.servers {
		c.stop(s)
	}
	start := time.Now()
	for _, s := range c.servers {
		c.moveTo(s, used)
	}
	l = c.leader(30 * time.Second)
	t.Logf("%s leads %s after all servers moved", l.id, time.Since(start).Round(time.Millisecond))
	c.applyRetry("after", 10*time.Second)
	// A restarted server applies its log once it learns the commit index.
	waitFor(t, 10*time.Second, "every server to hold the writes made before and after the move", func() bool {
		for _, s := range c.servers {
			if !hasModel(s.srv, "before") || !hasModel(s.srv, "after") {
				return false
			}
		}
		return true
	})
	waitFor(t, 10*time.Second, "every server's configuration to list the new addresses", func() bool {
		for _, s := range c.servers {
			for _, o := range c.servers {
				if !serverAt(s.srv, o.id, o.addr) {
					return false
				}
			}
		}
		return true
	})
}

// TestAddrResolverPrecedence: alive in gossip beats the committed state,
// which beats gossip's record of a failed node; an ID known nowhere (here
// there is no Raft configuration either) is an error, and the transport
// then uses the configured address.
func TestAddrResolverPrecedence(t *testing.T) {
	m := newFakeMembers()
	fsm := NewFSM()
	idx := uint64(0)
	register := func(id, addr string) {
		b, err := Encode(RegisterNodeType, RegisterNodeRequest{Node: Node{ID: id, Name: id, Role: RoleServer, RPCAddr: addr, Status: StatusAlive}, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		idx++
		if r := fsm.Apply(&raft.Log{Type: raft.LogCommand, Index: idx, Data: b}); r != nil {
			if err, ok := r.(error); ok {
				t.Fatal(err)
			}
		}
	}
	r := newAddrResolver(m, fsm, zap.NewNop())
	check := func(id, want string) {
		t.Helper()
		r.mu.Lock()
		r.addrs = nil // no TTL in the way
		r.mu.Unlock()
		got, err := r.ServerAddr(raft.ServerID(id))
		if want == "" {
			if err == nil {
				t.Fatalf("%s: got %q, want an error", id, got)
			}
			return
		}
		if err != nil || string(got) != want {
			t.Fatalf("%s: got %q, %v; want %q", id, got, err, want)
		}
	}
	check("a", "")
	m.set(Member{ID: "a", Role: RoleServer, RPCAddr: "10.0.0.1:1", Status: StatusFailed})
	check("a", "a@10.0.0.1:1")
	register("a", "10.0.0.2:1")
	check("a", "a@10.0.0.2:1")
	m.set(Member{ID: "a", Role: RoleServer, RPCAddr: "10.0.0.3:1", Status: StatusSuspect})
	check("a", "a@10.0.0.3:1")
	m.set(Member{ID: "a", Role: RoleServer, RPCAddr: "10.0.0.4:1", Status: StatusAlive})
	check("a", "a@10.0.0.4:1")
	for i := 0; i < 3; i++ {
		check(fmt.Sprintf("b%d", i), "")
	}
}
