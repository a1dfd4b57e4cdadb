package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"shoal/engine/quant"
)

// randomCase draws a model and a cluster from r.
func randomCase(r *rand.Rand) (ModelProfile, []Node, LinkMatrix, Options) {
	shapes := []shape{
		{name: "dense", layers: 8 + r.IntN(40), embd: 4096, heads: 32, kv: 8, ff: 14336, vocab: 128256, typ: quant.Q4_K, out: quant.Q6_K},
		{name: "mha", layers: 4 + r.IntN(30), embd: 2048, heads: 16, kv: 16, ff: 5504, vocab: 32000, typ: quant.Q8_0, out: quant.Q8_0, tied: true},
		{name: "moe", layers: 4 + r.IntN(24), embd: 2048, heads: 16, kv: 4, ff: 1408, vocab: 32000, experts: 8, used: 2, typ: quant.Q4_K, out: quant.Q6_K},
		{name: "moe-shared", layers: 4 + r.IntN(24), embd: 2048, heads: 16, kv: 2, ff: 1408, shared: 5632, vocab: 32000, experts: 16, used: 4, typ: quant.Q4_0, out: quant.Q8_0},
	}
	s := shapes[r.IntN(len(shapes))]
	prof, err := s.profile()
	if err != nil {
		panic(err)
	}
	n := 1 + r.IntN(6)
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{
			ID:      fmt.Sprintf("n%02d", r.IntN(90)+10*i), // unique, not in order
			Status:  StatusAlive,
			MemFree: uint64(1+r.IntN(24)) << 29,
			GFLOPS:  float64(50 + r.IntN(1000)),
			MemGBps: float64(5 + r.IntN(200)),
		}
		switch r.IntN(8) {
		case 0:
			nodes[i].Draining = true
		case 1:
			nodes[i].Status = StatusFailed
		}
	}
	for i := range nodes {
		nodes[i].ID = fmt.Sprintf("%s-%d", nodes[i].ID, i)
	}
	r.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
	var links LinkMatrix
	links.Default = Link{Gbit: []float64{1, 10, 25}[r.IntN(3)], LatencyMs: 0.05 + r.Float64()}
	for i := range nodes {
		for j := i + 1; j < len(nodes); j++ {
			if r.IntN(2) == 0 {
				links.Set(nodes[i].ID, nodes[j].ID, Link{Gbit: float64(1 + r.IntN(100)), LatencyMs: r.Float64() * 2})
			}
		}
	}
	o := Options{
		Strategy: []Strategy{Auto, Auto, Pipeline, Tensor}[r.IntN(4)],
		Context:  []int{512, 2048, 8192}[r.IntN(3)],
		Batch:    1 + r.IntN(4),
	}
	return prof, nodes, links, o
}

// heldBytes recomputes, independently of the planner, what member m holds.
func heldBytes(p *ModelProfile, st Stage, m Member, o Options) uint64 {
	var b float64
	for l := st.Lo; l < st.Hi; l++ {
		lp := p.Layers[l]
		b += float64(lp.AttnBytes) * float64(m.HeadHi-m.HeadLo) / float64(p.NHead)
		b += float64(p.KVBytesPerToken) * float64(o.Context*o.Batch) * float64(m.HeadHi-m.HeadLo) / float64(p.NHead)
		if p.FFNDim > 0 {
			b += float64(lp.FFNBytes) * float64(m.FFNHi-m.FFNLo) / float64(p.FFNDim)
		}
		b += float64(lp.ExpertBytes) * float64(len(m.Experts))
		b += float64(lp.FixedBytes)
	}
	b += float64(p.GlobalBytes)
	if m.Embedding || (m.Output && p.Tied) {
		b += float64(p.EmbedBytes)
	}
	if m.Output {
		b += float64(p.OutputBytes)
	}
	return uint64(b)
}

// TestPlanProperties plans random clusters and checks the invariants:
// everything placed exactly once per pool, no node past its memory, no
// unschedulable node used, and the same plan for the same inputs in any
// order.
func TestPlanProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	planned, failed := 0, 0
	for i := range 300 {
		prof, nodes, links, o := randomCase(r)
		p, err := Place(prof, nodes, links, o)
		if err != nil {
			var fe *FitError
			if !errors.As(err, &fe) {
				t.Fatalf("case %d: error is not a FitError: %v", i, err)
			}
			failed++
			continue
		}
		planned++
		if err := p.Validate(prof); err != nil {
			t.Fatalf("case %d: %v\n%s", i, err, p)
		}
		no := o.normalized()
		byID := map[string]Node{}
		for _, n := range nodes {
			byID[n.ID] = n
		}
		for _, pool := range p.Pools {
			layers := make([]int, prof.NLayer)
			for _, st := range pool.Stages {
				heads := make([]int, prof.NHead)
				ffn := make([]int, prof.FFNDim)
				experts := make([]int, prof.NExpert)
				for l := st.Lo; l < st.Hi; l++ {
					layers[l]++
				}
				for _, m := range st.Members {
					n := byID[m.Node]
					if !n.Schedulable() {
						t.Fatalf("case %d: plan uses %s node %s (draining %v)", i, n.Status, n.ID, n.Draining)
					}
					for h := m.HeadLo; h < m.HeadHi; h++ {
						heads[h]++
					}
					for c := m.FFNLo; c < m.FFNHi; c++ {
						ffn[c]++
					}
					for _, x := range m.Experts {
						experts[x]++
					}
					limit := float64(n.MemFree) * (1 - no.SafetyMargin)
					if used := heldBytes(&prof, st, m, no) + no.Overhead; float64(used) > limit {
						t.Fatalf("case %d: node %s holds %d bytes, limit %.0f\n%s", i, n.ID, used, limit, p)
					}
				}
				for what, counts := range map[string][]int{"head": heads, "ffn column": ffn, "expert": experts} {
					for x, c := range counts {
						if c != 1 {
							t.Fatalf("case %d: stage [%d,%d) %s %d placed %d times\n%s", i, st.Lo, st.Hi, what, x, c, p)
						}
					}
				}
			}
			for l, c := range layers {
				if c != 1 {
					t.Fatalf("case %d: layer %d placed %d times\n%s", i, l, c, p)
				}
			}
		}
		again, err := Place(prof, nodes, links, o)
		if err != nil || !reflect.DeepEqual(p, again) {
			t.Fatalf("case %d: planning twice differs (%v)\n%s\n%s", i, err, p, again)
		}
		rev := make([]Node, len(nodes))
		for j := range nodes {
			rev[j] = nodes[len(nodes)-1-j]
		}
		if other, err := Place(prof, rev, links, o); err != nil || !reflect.DeepEqual(p, other) {
			t.Fatalf("case %d: node order changed the plan (%v)\n%s\n%s", i, err, p, other)
		}
	}
	t.Logf("%d planned, %d did not fit", planned, failed)
	if planned < 100 || failed < 10 {
		t.Fatalf("random cases are unbalanced: %d planned, %d failed", planned, failed)
	}
}

// TestStrategyForced checks that forced strategies give their shapes.
func TestStrategyForced(t *testing.T) {
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
	for _, tc := range []struct {
		s     Strategy
		check func(p Plan) bool
	}{
		{Pipeline, func(p Plan) bool {
			for _, st := range p.Pools[0].Stages {
				if len(st.Members) != 1 {
					return false
				}
			}
			return len(p.Pools[0].Stages) > 1
		}},
		{Tensor, func(p Plan) bool { return len(p.Pools[0].Stages) == 1 && len(p.Pools[0].Stages[0].Members) > 1 }},
	} {
		p, err := Place(prof, nodes, links, Options{Strategy: tc.s})
		if err != nil {
			t.Fatal(err)
		}
		if !tc.check(p) {
			t.Errorf("strategy %s gave\n%s", tc.s, p)
		}
	}
	p, err := Place(prof, nodes, links, Options{Pin: []string{"c", "a"}})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, st := range p.Pools[0].Stages {
		for _, m := range st.Members {
			used[m.Node] = true
		}
	}
	if !reflect.DeepEqual(used, map[string]bool{"a": true, "c": true}) {
		t.Errorf("pin a,c used %v", used)
	}
	p, err = Place(prof, nodes, links, Options{Exclude: []string{"a", "b"}})
	if err != nil || p.Pools[0].Stages[0].Members[0].Node != "c" {
		t.Errorf("exclude a,b: %v\n%s", err, p)
	}
	nodes[1].Status = StatusFailed
	if _, err := Place(prof, nodes, links, Options{Pin: []string{"b"}}); err == nil {
		t.Error("pinning a failed node was accepted")
	}
	if _, err := Place(prof, nodes, links, Options{Strategy: "zigzag"}); err == nil {
		t.Error("unknown strategy accepted")
	}
}

// TestValidateCatches breaks a good plan in the ways Validate must notice.
func TestValidateCatches(t *testing.T) {
	prof, err := shape{name: "m", layers: 8, embd: 2048, heads: 16, kv: 4, ff: 5632, vocab: 32000, experts: 4, used: 2, shared: 2816, typ: quant.Q4_K, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 1 << 30, GFLOPS: 300, MemGBps: 50},
		{ID: "b", Status: StatusAlive, MemFree: 1 << 30, GFLOPS: 300, MemGBps: 50},
	}
	var links LinkMatrix
	links.Default = Link{Gbit: 100, LatencyMs: 0.01}
	p, err := Place(prof, nodes, links, Options{Strategy: Tensor, Context: 512})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(prof); err != nil {
		t.Fatal(err)
	}
	clone := func() Plan {
		q := p
		q.Pools = []Pool{{Role: p.Pools[0].Role}}
		for _, st := range p.Pools[0].Stages {
			st.Members = append([]Member(nil), st.Members...)
			for i := range st.Members {
				st.Members[i].Experts = append([]int(nil), st.Members[i].Experts...)
			}
			q.Pools[0].Stages = append(q.Pools[0].Stages, st)
		}
		return q
	}
	for name, breakIt := range map[string]func(q *Plan){
		"layer gap":      func(q *Plan) { q.Pools[0].Stages[0].Hi-- },
		"head overlap":   func(q *Plan) { q.Pools[0].Stages[0].Members[1].HeadLo -= prof.HeadUnit },
		"head off group": func(q *Plan) { q.Pools[0].Stages[0].Members[0].HeadHi++; q.Pools[0].Stages[0].Members[1].HeadLo++ },
		"ffn off block":  func(q *Plan) { q.Pools[0].Stages[0].Members[0].FFNHi += 8; q.Pools[0].Stages[0].Members[1].FFNLo += 8 },
		"expert twice": func(q *Plan) {
			q.Pools[0].Stages[0].Members[1].Experts = append(q.Pools[0].Stages[0].Members[1].Experts, 0)
		},
		"expert missing":  func(q *Plan) { q.Pools[0].Stages[0].Members[0].Experts = nil },
		"two embeddings":  func(q *Plan) { q.Pools[0].Stages[0].Members[1].Embedding = true },
		"rank twice":      func(q *Plan) { q.Pools[0].Stages[0].Members[1].TPRank = 0 },
		"wrong model":     func(q *Plan) { q.Model = "other" },
		"no pools":        func(q *Plan) { q.Pools = nil },
		"unknown role":    func(q *Plan) { q.Pools[0].Role = "train" },
		"duplicate node":  func(q *Plan) { q.Pools[0].Stages[0].Members[1].Node = q.Pools[0].Stages[0].Members[0].Node },
		"tp size differs": func(q *Plan) { q.Pools[0].Stages[0].Members[0].TPSize = 3 },
	} {
		q := clone()
		breakIt(&q)
		if err := q.Validate(prof); err == nil {
			t.Errorf("%s: Validate accepted\n%s", name, q)
		}
	}
}
