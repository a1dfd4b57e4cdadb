package placement

// RepairSlack is how much slower than the fastest plan a repaired plan
// (the previous plan with only its lost members replaced) may be and still
// win a re-plan: it keeps every surviving member's layers, and the driver
// where it was, so the requests running on the model go on (the driver
// replays them) instead of ending with their driver.
const RepairSlack = 0.25

// repair is prev with each member on a node no longer schedulable replaced
// by the schedulable node not in prev that makes the cheapest plan, the
// survivors keeping their layers (the layer split is redone only when no
// replacement fits the lost member's layers). ok is false when prev lost no
// member, has more than one pool, or no spare node can stand in.
func repair(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options, prev *Plan) (Plan, bool) {
	o := opts.normalized()
	l, ok := layoutOf(&profile, nodes, o, prev)
	if !ok || len(l.holes) == 0 {
		return Plan{}, false
	}
	eligible, groups, bounds, holes := l.eligible, l.groups, l.bounds, l.holes
	e := newEnv(&profile, eligible, links, o)
	used := map[int]bool{}
	for _, g := range groups {
		for _, i := range g {
			if i >= 0 {
				used[i] = true
			}
		}
	}
	var best *candidate
	for _, split := range []bool{false, true} { // keep the layers, else re-split them
		gs := make([][]int, len(groups))
		for k := range groups {
			gs[k] = append([]int(nil), groups[k]...)
		}
		taken := map[int]bool{}
		for i := range used {
			taken[i] = true
		}
		filled := true
		for _, h := range holes {
			var pick *candidate
			pickNode := -1
			for i := range eligible {
				if taken[i] {
					continue
				}
				gs[h[0]][h[1]] = i
				c := e.evaluateAt(gs, bounds, split)
				if c.ok && (pick == nil || e.score(c) < e.score(pick)) {
					pick, pickNode = c, i
				}
			}
			if pick == nil {
				filled = false
				break
			}
			gs[h[0]][h[1]] = pickNode
			taken[pickNode] = true
			best = pick
		}
		if filled && best != nil {
			best = e.evaluateAt(gs, bounds, split)
			if best.ok {
				break
			}
		}
		best = nil
	}
	if best == nil {
		return Plan{}, false
	}
	return Plan{
		Version: o.Version, Model: profile.Name, Strategy: best.strategy(),
		Pools: []Pool{{Role: prev.Pools[0].Role, Stages: best.stages, Cost: best.cost}},
		Cost:  best.cost, Context: o.Context, Batch: o.Batch, KVType: o.KVType,
		Explain: []string{"repaired the previous plan: lost members replaced, the others keep their layers"},
	}, true
}

// evaluateAt is evaluate with the layer split given (bounds), or, with
// split, found again.
func (e *env) evaluateAt(groups [][]int, bounds []int, split bool) *candidate {
	if split {
		return e.evaluate(groups)
	}
	c := &candidate{groups: groups, bounds: bounds}
	stages := make([]Stage, len(groups))
	for k, g := range groups {
		st, ok := e.allocate(g, bounds[k], bounds[k+1], k == 0, k == len(groups)-1)
		if !ok {
			return c
		}
		stages[k] = st
	}
	c.stages, c.cost = stages, e.cost(groups, stages)
	c.ok = e.predictPrompt(c)
	return c
}

// Recost is the cost of prev's single pool as the nodes and links measure
// now: the same members, each with the same layers, for a step of
// opts.Batch sequences. A plan's own Cost is from when it was made, often
// before the links were measured (1 ms each by default) or while a just
// started cluster measured itself slow. ok is false for a plan of several
// pools or one whose members no longer fit.
func Recost(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options, prev *Plan) (Cost, bool) {
	o := opts.normalized()
	l, ok := layoutOf(&profile, nodes, o, prev)
	if !ok || len(l.holes) > 0 {
		return Cost{}, false
	}
	c := newEnv(&profile, l.eligible, links, o).evaluateAt(l.groups, l.bounds, false)
	if !c.ok {
		return Cost{}, false
	}
	return c.cost, true
}

// prevLayout is a single-pool plan's members as indices into the eligible
// nodes: groups per stage (-1 for a member no longer eligible, listed in
// holes as stage and rank) and the stages' layer bounds.
type prevLayout struct {
	eligible []Node
	groups   [][]int
	bounds   []int
	holes    [][2]int
}

// layoutOf is prev's layout over nodes; ok is false for a plan of several
// pools, one that does not cover the model's layers, or no eligible node.
func layoutOf(profile *ModelProfile, nodes []Node, o Options, prev *Plan) (prevLayout, bool) {
	var l prevLayout
	if len(prev.Pools) != 1 || len(prev.Pools[0].Stages) == 0 {
		return l, false
	}
	eligible, _, err := eligibleNodes(nodes, o)
	if err != nil || len(eligible) == 0 {
		return l, false
	}
	l.eligible = eligible
	idx := map[string]int{}
	for i, n := range eligible {
		idx[n.ID] = i
	}
	stages := prev.Pools[0].Stages
	l.groups = make([][]int, len(stages))
	l.bounds = make([]int, len(stages)+1)
	for k, st := range stages {
		l.bounds[k], l.bounds[k+1] = st.Lo, st.Hi
		for r, m := range st.Members {
			i, ok := idx[m.Node]
			if !ok {
				i = -1
				l.holes = append(l.holes, [2]int{k, r})
			}
			l.groups[k] = append(l.groups[k], i)
		}
	}
	return l, l.bounds[0] == 0 && l.bounds[len(stages)] == profile.NLayer
}
