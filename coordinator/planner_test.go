package coordinator

import (
	"fmt"
	"testing"
	"time"

	"shoal/placement"
)

// TestNewLeaderKeepsPlan: a leader that takes over keeps a plan the last
// leader decided on the same nodes and settings, although the links it
// reads now make another plan faster (moving a healthy plan's driver ends
// the requests running on it); when the nodes change, it plans again.
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
	prof := placement.ModelProfile{Name: "m", Arch: "llama", NLayer: 8, NEmbd: 256, NHead: 4, NHeadKV: 4, HeadDim: 64, NVocab: 512,
		FFNDim: 768, HeadUnit: 1, FFNUnit: 32, KVBytesPerToken: 2048}
	for range prof.NLayer {
		prof.Layers = append(prof.Layers, placement.LayerProfile{AttnBytes: 512 << 10, FFNBytes: 1536 << 10, AttnFLOPs: 2 << 20, FFNFLOPs: 4 << 20})
	}
	model := Model{Name: "m", Digest: "d", Profile: &prof, Ctx: 64, MaxSeqs: 1, Overhead: 1 << 20, Strategy: string(placement.Pipeline)}
	if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: model}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
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
	// The link between the plan's nodes is measured slow: any other pair
	// is now much faster. The leader does not re-plan on links alone.
	slow := []LinkStat{{From: nodes[0], To: nodes[1], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()},
		{From: nodes[1], To: nodes[0], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()}}
	if err := l.srv.Apply(LinkReportType, LinkReportRequest{Links: slow}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	c.stop(l)
	nl := c.leader(10 * time.Second)
	time.Sleep(time.Second) // ten planning passes of the new leader
	if p := nl.srv.fsm.State().Plans["m"]; p.Version != v1.Version {
		t.Fatalf("the new leader re-planned an unchanged cluster: v%d on %v (was v%d on %v)", p.Version, p.Nodes(), v1.Version, nodes)
	}
	// A worker joins: the inputs changed, and the plan moves off the slow
	// link.
	c.members.set(Member{ID: "w4", Name: "w4", Role: RoleClient, Status: StatusAlive,
		Caps: Capabilities{MemTotal: 16 << 20, MemFree: 16 << 20, Cores: 2, GFLOPS: 100, MemGBps: 10}})
	waitFor(t, 10*time.Second, "a re-plan after a node joined", func() bool {
		p := c.leader(5 * time.Second).srv.fsm.State().Plans["m"]
		return p != nil && p.Version > v1.Version
	})
}
