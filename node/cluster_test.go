package node_test

import (
	"context"
	"testing"
	"time"

	"shoal/api"
	tc "shoal/node/nodetest"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func nodeByName(t *testing.T, nodes []*api.Node, name string) *api.Node {
	t.Helper()
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// healthy waits until member i reports a leader, want voters and that many
// nodes alive.
func waitHealthy(t *testing.T, c *tc.Cluster, i, voters, alive int, timeout time.Duration) *api.Status {
	t.Helper()
	var st *api.Status
	tc.Eventually(t, timeout, "a healthy cluster", func() bool {
		s, err := c.Client(i, "").Status(ctx(t))
		if err != nil {
			return false
		}
		v := 0
		for _, srv := range s.Servers {
			if srv.Voter {
				v++
			}
		}
		st = s
		return s.Leader != "" && s.Health == "healthy" && v == voters && s.NodesAlive == alive
	})
	return st
}

// Must-show 1: three servers with --bootstrap-expect 3 form a cluster and
// `node ls` shows all three with probed capabilities.
func TestThreeServersFormCluster(t *testing.T) {
	start := time.Now()
	c := tc.New(t, 3)
	st := waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	t.Logf("cluster formation: %v (leader %s)", time.Since(start).Round(time.Millisecond), st.LeaderName)
	nodes, err := c.Client(1, "").Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	for _, n := range nodes {
		if n.Role != api.RoleServer || n.Status != api.StatusAlive {
			t.Errorf("%s: role %s status %s", n.Name, n.Role, n.Status)
		}
		if n.Caps.MemTotal == 0 || n.Caps.Cores == 0 || n.Caps.GFLOPS <= 0 || n.Caps.MemGBps <= 0 {
			t.Errorf("%s: capabilities not probed: %+v", n.Name, n.Caps)
		}
		if n.RPCAddr == "" || n.Addr == "" || n.HTTPAddr == "" {
			t.Errorf("%s: addresses missing: %+v", n.Name, n)
		}
	}
	members, err := c.Client(2, "").Members(ctx(t))
	if err != nil || len(members) != 3 {
		t.Fatalf("members: %d %v", len(members), err)
	}
}

// Must-show 2: after a crash of the leader a new one is elected and status
// answers from every survivor within 5 s; the dead node is marked failed
// and comes back under the same id when restarted from its data dir.
func TestLeaderCrashFailoverAndRejoin(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	li := c.Leader(5 * time.Second)
	oldID := c.Members[li].Agent.ID()
	killed := time.Now()
	c.Stop(li, false)

	var survivors []int
	for i := range c.Members {
		if i != li {
			survivors = append(survivors, i)
		}
	}
	deadline := killed.Add(5 * time.Second)
	for _, i := range survivors {
		for {
			s, err := c.Client(i, "").Status(ctx(t))
			if err == nil && s.Leader != "" && s.Leader != oldID {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no new leader within 5s (last: %+v, %v)", c.Members[i].Cfg.Name, s, err)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	t.Logf("failover: new leader answering on all survivors after %v", time.Since(killed).Round(time.Millisecond))

	tc.Eventually(t, 10*time.Second, "dead leader marked failed", func() bool {
		nodes, err := c.Client(survivors[0], "").Nodes(ctx(t))
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.ID == oldID {
				return n.Status == api.StatusFailed
			}
		}
		return false
	})
	t.Logf("dead node marked failed after %v", time.Since(killed).Round(time.Millisecond))

	restarted := time.Now()
	c.Restart(li)
	if got := c.Members[li].Agent.ID(); got != oldID {
		t.Fatalf("restarted with id %s, want %s", got, oldID)
	}
	waitHealthy(t, c, li, 3, 3, 15*time.Second)
	t.Logf("rejoin: healthy again %v after restart", time.Since(restarted).Round(time.Millisecond))
	nodes, _ := c.Client(li, "").Nodes(ctx(t))
	if len(nodes) != 3 {
		t.Fatalf("%d nodes after rejoin, want 3", len(nodes))
	}
}
