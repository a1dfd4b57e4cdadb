package coordinator

import (
	"errors"
	"slices"
	"strings"
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
	worker(c, StatusAlive, "w1", "w2", "w3")
	c.apply(t, ModelUpsertType, ModelUpsertRequest{Model: twoNodeModel()})
	defer func() {
		if t.Failed() {
			st := c.leader(5 * time.Second).srv.fsm.State()
			t.Logf("model %+v; %d nodes", st.Models["m"], len(st.Nodes))
		}
	}()
	v1 := firstPlan(t, c)
	nodes := v1.Nodes()
	reportLoaded(t, c, v1)
	// The link between the plan's nodes is measured slow (the first
	// measurement since it was planned): the leader weighs the plan on it
	// and moves it to a pair of nodes whose link nobody measured slow.
	slow := []LinkStat{{From: nodes[0], To: nodes[1], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()},
		{From: nodes[1], To: nodes[0], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()}}
	c.apply(t, LinkReportType, LinkReportRequest{Links: slow})
	newerPlan(t, c, v1.Version, "a re-plan off the slow link")
	time.Sleep(500 * time.Millisecond) // let it settle
	l := c.leader(5 * time.Second)
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
	worker(c, StatusFailed, nodes[0])
	newerPlan(t, c, v1.Version, "a re-plan after a node of the plan failed")
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
	worker(c, StatusAlive, ids...)
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
		c.apply(t, LinkReportType, LinkReportRequest{Links: links})
	}
	report(nil)
	c.apply(t, ModelUpsertType, ModelUpsertRequest{Model: twoNodeModel()})
	v1 := firstPlan(t, c)
	nodes := v1.Nodes()
	a, b := nodes[0], nodes[1]
	reportLoaded(t, c, v1)
	// Noise: 12 Gbit/s instead of 10 is the same step.
	report(map[[2]string]float64{{a, b}: 12, {b, a}: 12})
	time.Sleep(time.Second)
	if p := c.leader(5 * time.Second).srv.fsm.State().Plans["m"]; p.Version != v1.Version {
		t.Fatalf("re-planned on link noise: v%d on %v", p.Version, p.Nodes())
	}
	// The link between the plan's nodes drops to 10 Mbit/s.
	report(map[[2]string]float64{{a, b}: 0.01, {b, a}: 0.01})
	v2 := newerPlan(t, c, v1.Version, "a re-plan after the link slowed")
	now := v2.Nodes()
	if len(now) == 2 && ((now[0] == a && now[1] == b) || (now[0] == b && now[1] == a)) {
		t.Fatalf("the new plan v%d is still on the slow link %v", v2.Version, now)
	}
	if v2.Cost.MsPerToken > v1.Cost.MsPerToken*1.5 {
		t.Fatalf("the new plan predicts %.2f ms/token, the first %.2f", v2.Cost.MsPerToken, v1.Cost.MsPerToken)
	}
}

// TestLoadingPlanKept: while the nodes of a plan are still loading it, a
// link measured between them does not move it (what they fetched would be
// thrown away, a hub file's ranges read from the hub again); once they
// report it loaded, the plan is weighed on that link and moves off it. A
// node of the plan lost while loading is re-planned at once.
func TestLoadingPlanKept(t *testing.T) {
	c := newTestCluster(t)
	for range 3 {
		c.add(3)
	}
	ids := []string{"w1", "w2", "w3"}
	worker(c, StatusAlive, ids...)
	c.apply(t, ModelUpsertType, ModelUpsertRequest{Model: twoNodeModel()})
	v1 := firstPlan(t, c)
	nodes := v1.Nodes()
	// One node has its shard, the other is fetching when the link between
	// them is measured 100x slower than the default the plan assumed.
	report := func(id, state string, version uint64) {
		t.Helper()
		reportShard(t, c, ShardStatus{Node: id, Model: "m", State: state, PlanVersion: version, UpdatedAt: time.Now()})
	}
	report(nodes[0], ShardReady, v1.Version)
	report(nodes[1], ShardFetching, v1.Version)
	slow := []LinkStat{{From: nodes[0], To: nodes[1], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()},
		{From: nodes[1], To: nodes[0], Gbit: 0.01, LatencyMs: 200, MeasuredAt: time.Now()}}
	c.apply(t, LinkReportType, LinkReportRequest{Links: slow})
	time.Sleep(time.Second) // five planning passes
	if p := c.leader(5 * time.Second).srv.fsm.State().Plans["m"]; p.Version != v1.Version {
		t.Fatalf("re-planned while its nodes were loading it: v%d on %v", p.Version, p.Nodes())
	}
	// Loaded: weighed on the slow link, it moves.
	report(nodes[1], ShardReady, v1.Version)
	v2 := newerPlan(t, c, v1.Version, "a re-plan once loaded")
	// v2 loads; a node of it fails meanwhile: re-planned without waiting.
	now := v2.Nodes()
	report(now[0], ShardFetching, v2.Version)
	worker(c, StatusFailed, now[0])
	newerPlan(t, c, v2.Version, "a re-plan after a node of the loading plan failed")
}

// TestNoRoomMoves: a node of a plan still loading reports that its disk
// has no room for its shard: the plan moves to a node with room at once
// (the loading plan is not kept), and leaves the full node out.
func TestNoRoomMoves(t *testing.T) {
	c := newTestCluster(t)
	for range 3 {
		c.add(3)
	}
	worker(c, StatusAlive, "w1", "w2", "w3")
	c.apply(t, ModelUpsertType, ModelUpsertRequest{Model: twoNodeModel()})
	v1 := firstPlan(t, c)
	nodes := v1.Nodes()
	reportShard(t, c, ShardStatus{Node: nodes[0], Model: "m", State: ShardFetching, PlanVersion: v1.Version, UpdatedAt: time.Now()})
	reportShard(t, c, ShardStatus{Node: nodes[1], Model: "m", State: ShardFailed, NoRoom: true, Error: "no room on disk for the shard",
		PlanVersion: v1.Version, UpdatedAt: time.Now()})
	var v2 *placement.Plan
	waitFor(t, 10*time.Second, "a plan without the full node", func() bool {
		v2 = c.leader(5 * time.Second).srv.fsm.State().Plans["m"]
		return v2 != nil && v2.Version > v1.Version && len(v2.Pools) > 0
	})
	if slices.Contains(v2.Nodes(), nodes[1]) || len(v2.Nodes()) != 2 {
		t.Fatalf("re-planned on %v; %s has no room", v2.Nodes(), nodes[1])
	}
}

// worker sets the gossip view of each of ids: a client node of 16 MiB, too
// small for upsertTwoNodeModel's model alone, with status.
func worker(c *testCluster, status NodeStatus, ids ...string) {
	for _, id := range ids {
		c.members.set(Member{ID: id, Name: id, Role: RoleClient, Status: status,
			Caps: Capabilities{MemTotal: 16 << 20, MemFree: 16 << 20, Cores: 2, GFLOPS: 100, MemGBps: 10}})
	}
}

// firstPlan waits for model "m"'s first plan, which must be on two
// workers.
func firstPlan(t *testing.T, c *testCluster) *placement.Plan {
	t.Helper()
	var v1 *placement.Plan
	waitFor(t, 10*time.Second, "the first plan", func() bool {
		st := c.leader(5 * time.Second).srv.fsm.State()
		v1 = st.Plans["m"]
		return v1 != nil && len(v1.Pools) > 0 && st.Models["m"].Status == ModelPlanned
	})
	if nodes := v1.Nodes(); len(nodes) != 2 {
		t.Fatalf("the plan is on %v, want two workers", nodes)
	}
	return v1
}

// newerPlan waits for a plan of model "m" newer than version v.
func newerPlan(t *testing.T, c *testCluster, v uint64, what string) *placement.Plan {
	t.Helper()
	var p *placement.Plan
	waitFor(t, 10*time.Second, what, func() bool {
		p = c.leader(5 * time.Second).srv.fsm.State().Plans["m"]
		return p != nil && p.Version > v
	})
	return p
}

// reportLoaded reports every node's shard of plan p ready: the model is
// loaded, and a re-plan may move it (loadingKeeps).
func reportLoaded(t *testing.T, c *testCluster, p *placement.Plan) {
	t.Helper()
	for _, id := range p.Nodes() {
		reportShard(t, c, ShardStatus{Node: id, Model: p.Model, State: ShardReady, PlanVersion: p.Version, UpdatedAt: time.Now()})
	}
}

// reportShard records sh through the leader (again on the next one when
// leadership moves, as under -race on a loaded host).
func reportShard(t *testing.T, c *testCluster, sh ShardStatus) {
	t.Helper()
	var err error
	waitFor(t, 10*time.Second, "the shard report of "+sh.Node, func() bool {
		err = c.leader(5*time.Second).srv.Apply(ShardStatusType, ShardStatusRequest{Shard: sh}, 2*time.Second)
		return !errors.Is(err, ErrNotLeader)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// upsertTwoNodeModel loads model "m", 16 MiB planned as a pipeline: it
// needs two of the 16 MiB workers.
func upsertTwoNodeModel(t *testing.T, l *testServer) {
	t.Helper()
	if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: twoNodeModel()}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

// twoNodeModel is the model upsertTwoNodeModel loads.
func twoNodeModel() Model {
	prof := placement.ModelProfile{Name: "m", Arch: "llama", NLayer: 8, NEmbd: 256, NHead: 4, NHeadKV: 4, HeadDim: 64, NVocab: 512,
		FFNDim: 768, HeadUnit: 1, FFNUnit: 32, KVBytesPerToken: 2048}
	for range prof.NLayer {
		prof.Layers = append(prof.Layers, placement.LayerProfile{AttnBytes: 512 << 10, FFNBytes: 1536 << 10, AttnFLOPs: 2 << 20, FFNFLOPs: 4 << 20})
	}
	return Model{Name: "m", Digest: "d", Profile: &prof, Ctx: 64, MaxSeqs: 1, Overhead: 1 << 20, Strategy: string(placement.Pipeline)}
}

// TestHubSourceHasNoFile: the node a model's file sits on reads its shard
// from it and fetches nothing, as the plan's moves say; the source of a
// hub file (the agent that loaded it, or the leader that took its check
// over) has only the header, and fetches its shard like any node.
func TestHubSourceHasNoFile(t *testing.T) {
	st := fuzzBase(t)
	file := *st.Models["m"]
	file.Pin = []string{"w1"} // the source
	hubm := file
	hubm.Hub = &HubFile{Repo: "org/m-GGUF", File: "m.gguf", SHA256: "d", Size: 1 << 20}
	for _, c := range []struct {
		m     *Model
		moved bool
		how   string
	}{{&file, false, "reads its own copy of the file"}, {&hubm, true, "fetches"}} {
		d := decidePlan(st, c.m, nil)
		if d.Unservable != "" {
			t.Fatal(d.Unservable)
		}
		if (d.Plan.MovedBytes > 0) != c.moved || len(d.Plan.Moved) != 1 || !strings.Contains(d.Plan.Moved[0], c.how) {
			t.Errorf("hub %v: moves %d bytes: %v", c.m.Hub != nil, d.Plan.MovedBytes, d.Plan.Moved)
		}
	}
}

// TestPlannerKeepsNewerModel (issue #38): the planner decides on a state
// read before an agent registered the model again with a new pin (shoal up
// --nodes 1 --model X after --nodes 2: the agent pins X to itself while the
// leader finds X's old pin on a failed node unservable). The status it
// records changes the status only: the new pin stays, and is planned on
// the next pass.
func TestPlannerKeepsNewerModel(t *testing.T) {
	c := newTestCluster(t)
	c.add(1)
	worker(c, StatusAlive, "w1", "w2")
	l := c.leader(10 * time.Second)
	// The workers' registrations land a moment after gossip lists them.
	waitFor(t, 10*time.Second, "both workers in the state", func() bool {
		st := l.srv.fsm.State()
		return st.Nodes["w1"] != nil && st.Nodes["w2"] != nil
	})
	upsertTwoNodeModel(t, l)
	stale := l.srv.fsm.State()
	m := stale.Models["m"]
	m.Pin = []string{"w1", "w2"}
	stale.Nodes["w2"].Status = StatusFailed // as the planner saw it
	// The agent's registration lands meanwhile.
	fresh := *m
	fresh.Pin = []string{"w1"}
	if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: fresh}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.srv.planModel(stale, m, stale.Plans["m"]); err != nil {
		t.Fatal(err)
	}
	got := l.srv.fsm.State().Models["m"]
	if !slices.Equal(got.Pin, []string{"w1"}) {
		t.Fatalf("the planner's status write put back the pin it planned on: %v (reason %q)", got.Pin, got.Reason)
	}
}
