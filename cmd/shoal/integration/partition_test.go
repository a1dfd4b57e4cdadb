//go:build integration

package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPartitionHeals cuts one of three agents off (iptables in its own
// namespace drops everything on its link) for 20 s and then for 120 s,
// long after memberlist stopped gossiping with the members it holds dead.
// Within 30 s of healing, every agent's own gossip view (members) has the
// three alive and every agent's status is healthy with three nodes: the
// agents join their failed members again in the background (#35).
func TestPartitionHeals(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("integration: iptables is not installed")
	}
	e := setup(t, 3)
	for _, p := range e.nodes {
		e.start(p)
	}
	e.waitHealthy(e.nodes[0], 3, 30*time.Second)
	cut := e.nodes[2]
	veth := fmt.Sprintf("v%d", len(e.nodes)-1)
	rule := func(op string) error {
		for _, r := range [][]string{{"INPUT", "-i"}, {"OUTPUT", "-o"}} {
			if err := run(t, "ip", "netns", "exec", cut.ns, "iptables", op, r[0], r[1], veth, "-j", "DROP"); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range []time.Duration{20 * time.Second, 120 * time.Second} {
		if err := rule("-A"); err != nil {
			t.Skipf("integration: iptables cannot drop in a namespace: %v", err)
		}
		t0 := time.Now()
		split := func() bool { return e.aliveIn(e.nodes[0]) == 2 && e.aliveIn(cut) == 1 }
		for !split() {
			if time.Since(t0) > d {
				t.Fatalf("%v partition: the sides never saw each other failed", d)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("partition of %v: both sides saw the other failed after %v", d, time.Since(t0).Round(100*time.Millisecond))
		time.Sleep(time.Until(t0.Add(d)))
		if err := rule("-D"); err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		for _, p := range e.nodes {
			for {
				var s status
				if e.aliveIn(p) == 3 && e.cli(p, &s, "status") == nil && s.Health == "healthy" && s.NodesAlive == 3 {
					break
				}
				if time.Since(healed) > 30*time.Second {
					var ms []member
					_ = e.cli(p, &ms, "members")
					t.Fatalf("%v partition: %s has not converged 30 s after healing: members %+v, status %+v", d, p.name, ms, s)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
		t.Logf("MEASURED partition of %s for %v: every agent's members and status converged %v after healing",
			cut.name, d, time.Since(healed).Round(100*time.Millisecond))
	}
}

type member struct {
	Name   string `json:"name"`
	Status string `json:"status"`
}

// aliveIn is how many members p's own gossip view holds alive (-1 when
// it cannot be asked).
func (e *env) aliveIn(p *proc) int {
	var ms []member
	if err := e.cli(p, &ms, "members"); err != nil {
		return -1
	}
	n := 0
	for _, m := range ms {
		if strings.EqualFold(m.Status, "alive") {
			n++
		}
	}
	return n
}
