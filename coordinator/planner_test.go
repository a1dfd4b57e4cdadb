package coordinator

import (
	"fmt"
	"testing"
	"time"

	"shoal/placement"
)

// TestNewLeaderKeepsPlan: a leader that takes over keeps a plan the last
// leader decided on the same nodes, links and settings (moving a healthy
// plan's driver ends the requests running on it); when the nodes change,
// it plans again.
func TestNewLeaderKeepsPlan(t *testing.T) {
	c := newTestCluster(t)
	for range 3 {
		c.add(3)
	}
	// Three workers, each too small for the 16 MiB model alone.
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("w%d", i)
		c.members.set(Member{ID: id, Name: id, Role: RoleClient, Status: StatusAlive,
			Caps: Capabilities{MemTotal: 16 << 20, MemFree: 16 << 20, Cores: 2, GFLOPS: 100, MemGBps: 10}})
	}
	l := c.leader(10 * time.Second)
	upsertTwoNodeModel(t, l)
	var v1 *placement.Plan
	defer func() {
		if t.Failed() {
			st := c.leader(5 * time.Second).srv.fsm.State()
			t.Logf("model %+v; %d nodes", st.Models["m"], len(st.Nodes))
		}
	}()
	waitFor(t, 10*time.Second, "the first plan", func() bool {
		st := c.leader(5 * time.Second).srv.fsm.State()
		v1 = st.Plans["m"]
		return v1 != nil && len(v1.Pools) > 0 && st.Models["m"].Status == ModelPlanned
	})
	nodes := v1.Nodes()
	if len(nodes) != 2 {
		t.Fatalf("the plan is on %v, want two workers", nodes)
	}
	// The link between the plan's nodes is measured slow (the first
	// measurement since it was planned): the leader weighs the plan on it
	// and moves it to a pair of nodes whose link nobody measured slow.
	slow := []LinkStat{{From: nodes[0], To: nodes[1], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()},
		{From: nodes[1], To: nodes[0], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()}}
	if err := l.srv.Apply(LinkReportType, LinkReportRequest{Links: slow}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a re-plan off the slow link", func() bool {
		p := c.leader(5 * time.Second).srv.fsm.State().Plans["m"]
		return p != nil && p.Version > v1.Version
	})
	time.Sleep(500 * time.Millisecond) // let it settle
	l = c.leader(5 * time.Second)
	v1 = l.srv.fsm.State().Plans["m"]
	nodes = v1.Nodes()
	// The leader stops: the new one reads the same links and nodes, and
	// keeps the plan.
	c.stop(l)
	nl := c.leader(10 * time.Second)
	time.Sleep(time.Second) // ten planning passes of the new leader
	if p := nl.srv.fsm.State().Plans["m"]; p.Version != v1.Version {
		t.Fatalf("the new leader re-planned an unchanged cluster: v%d on %v (was v%d on %v)", p.Version, p.Nodes(), v1.Version, nodes)
	}
	// A node of the plan fails: the new leader plans again.
	c.members.set(Member{ID: nodes[0], Name: nodes[0], Role: RoleClient, Status: StatusFailed,
		Caps: Capabilities{MemTotal: 16 << 20, MemFree: 16 << 20, Cores: 2, GFLOPS: 100, MemGBps: 10}})
	waitFor(t, 10*time.Second, "a re-plan after a node of the plan failed", func() bool {
		p := c.leader(5 * time.Second).srv.fsm.State().Plans["m"]
		return p != nil && p.Version > v1.Version
	})
}

// TestSlowerLinkReplans: links measured when a model was planned are part
// of what it was planned on. A link between two of its nodes measured a
// step slower (a throttled port, a cable swapped for Wi-Fi) weighs the plan
// again, and it moves off that link; noise within a step does not.
func TestSlowerLinkReplans(t *testing.T) {
	c := newTestCluster(t)
	for range 3 {
		c.add(3)
	}
	ids := []string{"w1", "w2", "w3"}
	for _, id := range ids {
		c.members.set(Member{ID: id, Name: id, Role: RoleClient, Status: StatusAlive,
			Caps: Capabilities{MemTotal: 16 << 20, MemFree: 16 << 20, Cores: 2, GFLOPS: 100, MemGBps: 10}})
	}
	l := c.leader(10 * time.Second)
	report := func(gbit map[[2]string]float64) {
		t.Helper()
		var links []LinkStat
		for _, a := range ids {
			for _, b := range ids {
				if a != b {
					g, ok := gbit[[2]string{a, b}]
					if !ok {
						g = 10
					}
					links = append(links, LinkStat{From: a, To: b, Gbit: g, LatencyMs: 0.1, MeasuredAt: time.Now()})
				}
			}
		}
		if err := c.leader(5*time.Second).srv.Apply(LinkReportType, LinkReportRequest{Links: links}, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	report(nil)
	upsertTwoNodeModel(t, l)
	var v1 *placement.Plan
	waitFor(t, 10*time.Second, "the first plan", func() bool {
		st := c.leader(5 * time.Second).srv.fsm.State()
		v1 = st.Plans["m"]
		return v1 != nil && len(v1.Pools) > 0 && st.Models["m"].Status == ModelPlanned
	})
	nodes := v1.Nodes()
	if len(nodes) != 2 {
		t.Fatalf("the plan is on %v, want two workers", nodes)
	}
	a, b := nodes[0], nodes[1]
	// Noise: 12 Gbit/s instead of 10 is the same step.
	report(map[[2]string]float64{{a, b}: 12, {b, a}: 12})
	time.Sleep(time.Second)
	if p := c.leader(5 * time.Second).srv.fsm.State().Plans["m"]; p.Version != v1.Version {
		t.Fatalf("re-planned on link noise: v%d on %v", p.Version, p.Nodes())
	}
	// The link between the plan's nodes drops to 10 Mbit/s.
	report(map[[2]string]float64{{a, b}: 0.01, {b, a}: 0.01})
	var v2 *placement.Plan
	waitFor(t, 10*time.Second, "a re-plan after the link slowed", func() bool {
		v2 = c.leader(5 * time.Second).srv.fsm.State().Plans["m"]
		return v2 != nil && v2.Version > v1.Version
	})
	now := v2.Nodes()
	if len(now) == 2 && ((now[0] == a && now[1] == b) || (now[0] == b && now[1] == a)) {
		t.Fatalf("the new plan v%d is still on the slow link %v", v2.Version, now)
	}
	if v2.Cost.MsPerToken > v1.Cost.MsPerToken*1.5 {
		t.Fatalf("the new plan predicts %.2f ms/token, the first %.2f", v2.Cost.MsPerToken, v1.Cost.MsPerToken)
	}
}

// upsertTwoNodeModel loads model "m", 16 MiB planned as a pipeline: it
// needs two of the 16 MiB workers.
func upsertTwoNodeModel(t *testing.T, l *testServer) {
	t.Helper()
	prof := placement.ModelProfile{Name: "m", Arch: "llama", NLayer: 8, NEmbd: 256, NHead: 4, NHeadKV: 4, HeadDim: 64, NVocab: 512,
		FFNDim: 768, HeadUnit: 1, FFNUnit: 32, KVBytesPerToken: 2048}
	for range prof.NLayer {
		prof.Layers = append(prof.Layers, placement.LayerProfile{AttnBytes: 512 << 10, FFNBytes: 1536 << 10, AttnFLOPs: 2 << 20, FFNFLOPs: 4 << 20})
	}
	model := Model{Name: "m", Digest: "d", Profile: &prof, Ctx: 64, MaxSeqs: 1, Overhead: 1 << 20, Strategy: string(placement.Pipeline)}
	if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: model}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
}
