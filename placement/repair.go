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
	if len(prev.Pools) != 1 || len(prev.Pools[0].Stages) == 0 {
		return Plan{}, false
	}
	eligible, _, err := eligibleNodes(nodes, o)
	if err != nil || len(eligible) == 0 {
		return Plan{}, false
	}
	e := newEnv(&profile, eligible, links, o)
	idx := map[string]int{}
	for i, n := range eligible {
		idx[n.ID] = i
	}
	stages := prev.Pools[0].Stages
	groups := make([][]int, len(stages))
	bounds := make([]int, len(stages)+1)
	used := map[int]bool{}
	var holes [][2]int // stage, member
	for k, st := range stages {
		bounds[k], bounds[k+1] = st.Lo, st.Hi
		for r, m := range st.Members {
			i, ok := idx[m.Node]
			if !ok {
				groups[k] = append(groups[k], -1)
				holes = append(holes, [2]int{k, r})
				continue
			}
			groups[k] = append(groups[k], i)
			used[i] = true
		}
	}
	if len(holes) == 0 || bounds[0] != 0 || bounds[len(stages)] != profile.NLayer {
		return Plan{}, false
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
				if c.ok && (pick == nil || c.cost.MsPerToken < pick.cost.MsPerToken) {
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
		Cost:  best.cost, Context: o.Context, Batch: o.Batch,
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
	c.stages, c.cost, c.ok = stages, e.cost(groups, stages), true
	return c
}

// recost is the cost of prev's single pool as the nodes measure now: the
// same members, each with the same layers. ok is false for a plan of
// several pools or one whose members no longer fit.
func recost(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options, prev *Plan) (Cost, bool) {
	o := opts.normalized()
	if len(prev.Pools) != 1 || len(prev.Pools[0].Stages) == 0 {
		return Cost{}, false
	}
	eligible, _, err := eligibleNodes(nodes, o)
	if err != nil {
		return Cost{}, false
	}
	idx := map[string]int{}
	for i, n := range eligible {
		idx[n.ID] = i
	}
	stages := prev.Pools[0].Stages
	groups := make([][]int, len(stages))
	bounds := make([]int, len(stages)+1)
	for k, st := range stages {
		bounds[k], bounds[k+1] = st.Lo, st.Hi
		for _, m := range st.Members {
			i, ok := idx[m.Node]
			if !ok {
				return Cost{}, false
			}
			groups[k] = append(groups[k], i)
		}
	}
	if bounds[0] != 0 || bounds[len(stages)] != profile.NLayer {
		return Cost{}, false
	}
	c := newEnv(&profile, eligible, links, o).evaluateAt(groups, bounds, false)
	if !c.ok {
		return Cost{}, false
	}
	return c.cost, true
}
