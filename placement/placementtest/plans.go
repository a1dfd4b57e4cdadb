package placementtest

import (
	"fmt"

	"shoal/placement"
)

// Shape is what the test plans need to know of a model.
type Shape struct {
	Layers, Heads, KVHeads int
	FFN                    int // dense FFN (or shared expert) columns; 0 if none
	Experts                int // routed experts; 0 for a dense model
}

// Part is one member of a stage: its share of the KV groups (with their
// query heads), the FFN columns [FFNLo, FFNHi) and the routed experts.
type Part struct {
	Groups int
	// Heads, when not 0, is the member's share of query heads instead of
	// Groups: a split finer than the KV groups, each member holding part
	// of a group replicating its KV head.
	Heads        int
	FFNLo, FFNHi int
	Experts      []int
}

// Stage is the layers [Lo, Hi) held by one Part (whole layers) or by a
// tensor-parallel group of Parts.
type Stage struct {
	Lo, Hi int
	Parts  []Part
}

// Whole is the one Part of a stage that holds whole layers.
func Whole() []Part { return []Part{{}} }

// Plan builds the plan of stages for model, naming the nodes n0, n1, ...
// in stage and rank order; the first stage's rank 0 holds the embedding
// and the last stage's rank 0 the output.
func (s Shape) Plan(model string, stages ...Stage) placement.Plan {
	g := s.Heads / s.KVHeads
	pool := placement.Pool{Role: placement.RoleShared}
	node := 0
	for si, st := range stages {
		ps := placement.Stage{Lo: st.Lo, Hi: st.Hi}
		h := 0
		for r, p := range st.Parts {
			m := placement.Member{Node: fmt.Sprintf("n%d", node), TPRank: r, TPSize: len(st.Parts),
				Embedding: si == 0 && r == 0, Output: si == len(stages)-1 && r == 0}
			node++
			if len(st.Parts) > 1 {
				n := p.Groups * g
				if p.Heads > 0 {
					n = p.Heads
				}
				m.HeadLo, m.HeadHi = h, h+n
				m.FFNLo, m.FFNHi = p.FFNLo, p.FFNHi
				m.Experts = p.Experts
				h += n
			}
			ps.Members = append(ps.Members, m)
		}
		pool.Stages = append(pool.Stages, ps)
	}
	return placement.Plan{Version: 1, Model: model, Strategy: "test", Pools: []placement.Pool{pool}}
}

// TP splits a stage among len(groups) members: member i holds groups[i]
// KV groups, the FFN columns between ffnCuts[i-1] and ffnCuts[i], and
// expertCounts[i] consecutive experts.
func (s Shape) TP(groups, ffnCuts, expertCounts []int) []Part {
	ps := make([]Part, len(groups))
	x := 0
	for i := range ps {
		ps[i].Groups = groups[i]
		if s.FFN > 0 {
			ps[i].FFNLo, ps[i].FFNHi = 0, s.FFN
			if i > 0 {
				ps[i].FFNLo = ffnCuts[i-1]
			}
			if i < len(ffnCuts) {
				ps[i].FFNHi = ffnCuts[i]
			}
		}
		if s.Experts > 0 {
			ps[i].Experts = []int{}
			for range expertCounts[i] {
				ps[i].Experts = append(ps[i].Experts, x)
				x++
			}
		}
	}
	return ps
}

// SplitEven splits n into parts as evenly as possible, the first larger.
func SplitEven(n, parts int) []int {
	out := make([]int, parts)
	for i := range out {
		out[i] = n / parts
		if i < n%parts {
			out[i]++
		}
	}
	return out
}

// Named is a plan with a short name for the test logs.
type Named struct {
	Name string
	Plan placement.Plan
}

// Plans is a list of named plans.
type Plans []Named

// Get returns the plan called name; it panics if there is none.
func (ps Plans) Get(name string) placement.Plan {
	for _, p := range ps {
		if p.Name == name {
			return p.Plan
		}
	}
	panic("placementtest: no plan " + name)
}

// Plans lists the plans a model is checked under: pipelines of 2 and (with
// 3 layers or more) 3 stages, tensor parallel over 2 (the FFN cut on a
// 32-column boundary) and 3 (uneven heads, FFN cuts off block
// boundaries), 2 stages x TP2, and for a model of 4 experts expert
// parallel over 2 members in two ways. A model of one KV head (MQA) has
// its query heads split instead, every member replicating the KV head.
func (s Shape) Plans(model string) Plans {
	L, F, G := s.Layers, s.FFN, s.KVHeads
	k := L / 2
	var ps Plans
	add := func(n string, st ...Stage) { ps = append(ps, Named{n, s.Plan(model, st...)}) }
	add("pp2", Stage{0, k, Whole()}, Stage{k, L, Whole()})
	if L >= 3 {
		add("pp3", Stage{0, 1, Whole()}, Stage{1, L - 1, Whole()}, Stage{L - 1, L, Whole()})
	}
	tp := func(n int, ffnCuts []int) []Part {
		if G > 1 {
			return s.TP(SplitEven(G, n), ffnCuts, SplitEven(s.Experts, n))
		}
		ps := s.TP(make([]int, n), ffnCuts, SplitEven(s.Experts, n))
		for i, h := range SplitEven(s.Heads, n) {
			ps[i].Heads = h
		}
		return ps
	}
	tp2 := tp(2, []int{F / 2 / 32 * 32})
	add("tp2", Stage{0, L, tp2})
	add("tp3", Stage{0, L, tp(3, []int{F/3 + 5, 2*F/3 - 3})})
	add("pp2xtp2", Stage{0, k, tp2}, Stage{k, L, tp2})
	if s.Experts == 4 {
		add("ep2 {0,1}/{2,3}", Stage{0, L, []Part{{Groups: G, FFNHi: F, Experts: []int{0, 1}}, {FFNLo: F, FFNHi: F, Experts: []int{2, 3}}}})
		ep := s.TP(SplitEven(G, 2), []int{F / 2 / 32 * 32}, []int{1, 3})
		add("ep2 {0}/{1,2,3}", Stage{0, L, ep})
	}
	return ps
}

// Disagg is a plan with prefill's first pool as its prefill pool and
// decode's as its decode pool, their nodes renamed p<node> and d<node>.
func Disagg(prefill, decode placement.Plan) placement.Plan {
	pool := func(p placement.Plan, role, prefix string) placement.Pool {
		src := p.Pools[0]
		out := placement.Pool{Role: role}
		for _, st := range src.Stages {
			st.Members = append([]placement.Member(nil), st.Members...)
			for i := range st.Members {
				st.Members[i].Node = prefix + st.Members[i].Node
			}
			out.Stages = append(out.Stages, st)
		}
		return out
	}
	out := decode
	out.Strategy = "test-disagg"
	out.Pools = []placement.Pool{pool(prefill, placement.RolePrefill, "p"), pool(decode, placement.RoleDecode, "d")}
	return out
}
