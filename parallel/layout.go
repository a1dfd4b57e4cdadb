package parallel

import (
	"fmt"
	"reflect"
	"slices"

	"shoal/placement"
	"shoal/shard"
)

// memberRef is one member of a plan's pool as the runtime addresses it.
type memberRef struct {
	Stage, Rank int
	Node, Addr  string
	Embedding   bool
	Output      bool
}

func (m memberRef) key() string { return fmt.Sprintf("%d/%d", m.Stage, m.Rank) }

func (m memberRef) String() string {
	return fmt.Sprintf("stage %d rank %d (node %s at %s)", m.Stage, m.Rank, m.Node, m.Addr)
}

type stageRef struct {
	Lo, Hi  int
	Members []memberRef
}

// layout is a pool of a plan with every member's endpoint address and the
// roles the runtime assigns: who embeds for the first stage's members that
// hold no embedding, and who computes the logits.
type layout struct {
	Model    string
	Version  uint64
	Pool     string
	Stages   []stageRef
	Embedder memberRef // the first member holding the embedding, first stage preferred
	Output   memberRef // the first member of the last stage holding the output

	planned [][]placement.Member // by stage and rank
}

// newLayout resolves pool (its role; "" for the plan's first pool) of plan
// against addrs (node ID -> endpoint address).
func newLayout(plan placement.Plan, pool string, addrs map[string]string) (*layout, error) {
	var p *placement.Pool
	for i := range plan.Pools {
		if pool == "" || plan.Pools[i].Role == pool {
			p = &plan.Pools[i]
			break
		}
	}
	if p == nil {
		return nil, fmt.Errorf("dist: plan for %s has no %q pool", plan.Model, pool)
	}
	if len(p.Stages) == 0 {
		return nil, fmt.Errorf("dist: pool %q of the plan for %s has no stages", p.Role, plan.Model)
	}
	l := &layout{Model: plan.Model, Version: plan.Version, Pool: p.Role}
	embedder, output := -1, -1
	next := 0
	for si, st := range p.Stages {
		if st.Lo != next || st.Hi <= st.Lo {
			return nil, fmt.Errorf("dist: stage %d holds layers [%d,%d), want a non-empty range from %d", si, st.Lo, st.Hi, next)
		}
		next = st.Hi
		if len(st.Members) == 0 {
			return nil, fmt.Errorf("dist: stage %d has no members", si)
		}
		sr := stageRef{Lo: st.Lo, Hi: st.Hi}
		for r, m := range st.Members {
			if m.TPRank != r || max(m.TPSize, 1) != len(st.Members) {
				return nil, fmt.Errorf("dist: stage %d member %d (node %s) has tensor-parallel rank %d of %d, want %d of %d",
					si, r, m.Node, m.TPRank, m.TPSize, r, len(st.Members))
			}
			addr := addrs[m.Node]
			if addr == "" {
				return nil, fmt.Errorf("dist: no address for node %s (stage %d rank %d)", m.Node, si, r)
			}
			ref := memberRef{Stage: si, Rank: r, Node: m.Node, Addr: addr, Embedding: m.Embedding, Output: m.Output}
			sr.Members = append(sr.Members, ref)
			if m.Embedding && (embedder < 0 || (si == 0 && l.Embedder.Stage != 0)) {
				embedder, l.Embedder = si, ref
			}
			if m.Output && si == len(p.Stages)-1 && output < 0 {
				output, l.Output = r, ref
			}
		}
		l.Stages = append(l.Stages, sr)
		l.planned = append(l.planned, st.Members)
	}
	if embedder < 0 {
		return nil, fmt.Errorf("dist: no member of the plan for %s holds the embedding", plan.Model)
	}
	if output < 0 {
		return nil, fmt.Errorf("dist: no member of the last stage holds the output")
	}
	return l, nil
}

// members lists every member, stage by stage.
func (l *layout) members() []memberRef {
	var out []memberRef
	for _, st := range l.Stages {
		out = append(out, st.Members...)
	}
	return out
}

// find returns the member of the given stage and rank.
func (l *layout) find(stage, rank int) (memberRef, bool) {
	if stage < 0 || stage >= len(l.Stages) || rank < 0 || rank >= len(l.Stages[stage].Members) {
		return memberRef{}, false
	}
	return l.Stages[stage].Members[rank], true
}

// locate finds the member running layers [lo,hi) at tensor-parallel rank
// rank on node.
func (l *layout) locate(node string, lo, hi, rank int) (memberRef, error) {
	for _, st := range l.Stages {
		if st.Lo != lo || st.Hi != hi {
			continue
		}
		if m, ok := l.find(st.Members[0].Stage, rank); ok && m.Node == node {
			return m, nil
		}
	}
	return memberRef{}, fmt.Errorf("dist: node %s is not rank %d of a stage [%d,%d) in pool %q of the plan for %s", node, rank, lo, hi, l.Pool, l.Model)
}

// checkSpec reports how spec differs from what the plan gives m.
func (l *layout) checkSpec(m memberRef, spec shard.ShardSpec) error {
	pm := l.planned[m.Stage][m.Rank]
	st := l.Stages[m.Stage]
	want := shard.ShardSpec{Lo: st.Lo, Hi: st.Hi, TPRank: pm.TPRank, TPSize: pm.TPSize, HeadLo: pm.HeadLo, HeadHi: pm.HeadHi,
		FFNLo: pm.FFNLo, FFNHi: pm.FFNHi, Experts: pm.Experts, Embedding: pm.Embedding, Output: pm.Output}
	got := spec
	got.Model, got.FileSHA = "", ""
	if max(got.TPSize, 1) == 1 && max(want.TPSize, 1) == 1 {
		got.TPSize, want.TPSize = 1, 1
		got.HeadLo, got.HeadHi, got.FFNLo, got.FFNHi = 0, 0, 0, 0
		want.HeadLo, want.HeadHi, want.FFNLo, want.FFNHi = 0, 0, 0, 0
	}
	if !slices.Equal(got.Experts, want.Experts) || (got.Experts == nil) != (want.Experts == nil) {
		return fmt.Errorf("dist: %v: the shard holds experts %v, the plan gives it %v", m, spec.Experts, pm.Experts)
	}
	got.Experts, want.Experts = nil, nil
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("dist: %v: the shard %+v is not the plan's %+v", m, spec, want)
	}
	return nil
}

// receivesEmbedding reports whether m takes its input from the embedder:
// a first-stage member without the embedding.
func (l *layout) receivesEmbedding(m memberRef) bool { return m.Stage == 0 && !m.Embedding }
