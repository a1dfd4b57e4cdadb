package placement

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"shoal/engine/quant"
)

// TestReplanProperties checks Replan on random clusters: unchanged inputs
// keep the plan; after random joins, drains, failures and recoveries a kept
// plan uses only schedulable nodes, a new plan is valid, numbered after
// the previous one and moves what MovedBytes says, and an unservable model
// releases every node it used; the decision does not depend on node order.
func TestReplanProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 23))
	counts := map[string]int{}
	for i := range 300 {
		prof, nodes, links, o := randomCase(r)
		prev, err := Place(prof, nodes, links, o)
		if err != nil {
			if d := Replan(prof, nodes, links, o, nil, ""); !d.Keep || d.Unservable == "" {
				t.Fatalf("case %d: Place failed (%v) but Replan decided %+v", i, err, d)
			}
			continue
		}
		if d := Replan(prof, nodes, links, o, &prev, ""); !d.Keep || d.Unservable != "" || !reflect.DeepEqual(d.Plan, prev) {
			t.Fatalf("case %d: nothing changed but Replan decided %+v", i, d)
		}
		if n := MovedBytes(&prof, &prev, &prev, ""); n != 0 {
			t.Fatalf("case %d: the same plan moves %d bytes", i, n)
		}
		if ids := prev.Nodes(); len(ids) == 1 && MovedBytes(&prof, nil, &prev, ids[0]) != 0 {
			t.Fatalf("case %d: the node with the file fetches", i)
		}
		nodes = changeCluster(r, nodes)
		local := ""
		if r.IntN(2) == 0 {
			local = nodes[r.IntN(len(nodes))].ID
		}
		d := Replan(prof, nodes, links, o, &prev, local)
		kind := checkDecision(t, i, &prof, nodes, &prev, local, d)
		counts[kind]++
		rev := slices.Clone(nodes)
		slices.Reverse(rev)
		if again := Replan(prof, rev, links, o, &prev, local); !reflect.DeepEqual(d, again) {
			t.Fatalf("case %d: node order changed the decision\n%+v\n%+v", i, d, again)
		}
	}
	t.Log(counts)
	for _, k := range []string{"keep", "move", "release"} {
		if counts[k] < 10 {
			t.Fatalf("random cases are unbalanced: %v", counts)
		}
	}
}

// changeCluster drains, fails, revives or re-measures some nodes and may
// add one.
func changeCluster(r *rand.Rand, nodes []Node) []Node {
	out := slices.Clone(nodes)
	for j := range out {
		switch r.IntN(6) {
		case 0:
			out[j].Draining = true
		case 1:
			out[j].Status = StatusFailed
		case 2:
			out[j].Status, out[j].Draining = StatusAlive, false
		case 3:
			out[j].MemGBps *= 0.5 + r.Float64()
		}
	}
	if r.IntN(3) == 0 {
		out = append(out, Node{ID: fmt.Sprintf("new-%d", r.IntN(100)), Status: StatusAlive,
			MemFree: uint64(1+r.IntN(24)) << 29, GFLOPS: float64(50 + r.IntN(1000)), MemGBps: float64(5 + r.IntN(200))})
	}
	return out
}

func checkDecision(t *testing.T, i int, prof *ModelProfile, nodes []Node, prev *Plan, local string, d Decision) string {
	t.Helper()
	schedulable := map[string]bool{}
	for _, n := range nodes {
		schedulable[n.ID] = n.Schedulable()
	}
	switch {
	case d.Unservable != "":
		want := []string{}
		for _, id := range prev.Nodes() {
			want = append(want, id+": released")
		}
		if d.Keep || len(d.Plan.Pools) != 0 || d.Plan.Version != prev.Version+1 || !slices.Equal(d.Plan.Moved, want) {
			t.Fatalf("case %d: unservable (%s) but decided %+v", i, d.Unservable, d)
		}
		return "release"
	case d.Keep:
		for _, id := range prev.Nodes() {
			if !schedulable[id] {
				t.Fatalf("case %d: kept a plan on %s, which is not schedulable", i, id)
			}
		}
		if !reflect.DeepEqual(d.Plan, *prev) {
			t.Fatalf("case %d: kept, but the plan is not the previous one", i)
		}
		return "keep"
	}
	if err := d.Plan.Validate(*prof); err != nil {
		t.Fatalf("case %d: %v\n%s", i, err, d.Plan)
	}
	if d.Plan.Version != prev.Version+1 || d.Plan.MovedBytes != MovedBytes(prof, prev, &d.Plan, local) || samePlacement(prev, &d.Plan) {
		t.Fatalf("case %d: moved to v%d (%d bytes) from v%d\n%s", i, d.Plan.Version, d.Plan.MovedBytes, prev.Version, d.Plan)
	}
	for _, id := range d.Plan.Nodes() {
		if !schedulable[id] {
			t.Fatalf("case %d: moved onto %s, which is not schedulable", i, id)
		}
	}
	return "move"
}

// TestReplanHonoursPinAndStrategy: a model loaded again with other nodes
// pinned or another strategy forced (same context and batch, so the
// previous plan's KV would still do) moves to a plan that obeys them; the
// previous plan, which does not, is not kept however fast it is.
func TestReplanHonoursPinAndStrategy(t *testing.T) {
	prof, err := shape{name: "m", layers: 16, embd: 2048, heads: 16, kv: 4, ff: 5632, vocab: 32000, typ: quant.Q4_K, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 300, MemGBps: 50},
		{ID: "b", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 300, MemGBps: 50},
		{ID: "c", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 300, MemGBps: 50},
	}
	var links LinkMatrix
	single, err := Place(prof, nodes, links, Options{Pin: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	sorted := func(p Plan) []string { ids := p.Nodes(); slices.Sort(ids); return ids }
	for _, tc := range []struct {
		name  string
		prev  Plan
		o     Options
		nodes []string
		strat string
	}{
		{"spread over the pinned nodes", single, Options{Pin: []string{"a", "b", "c"}, Strategy: Pipeline}, []string{"a", "b", "c"}, "pipeline"},
		{"pinned, any strategy", single, Options{Pin: []string{"c", "b", "a"}}, []string{"a", "b", "c"}, ""},
		{"back to one node", mustPlace(t, prof, nodes, Options{Pin: []string{"a", "b", "c"}, Strategy: Pipeline}), Options{Pin: []string{"a"}}, []string{"a"}, "single"},
		{"pipeline to tensor", mustPlace(t, prof, nodes, Options{Strategy: Pipeline}), Options{Strategy: Tensor}, nil, "tensor"},
		{"single to pipeline", single, Options{Strategy: Pipeline}, nil, "pipeline"},
	} {
		d := Replan(prof, nodes, links, tc.o, &tc.prev, "a")
		if d.Unservable != "" {
			t.Errorf("%s: unservable: %s", tc.name, d.Unservable)
			continue
		}
		if tc.nodes != nil && !slices.Equal(sorted(d.Plan), tc.nodes) {
			t.Errorf("%s: plan on %v, want %v (weighed %v)", tc.name, sorted(d.Plan), tc.nodes, d.Weighed)
		}
		if tc.strat != "" && d.Plan.Strategy != tc.strat {
			t.Errorf("%s: strategy %s, want %s (weighed %v)", tc.name, d.Plan.Strategy, tc.strat, d.Weighed)
		}
		// The obeying plan, once placed, stands.
		if again := Replan(prof, nodes, links, tc.o, &d.Plan, "a"); !again.Keep {
			t.Errorf("%s: the new plan is not kept when nothing changes: %v", tc.name, again.Weighed)
		}
	}
}

func mustPlace(t *testing.T, prof ModelProfile, nodes []Node, o Options) Plan {
	t.Helper()
	p, err := Place(prof, nodes, LinkMatrix{}, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
