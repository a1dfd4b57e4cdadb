package node_test

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	tc "shoal/node/nodetest"
)

// controlEvent reads one shoal_control_events_total series from member i.
func controlEvent(t *testing.T, c *tc.Cluster, i int, event string) int {
	t.Helper()
	body := get(t, "http://"+c.Members[i].Agent.HTTPAddr()+"/metrics")
	m := regexp.MustCompile(`shoal_control_events_total\{event="` + regexp.QuoteMeta(event) + `"\} (\d+)`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s counter in /metrics", event)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestControlMetrics: /metrics counts Raft's elections and leaderships
// and memberlist's suspicions, so a soak can show the control plane held:
// a leader's loss shows as an election and suspicions of it.
func TestControlMetrics(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	leader := c.Leader(10 * time.Second)
	other := (leader + 1) % 3
	if n := controlEvent(t, c, other, "raft.state.leader"); n < 1 {
		t.Fatalf("%d leaderships counted after a cluster formed", n)
	}
	elections := controlEvent(t, c, other, "raft.state.candidate")
	suspects := controlEvent(t, c, other, "memberlist.msg.suspect")
	c.Stop(leader, false)
	tc.Eventually(t, 15*time.Second, "an election and a suspicion counted", func() bool {
		return controlEvent(t, c, other, "raft.state.candidate") > elections && controlEvent(t, c, other, "memberlist.msg.suspect") > suspects
	})
}
