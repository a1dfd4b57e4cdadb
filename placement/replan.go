package placement

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// ReplanSlack is how much slower (predicted ms/token) a plan that moves
// fewer bytes may be and still win a re-plan: 10%.
const ReplanSlack = 0.10

// KeepSlack is how much slower than the fastest plan the previous plan,
// all of its nodes still schedulable, may be and still be kept: moving
// the driver ends the requests running on it, and a measurement of the
// nodes is noisy (20% between two probes of a busy machine), so a plan is
// not moved for less.
const KeepSlack = 0.25

// Decision is what Replan decided for one model.
type Decision struct {
	// Keep: there is nothing to commit. The previous plan stands (Plan is
	// then a copy of it), or, when the model is unservable, there was no
	// placed plan to release (Plan is then zero).
	Keep bool
	// Plan is the plan to commit when Keep is false: a new placement, or,
	// when the model is unservable, an empty plan that releases every node
	// of the previous one. Its Moved and MovedBytes say what changes.
	Plan Plan
	// Unservable, when not empty, says why no plan fits.
	Unservable string
	// Weighed describes the candidate plans, one line each, the chosen one
	// marked.
	Weighed []string
}

// Replan decides where profile runs now that the cluster may have changed
// since prev (nil, or a plan without pools, when the model was never
// placed). It weighs the fastest plan Place finds, prev itself when every
// node it uses is still schedulable, and otherwise a plan pinned to prev's
// surviving nodes and prev repaired (its lost members replaced, the
// others keeping their layers); prev is weighed as the nodes measure now.
// Every candidate obeys opts' pinned nodes and forced strategy: prev that
// does not (the model loaded again with other ones) is not weighed.
// Among those within ReplanSlack of the fastest (RepairSlack for the
// repaired plan, KeepSlack for prev) it takes one that keeps
// prev's driver if any does, then the one that moves the fewest weight
// bytes, then prev itself, then the fastest. A plan
// that places everything as prev does keeps prev. local is the node that
// has the model's file: it reads its shard from it and fetches nothing.
// The plan is numbered prev.Version+1 (opts.Version without prev). Like
// planScore is what a re-plan compares candidate plans by, as Place
// compares arrangements (env.score): the plan's ms/token, or with
// Options.Prompt its predicted time to first token of that prompt plus
// Options.Generate decode steps (ms/token when it cannot be predicted).
func planScore(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options, p *Plan) float64 {
	if opts.Prompt > 0 {
		if pf, ok := PredictPrefill(profile, nodes, links, opts, p, opts.Prompt); ok {
			return pf.Ms + float64(opts.Generate)*p.Cost.MsPerToken
		}
	}
	return p.Cost.MsPerToken
}

// Place, Replan is a pure function.
func Replan(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options, prev *Plan, local string) Decision {
	schedulable := map[string]bool{}
	names := map[string]string{}
	for _, n := range nodes {
		if n.Schedulable() {
			schedulable[n.ID] = true
		}
		if n.Name != "" {
			names[n.ID] = n.Name
		}
	}
	placed := prev != nil && len(prev.Pools) > 0
	if prev != nil {
		opts.Version = prev.Version + 1
	}
	if err := profile.Validate(); err != nil {
		// Nothing is weighed on a profile that fails its bounds: the
		// model is unservable and its nodes are released.
		return unservable(fmt.Errorf("placement: model profile %.64q: %w", profile.Name, err), prev, opts.Version, profile.Name, names)
	}
	// A previous plan that is not a plan of this profile (made for another
	// file of the model, or out of bounds) is not kept, re-costed or
	// repaired: only its nodes count (survivors, the driver, what moves).
	fits := placed && prev.CheckBounds(&profile, 0) == nil
	type cand struct {
		what   string
		plan   Plan
		moved  uint64
		keep   bool
		repair bool
	}
	var cands []cand
	best, err := Place(profile, nodes, links, opts)
	if err == nil {
		cands = append(cands, cand{what: "fastest", plan: best, moved: MovedBytes(&profile, prev, &best, local)})
	}
	var survivors []string
	if placed {
		for _, id := range prev.Nodes() {
			if schedulable[id] {
				survivors = append(survivors, id)
			}
		}
	}
	// A plan made for another context or batch reserves other KV: it is
	// not kept, though its nodes may be chosen again.
	o := opts.normalized()
	sameKV := fits && prev.Context == o.Context && prev.Batch == o.Batch
	switch {
	case sameKV && len(survivors) == len(prev.Nodes()) && obeys(prev, nodes, opts):
		c := cand{what: fmt.Sprintf("previous v%d", prev.Version), plan: *prev, keep: true}
		// Weigh it as the nodes measure now, like the fastest: its cost
		// from when it was planned is stale when the nodes were measured
		// again (a cluster just started measures itself slow).
		if cost, ok := Recost(profile, nodes, links, opts, prev); ok {
			c.plan.Cost = cost
		}
		cands = append(cands, c)
	case len(opts.Pin) == 0 && len(survivors) > 0 && len(survivors) < len(schedulable):
		// Keep the survivors of the old plan: they hold most bytes already
		// (a model pinned to its nodes keeps its pin instead).
		o := opts
		o.Pin = survivors
		if p, err := placeExact(profile, nodes, links, o); err == nil && obeys(&p, nodes, opts) {
			cands = append(cands, cand{what: "on the survivors", plan: p, moved: MovedBytes(&profile, prev, &p, local)})
		}
	}
	// Members lost: the previous plan with only those replaced keeps the
	// others' layers and, unless it was lost, the driver.
	if sameKV && len(opts.Pin) == 0 && len(survivors) > 0 && len(survivors) < len(prev.Nodes()) {
		if p, ok := repair(profile, nodes, links, opts, prev); ok && obeys(&p, nodes, opts) {
			cands = append(cands, cand{what: "repaired", plan: p, moved: MovedBytes(&profile, prev, &p, local), repair: true})
		}
	}
	if len(cands) == 0 {
		return unservable(err, prev, opts.Version, profile.Name, names)
	}
	// Candidates are weighed as the planner weighs arrangements (planScore:
	// ms/token, or for a plan made for prompts the predicted request time).
	scores := make([]float64, len(cands))
	for i := range cands {
		scores[i] = planScore(profile, nodes, links, opts, &cands[i].plan)
	}
	fastest := slices.Min(scores)
	// A plan that keeps the previous driver (stage 0, rank 0: it runs the
	// model's requests, which replay on it) goes before one that moves it.
	driver := ""
	if placed && schedulable[driverOf(prev)] {
		driver = driverOf(prev)
	}
	keepsDriver := func(c cand) bool { return driver != "" && driverOf(&c.plan) == driver }
	pick := -1
	for i, c := range cands {
		slack := ReplanSlack
		switch {
		case c.repair:
			slack = RepairSlack
		case c.keep:
			slack = KeepSlack
		}
		if scores[i] > fastest*(1+slack) {
			continue
		}
		if pick < 0 {
			pick = i
			continue
		}
		p := cands[pick]
		switch {
		case keepsDriver(c) != keepsDriver(p):
			if keepsDriver(c) {
				pick = i
			}
		case c.moved != p.moved:
			if c.moved < p.moved {
				pick = i
			}
		case c.keep != p.keep:
			// Moving nothing either way, the plan that runs stays: a new
			// version reopens the model's sessions for a gain within
			// KeepSlack, likely the links' noise.
			if c.keep {
				pick = i
			}
		case scores[i] < scores[pick]:
			pick = i
		}
	}
	chosen := cands[pick]
	d := Decision{Keep: chosen.keep || prev != nil && samePlacement(prev, &chosen.plan) && prev.Context == chosen.plan.Context && prev.Batch == chosen.plan.Batch}
	for i, c := range cands {
		line := fmt.Sprintf("%s: %s on %s, %.2f ms/token, moves %s", c.what, c.plan.Strategy,
			strings.Join(c.plan.Nodes(), "+"), c.plan.Cost.MsPerToken, GiB(c.moved))
		if i == pick {
			line += " (chosen)"
		}
		d.Weighed = append(d.Weighed, line)
	}
	if d.Keep {
		d.Plan = *prev
		return d
	}
	d.Plan = chosen.plan
	d.Plan.MovedBytes = chosen.moved
	d.Plan.Moved = describeMoves(&profile, prev, &chosen.plan, local, names)
	return d
}

// obeys says whether plan p keeps to what opts force, as a plan Place
// makes does: with opts.Pin, it uses exactly the pinned nodes; with a
// forced strategy, its shape (pipeline: more than one stage of one node
// each; tensor: one stage of a group), a single node qualifying only when
// it is the one node the plan may use. A previous plan that does not (the
// model was loaded again with other --nodes or --strategy) is not kept.
func obeys(p *Plan, nodes []Node, opts Options) bool {
	if f := p.Fallback; f != nil {
		// A plan Place made by relaxing opts obeys what it relaxed them to.
		opts.Strategy = f.Strategy
		if f.Unpinned {
			opts.Pin = nil
		}
	}
	used := p.Nodes()
	if len(opts.Pin) > 0 {
		if len(used) != len(opts.Pin) {
			return false
		}
		for _, id := range used {
			if !slices.Contains(opts.Pin, id) {
				return false
			}
		}
	}
	eligible, _, err := eligibleNodes(nodes, opts)
	if err != nil {
		return false
	}
	one := len(eligible) == 1
	for _, pool := range p.Pools {
		switch opts.Strategy {
		case Pipeline:
			for _, st := range pool.Stages {
				if len(st.Members) != 1 {
					return false
				}
			}
			if len(pool.Stages) < 2 && !one {
				return false
			}
		case Tensor:
			if len(pool.Stages) != 1 || len(pool.Stages[0].Members) < 2 && !one {
				return false
			}
		}
	}
	return true
}

// driverOf is the node that drives p: stage 0, rank 0 of its first pool.
func driverOf(p *Plan) string {
	if len(p.Pools) == 0 || len(p.Pools[0].Stages) == 0 || len(p.Pools[0].Stages[0].Members) == 0 {
		return ""
	}
	return p.Pools[0].Stages[0].Members[0].Node
}

// unservable is the decision when no plan fits: why (from Place's error),
// and an empty plan that releases prev's nodes when prev placed anything.
func unservable(err error, prev *Plan, version uint64, model string, names map[string]string) Decision {
	reason := err.Error()
	var fe *FitError
	if errors.As(err, &fe) {
		reason = fe.Msg
	}
	d := Decision{Keep: true, Unservable: strings.TrimPrefix(reason, "placement: ")}
	if prev == nil || len(prev.Pools) == 0 {
		return d
	}
	d.Keep = false
	d.Plan = Plan{Version: version, Model: model, Explain: []string{d.Unservable}}
	for _, id := range prev.Nodes() {
		d.Plan.Moved = append(d.Plan.Moved, fmt.Sprintf("%s: released", nameOf(names, id)))
	}
	return d
}

func nameOf(names map[string]string, id string) string {
	if n := names[id]; n != "" {
		return n
	}
	return id
}

// Nodes lists the IDs of the nodes the plan uses, sorted.
func (p *Plan) Nodes() []string {
	var out []string
	for _, pool := range p.Pools {
		for _, st := range pool.Stages {
			for _, m := range st.Members {
				if !slices.Contains(out, m.Node) {
					out = append(out, m.Node)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// samePlacement reports whether a and b put the same parts of the model on
// the same nodes (costs and explanations aside).
func samePlacement(a, b *Plan) bool {
	if len(a.Pools) != len(b.Pools) {
		return false
	}
	for i := range a.Pools {
		x, y := a.Pools[i].Stages, b.Pools[i].Stages
		if len(x) != len(y) {
			return false
		}
		for j := range x {
			if x[j].Lo != y[j].Lo || x[j].Hi != y[j].Hi || len(x[j].Members) != len(y[j].Members) {
				return false
			}
			for k := range x[j].Members {
				p, q := x[j].Members[k], y[j].Members[k]
				if p.Node != q.Node || p.TPRank != q.TPRank || p.TPSize != q.TPSize || p.HeadLo != q.HeadLo || p.HeadHi != q.HeadHi ||
					p.FFNLo != q.FFNLo || p.FFNHi != q.FFNHi || !slices.Equal(p.Experts, q.Experts) || p.Embedding != q.Embedding || p.Output != q.Output {
					return false
				}
			}
		}
	}
	return true
}

// holding is what one node holds of a plan, per layer.
type holding struct {
	lo, hi         int
	headLo, headHi int
	ffnLo, ffnHi   int
	experts        []int // nil: all
	embd, out      bool
}

func holdings(p *Plan, prof *ModelProfile) map[string][]holding {
	out := map[string][]holding{}
	if p == nil {
		return out
	}
	for _, pool := range p.Pools {
		for _, st := range pool.Stages {
			for _, m := range st.Members {
				h := holding{lo: st.Lo, hi: st.Hi, headLo: 0, headHi: prof.NHead, ffnLo: 0, ffnHi: prof.FFNDim, experts: m.Experts, embd: m.Embedding, out: m.Output}
				if m.TPSize > 1 {
					h.headLo, h.headHi, h.ffnLo, h.ffnHi = m.HeadLo, m.HeadHi, m.FFNLo, m.FFNHi
				}
				out[m.Node] = append(out[m.Node], h)
			}
		}
	}
	return out
}

// uncovered is the length of [lo,hi) not covered by any of the ranges,
// in time of the ranges' number, not of their lengths.
func uncovered(lo, hi int, ranges [][2]int) int {
	if hi <= lo {
		return 0
	}
	rs := make([][2]int, 0, len(ranges))
	for _, r := range ranges {
		if a, b := max(r[0], lo), min(r[1], hi); a < b {
			rs = append(rs, [2]int{a, b})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i][0] < rs[j][0] })
	n, at := 0, lo
	for _, r := range rs {
		if r[0] > at {
			n += r[0] - at
		}
		at = max(at, r[1])
	}
	return n + max(0, hi-at)
}

// nodeMoved is the weight bytes node must fetch to go from what it held
// in the old plan (olds) to what it holds in the new one (news): per layer,
// the heads, FFN columns and experts it did not hold, and the replicated
// tensors of layers it did not hold at all.
func nodeMoved(prof *ModelProfile, olds, news []holding) uint64 {
	// The experts of each old holding as a set, built once: a layer then
	// costs what its new experts number, not their product with the old.
	oldExps := make([]map[int]bool, len(olds))
	for i, o := range olds {
		if o.experts != nil {
			oldExps[i] = make(map[int]bool, len(o.experts))
			for _, e := range o.experts {
				oldExps[i][e] = true
			}
		}
	}
	var total float64
	for _, h := range news {
		for l := max(h.lo, 0); l < h.hi && l < len(prof.Layers); l++ {
			lp := prof.Layers[l]
			var heads, ffns [][2]int
			var over []int // the olds that hold layer l
			allExp, held := false, false
			for i, o := range olds {
				if l < o.lo || l >= o.hi {
					continue
				}
				held = true
				heads = append(heads, [2]int{o.headLo, o.headHi})
				ffns = append(ffns, [2]int{o.ffnLo, o.ffnHi})
				if o.experts == nil {
					allExp = true
				}
				over = append(over, i)
			}
			if prof.NHead > 0 {
				total += float64(lp.AttnBytes) * float64(uncovered(h.headLo, h.headHi, heads)) / float64(prof.NHead)
			}
			if prof.FFNDim > 0 {
				total += float64(lp.FFNBytes) * float64(uncovered(h.ffnLo, h.ffnHi, ffns)) / float64(prof.FFNDim)
			}
			if prof.NExpert > 0 && !allExp {
				had := func(e int) bool {
					for _, i := range over {
						if oldExps[i][e] {
							return true
						}
					}
					return false
				}
				if h.experts == nil {
					for e := range prof.NExpert {
						if !had(e) {
							total += float64(lp.ExpertBytes)
						}
					}
				}
				for _, e := range h.experts {
					if !had(e) {
						total += float64(lp.ExpertBytes)
					}
				}
			}
			if !held {
				total += float64(lp.FixedBytes)
			}
		}
		if h.embd && !slices.ContainsFunc(olds, func(o holding) bool { return o.embd }) {
			total += float64(prof.EmbedBytes)
		}
		if h.out && !slices.ContainsFunc(olds, func(o holding) bool { return o.out }) {
			total += float64(prof.OutputBytes)
		}
	}
	return uint64(total)
}

// MovedBytes estimates the weight bytes nodes must fetch to go from plan
// a (nil: nothing loaded) to plan b. The node that has the file (local)
// reads its shard from it and fetches nothing.
func MovedBytes(prof *ModelProfile, a, b *Plan, local string) uint64 {
	olds, news := holdings(a, prof), holdings(b, prof)
	var n uint64
	for node, hs := range news {
		if node != local {
			n += nodeMoved(prof, olds[node], hs)
		}
	}
	return n
}

// describeMoves says, per node (ordered and shown by name), what changes
// from plan a to plan b.
func describeMoves(prof *ModelProfile, a, b *Plan, local string, names map[string]string) []string {
	olds, news := holdings(a, prof), holdings(b, prof)
	var ids []string
	for id := range olds {
		ids = append(ids, id)
	}
	for id := range news {
		if _, ok := olds[id]; !ok {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool {
		if a, b := nameOf(names, ids[i]), nameOf(names, ids[j]); a != b {
			return a < b
		}
		return ids[i] < ids[j]
	})
	desc := func(hs []holding) string {
		if len(hs) == 0 {
			return "nothing"
		}
		var parts []string
		for _, h := range hs {
			s := fmt.Sprintf("layers [%d,%d)", h.lo, h.hi)
			if h.headLo != 0 || h.headHi != prof.NHead {
				s += fmt.Sprintf(" heads [%d,%d)", h.headLo, h.headHi)
			}
			if h.experts != nil {
				s += " experts " + ExpertList(h.experts)
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ", ")
	}
	var out []string
	for _, id := range ids {
		o, n := desc(olds[id]), desc(news[id])
		if o == n {
			continue
		}
		how := "reads its own copy of the file"
		if id != local {
			how = "fetches " + GiB(nodeMoved(prof, olds[id], news[id]))
		}
		if len(news[id]) == 0 {
			how = "releases its shard"
		}
		out = append(out, fmt.Sprintf("%s: %s -> %s (%s)", nameOf(names, id), o, n, how))
	}
	return out
}
