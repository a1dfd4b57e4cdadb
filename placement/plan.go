package placement

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"shoal/engine/model"
)

// candidate is one arrangement of nodes: stages in pipeline order, members
// of each in rank order, with its layer split and exact evaluation.
type candidate struct {
	groups [][]int
	bounds []int // layer boundaries, len(groups)+1
	stages []Stage
	cost   Cost
	ok     bool
	// fastFirst: a group's fastest member was moved to rank 0, ahead of
	// the one with the most memory; on a tie the memory order wins.
	fastFirst bool
	// prefill is the predicted prefill of Options.Prompt tokens (zero when
	// the plan is for decode).
	prefill Prefill
}

func (c *candidate) nodeCount() int {
	n := 0
	for _, g := range c.groups {
		n += len(g)
	}
	return n
}

func (c *candidate) strategy() string {
	switch {
	case len(c.groups) == 1 && len(c.groups[0]) == 1:
		return "single"
	case len(c.groups) == 1:
		return "tensor"
	}
	for _, g := range c.groups {
		if len(g) > 1 {
			return "hybrid"
		}
	}
	return "pipeline"
}

// key names the arrangement, for ties and de-duplication.
func (e *env) key(groups [][]int) string {
	var b strings.Builder
	for i, g := range groups {
		if i > 0 {
			b.WriteString(" | ")
		}
		for j, m := range g {
			if j > 0 {
				b.WriteString("+")
			}
			b.WriteString(e.nodes[m].ID)
		}
	}
	return b.String()
}

// score is what arrangements are compared by: the predicted ms/token, or
// with Options.Prompt the predicted time of a request (the prompt's time
// to first token and Options.Generate decode steps).
func (e *env) score(c *candidate) float64 {
	if e.o.Prompt > 0 {
		return c.prefill.Ms + float64(e.o.Generate)*c.cost.MsPerToken
	}
	return c.cost.MsPerToken
}

// better reports whether a beats b: a lower score; on a tie (within a
// part in a million) lower ms/token, fewer nodes, then the smaller key.
func (e *env) better(a, b *candidate) bool {
	if a == nil || !a.ok {
		return false
	}
	if b == nil || !b.ok {
		return true
	}
	for _, xy := range [][2]float64{{e.score(a), e.score(b)}, {a.cost.MsPerToken, b.cost.MsPerToken}} {
		if x, y := xy[0], xy[1]; math.Abs(x-y) > 1e-6*math.Max(x, y) {
			return x < y
		}
	}
	if a.nodeCount() != b.nodeCount() {
		return a.nodeCount() < b.nodeCount()
	}
	if a.fastFirst != b.fastFirst {
		return !a.fastFirst
	}
	return e.key(a.groups) < e.key(b.groups)
}

// Place plans where profile runs on nodes. It is a pure function: the same
// inputs give the same plan. See the package documentation for the cost
// model and the search. When the operator's options fit no plan (a
// forced strategy or pinned nodes the model's shape cannot take, such as
// a pipeline of 3 stages for a model of 2 layers), Place relaxes them in
// turn (the same strategy on any of the nodes, the planner's choice of
// strategy on the pinned nodes, then on any) and says in Plan.Fallback
// which constraint failed and what it did instead; the error is returned
// only when no relaxed plan fits either.
func Place(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options) (Plan, error) {
	p, err := placeExact(profile, nodes, links, opts)
	var fe *FitError
	if err == nil || !errors.As(err, &fe) || (opts.Strategy == Auto || opts.Strategy == "") && len(opts.Pin) == 0 {
		return p, err
	}
	reason := shapeReason(&profile, nodes, opts)
	if reason == "" && fe.Need > fe.Usable && len(opts.Pin) == 0 {
		return p, err // short of memory: no arrangement of these nodes helps
	}
	if reason == "" {
		reason = strings.TrimPrefix(fe.Msg, "placement: ")
	}
	type relax struct {
		strategy Strategy
		unpin    bool
	}
	tried := map[relax]bool{{opts.normalized().Strategy, false}: true}
	for _, r := range []relax{{opts.normalized().Strategy, true}, {Auto, false}, {Auto, true}} {
		if len(opts.Pin) == 0 {
			r.unpin = false
		}
		if tried[r] {
			continue
		}
		tried[r] = true
		o := opts
		o.Strategy = r.strategy
		if r.unpin {
			o.Pin = nil
		}
		rp, rerr := placeExact(profile, nodes, links, o)
		if rerr != nil {
			continue
		}
		var instead []string
		if r.strategy != opts.normalized().Strategy {
			instead = append(instead, fmt.Sprintf("as %s (the planner's choice, as with --strategy auto)", rp.Strategy))
		}
		if r.unpin {
			names := map[string]string{}
			for _, n := range nodes {
				names[n.ID] = cmp.Or(n.Name, n.ID)
			}
			var used []string
			for _, id := range rp.Nodes() {
				used = append(used, cmp.Or(names[id], id))
			}
			instead = append(instead, fmt.Sprintf("on %s, the %d node(s) the planner chose, rather than exactly the %d asked for", strings.Join(used, ", "), len(used), len(opts.Pin)))
		}
		rp.Fallback = &Fallback{Reason: reason, Strategy: r.strategy, Unpinned: r.unpin,
			Msg: fmt.Sprintf("%s: planned instead %s", reason, strings.Join(instead, " and "))}
		rp.Explain = append([]string{"fallback: " + rp.Fallback.Msg}, rp.Explain...)
		return rp, nil
	}
	fe2 := *fe
	fe2.Msg = fe.Msg + " (and no other strategy or set of nodes fits it either)"
	return p, &fe2
}

// shapeReason says why a forced strategy or pinned node set cannot take
// the model's shape, or "" when the shape is not why.
func shapeReason(profile *ModelProfile, nodes []Node, opts Options) string {
	o := opts.normalized()
	n := len(o.Pin)
	if n == 0 {
		for _, nd := range nodes {
			if nd.Schedulable() && !contains(o.Exclude, nd.ID) {
				n++
			}
		}
	}
	switch {
	case o.Strategy == Pipeline && n > profile.NLayer:
		return fmt.Sprintf("strategy pipeline puts a stage of at least one whole layer on each node, and model %s has %d layers for %d nodes", profile.Name, profile.NLayer, n)
	case o.Strategy == Tensor && profile.NExpert == 0 && n > profile.HeadUnits():
		return fmt.Sprintf("strategy tensor gives each node a slice of the heads, and model %s's %d heads cut into at most %d slices (groups of %d) for %d nodes", profile.Name, profile.NHead, profile.HeadUnits(), profile.HeadUnit, n)
	}
	return ""
}

// placeExact is Place keeping to opts: a *FitError when they fit no plan.
func placeExact(profile ModelProfile, nodes []Node, links LinkMatrix, opts Options) (Plan, error) {
	o := opts.normalized()
	switch o.Strategy {
	case Auto, Pipeline, Tensor:
	default:
		return Plan{}, fmt.Errorf("placement: unknown strategy %q (want auto, pipeline or tensor)", o.Strategy)
	}
	// Nothing is allocated in proportion to the profile's numbers before
	// they are checked: they come from a file's header through the Raft log.
	if err := profile.Validate(); err != nil {
		return Plan{}, fmt.Errorf("placement: model profile %.64q: %w", profile.Name, err)
	}
	if err := o.validate(); err != nil {
		return Plan{}, err
	}
	prefill, decode, why, err := disaggPools(nodes, o)
	if err != nil {
		return Plan{}, err
	}
	if len(prefill) > 0 {
		return placeDisagg(profile, prefill, decode, links, o, why+" ("+poolNames(prefill)+" | "+poolNames(decode)+")")
	}
	eligible, skipped, err := eligibleNodes(nodes, o)
	if err != nil {
		return Plan{}, err
	}
	e := newEnv(&profile, eligible, links, o)
	var explain []string
	line := fmt.Sprintf("nodes: %d eligible (%s)", len(eligible), strings.Join(e.ids(allOf(len(eligible))), ", "))
	if len(skipped) > 0 {
		line += "; skipped " + strings.Join(skipped, ", ")
	}
	explain = append(explain, line)
	need := e.need()
	usable := 0.0
	for _, u := range e.usable {
		usable += math.Max(0, u)
	}
	kvType := o.KVType
	if kvType == "" {
		kvType = "f16"
	}
	explain = append(explain, fmt.Sprintf("model: %s weights + %s KV (%s, %d bytes per token, %d tokens x %d seq); usable %s (free x %.2f - %s overhead per node)",
		GiB(profile.WeightBytes()), GiB(uint64(need)-profile.WeightBytes()), kvType, uint64(profile.NLayer)*e.p.KVBytesPerToken, o.Context, o.Batch, GiB(uint64(usable)), 1-o.SafetyMargin, GiB(o.Overhead)))
	if len(eligible) == 0 {
		return Plan{}, &FitError{Model: profile.Name, Need: uint64(need), Msg: fmt.Sprintf("placement: no node can take model %s: %s", profile.Name, strings.Join(skipped, ", "))}
	}

	s := &search{e: e, cache: map[string]*candidate{}}
	s.run()
	if s.best == nil {
		return Plan{}, e.fitError(need, usable, s.evaluated)
	}
	best := s.best
	p := Plan{
		Version:  o.Version,
		Model:    profile.Name,
		Strategy: best.strategy(),
		Pools:    []Pool{{Role: RoleShared, Stages: best.stages, Cost: best.cost}},
		Cost:     best.cost,
		Context:  o.Context,
		Batch:    o.Batch,
		KVType:   o.KVType,
	}
	p.Explain = append(explain, e.why(s)...)
	return p, nil
}

func allOf(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func (e *env) ids(group []int) []string {
	out := make([]string, len(group))
	for i, m := range group {
		out[i] = e.nodes[m].ID
	}
	return out
}

// need is the model's weights plus the KV cache for the options.
func (e *env) need() float64 {
	return float64(e.p.WeightBytes()) + e.kvBytes(0, e.p.NLayer)
}

// eligibleNodes applies status, drain, exclude and pin; it returns the nodes
// sorted by ID with unmeasured capabilities defaulted, and why others were
// skipped.
func eligibleNodes(nodes []Node, o Options) ([]Node, []string, error) {
	sorted := slices.Clone(nodes)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].ID == sorted[i-1].ID {
			return nil, nil, fmt.Errorf("placement: node %q listed twice", sorted[i].ID)
		}
	}
	in := func(list []string, id string) bool { return slices.Contains(list, id) }
	for _, id := range o.Pin {
		if !slices.ContainsFunc(sorted, func(n Node) bool { return n.ID == id }) {
			return nil, nil, fmt.Errorf("placement: pinned node %q is not in the cluster", id)
		}
		if in(o.Exclude, id) {
			return nil, nil, fmt.Errorf("placement: node %q is both pinned and excluded", id)
		}
	}
	var out []Node
	var skipped []string
	for _, n := range sorted {
		switch {
		case n.Status != StatusAlive:
			if in(o.Pin, n.ID) {
				return nil, nil, fmt.Errorf("placement: pinned node %s is %s", n.ID, n.Status)
			}
			skipped = append(skipped, fmt.Sprintf("%s (%s)", n.ID, n.Status))
		case n.Draining:
			if in(o.Pin, n.ID) {
				return nil, nil, fmt.Errorf("placement: pinned node %s is draining", n.ID)
			}
			skipped = append(skipped, n.ID+" (draining)")
		case in(o.Exclude, n.ID):
			skipped = append(skipped, n.ID+" (excluded)")
		case len(o.Pin) > 0 && !in(o.Pin, n.ID):
			skipped = append(skipped, n.ID+" (not pinned)")
		default:
			n.GFLOPS = measured(n.GFLOPS, DefaultGFLOPS)
			n.MemGBps = measured(n.MemGBps, DefaultMemGBps)
			out = append(out, n)
		}
	}
	return out, skipped, nil
}

// minMeasured is the least compute (GFLOPS) or memory bandwidth (GB/s) a
// node is taken to have: below it a step's time would overflow to +Inf.
const minMeasured = 1e-3

// measured is a node's measured number as the planner uses it: def when it
// was never measured (0, or not a finite number), at least minMeasured.
func measured(v, def float64) float64 {
	switch {
	case !(v > 0) || math.IsInf(v, 0):
		return def
	case v < minMeasured:
		return minMeasured
	}
	return v
}

// search walks the arrangements: every single node, and for a node set the
// pure pipeline, the single TP group, groups of nodes joined by equally fast
// links, and fixed-size groups; the node set starts as every eligible node
// and loses, one at a time, the node whose removal helps most.
type search struct {
	e         *env
	cache     map[string]*candidate // by key; nil when the strategy forbids it
	best      *candidate
	second    *candidate
	bestOne   *candidate // the best single-node plan
	evaluated int
	feasible  int
}

func (s *search) consider(groups [][]int) *candidate { return s.considerAs(groups, false) }

// considerAs is consider, saying whether fastFirst made groups.
func (s *search) considerAs(groups [][]int, fast bool) *candidate {
	e := s.e
	k := e.key(groups)
	if c, ok := s.cache[k]; ok {
		return c
	}
	if !s.allowed(groups) {
		s.cache[k] = nil
		return nil
	}
	s.evaluated++
	c := e.evaluate(groups)
	c.fastFirst = fast
	s.cache[k] = c
	if !c.ok {
		return c
	}
	s.feasible++
	if c.strategy() == "single" && e.better(c, s.bestOne) {
		s.bestOne = c
	}
	switch {
	case e.better(c, s.best):
		s.second, s.best = s.best, c
	case e.better(c, s.second):
		s.second = c
	}
	return c
}

// allowed applies a forced strategy. A single node always qualifies when
// it is the only eligible one.
func (s *search) allowed(groups [][]int) bool {
	n := len(s.e.nodes)
	switch s.e.o.Strategy {
	case Pipeline:
		for _, g := range groups {
			if len(g) != 1 {
				return false
			}
		}
		return len(groups) > 1 || n == 1
	case Tensor:
		return len(groups) == 1 && (len(groups[0]) > 1 || n == 1)
	}
	return true
}

func (s *search) run() {
	e := s.e
	all := allOf(len(e.nodes))
	if len(e.o.Pin) == 0 {
		for _, i := range all {
			s.consider([][]int{{i}})
		}
	}
	set := all
	cur := s.bestFor(set)
	minNodes := 2
	if len(e.o.Pin) > 0 {
		return // the pinned set is used whole
	}
	for len(set) > minNodes {
		var next []int
		var nextBest *candidate
		for i := range set {
			sub := slices.Delete(slices.Clone(set), i, i+1)
			if c := s.bestFor(sub); e.better(c, nextBest) {
				next, nextBest = sub, c
			}
		}
		if nextBest == nil && cur == nil {
			// Nothing fits on these nodes, nor on any set one node fewer
			// (several nodes too small to hold a part): drop the one with
			// the least usable memory and go on.
			least := 0
			for k, i := range set {
				if e.usable[i] < e.usable[set[least]] {
					least = k
				}
			}
			set = slices.Delete(slices.Clone(set), least, least+1)
			cur = s.bestFor(set)
			continue
		}
		if nextBest == nil || (cur != nil && !e.better(nextBest, cur)) {
			return
		}
		set, cur = next, nextBest
	}
}

// bestFor evaluates the arrangements of exactly the nodes in set.
func (s *search) bestFor(set []int) *candidate {
	var best *candidate
	for _, groups := range s.e.partitions(set) {
		if c := s.consider(groups); c != nil && s.e.better(c, best) {
			best = c
		}
		if fast := s.e.fastFirst(groups); fast != nil {
			if c := s.considerAs(fast, true); c != nil && s.e.better(c, best) {
				best = c
			}
		}
	}
	return best
}

// fastFirst is groups with each group's member that runs the embedding and
// output fastest moved to rank 0, or nil when every group already starts
// with it. Rank 0 holds those (the output matrix outweighs a small model's
// layers): ranked by memory alone, a GPU node with a little less free
// memory than a CPU node would leave the output on the CPU and, balancing
// the rest, take the whole split part, a tensor group in name only.
func (e *env) fastFirst(groups [][]int) [][]int {
	var out [][]int
	for gi, g := range groups {
		first, last := gi == 0, gi == len(groups)-1
		if !first && !last {
			continue // a middle stage's rank 0 holds nothing more
		}
		extras := e.extras(first, last)
		best := 0
		for r := 1; r < len(g); r++ {
			if e.time(g[r], extras) < e.time(g[best], extras)*(1-1e-9) {
				best = r
			}
		}
		if best == 0 {
			continue
		}
		if out == nil {
			out = make([][]int, len(groups))
			for i := range groups {
				out[i] = slices.Clone(groups[i])
			}
		}
		out[gi] = append([]int{g[best]}, slices.Delete(slices.Clone(g), best, best+1)...)
	}
	return out
}

// partitions lists the arrangements tried for a node set (IDs ascending).
// Members of a group are ranked by usable memory (rank 0 holds the
// embedding or output; bestFor also tries fastFirst's order), stages are
// ordered by their first node's ID, except that with DriverBytes the
// stage whose rank 0 has the most room comes first (it drives).
func (e *env) partitions(set []int) [][][]int {
	var out [][][]int
	seen := map[string]bool{}
	add := func(groups [][]int) {
		for _, g := range groups {
			sort.SliceStable(g, func(i, j int) bool {
				if e.usable[g[i]] != e.usable[g[j]] {
					return e.usable[g[i]] > e.usable[g[j]]
				}
				return g[i] < g[j]
			})
		}
		sort.SliceStable(groups, func(i, j int) bool { return slices.Min(groups[i]) < slices.Min(groups[j]) })
		if e.driverMem() > 0 {
			// The driver holds more (a draft model): the group whose rank
			// 0 has the most room goes first.
			roomy := 0
			for gi, g := range groups {
				if e.usable[g[0]] > e.usable[groups[roomy][0]] {
					roomy = gi
				}
			}
			groups = append(append([][]int{groups[roomy]}, groups[:roomy]...), groups[roomy+1:]...)
		}
		k := e.key(groups)
		if !seen[k] {
			seen[k] = true
			out = append(out, groups)
		}
	}
	single := make([][]int, len(set))
	for i, m := range set {
		single[i] = []int{m}
	}
	add(single)
	if len(set) > 1 {
		add([][]int{slices.Clone(set)})
	}
	// Groups joined by links at least as fast as each measured bandwidth.
	var bws []float64
	for i, a := range set {
		for _, b := range set[i+1:] {
			bws = append(bws, math.Min(e.links.Get(e.nodes[a].ID, e.nodes[b].ID).Gbit, e.links.Get(e.nodes[b].ID, e.nodes[a].ID).Gbit))
		}
	}
	slices.Sort(bws)
	bws = slices.Compact(bws)
	for _, t := range bws {
		var groups [][]int
		for _, m := range set {
			placed := false
			for gi, g := range groups {
				fast := true
				for _, x := range g {
					if e.links.Get(e.nodes[x].ID, e.nodes[m].ID).Gbit < t || e.links.Get(e.nodes[m].ID, e.nodes[x].ID).Gbit < t {
						fast = false
						break
					}
				}
				if fast {
					groups[gi] = append(groups[gi], m)
					placed = true
					break
				}
			}
			if !placed {
				groups = append(groups, []int{m})
			}
		}
		add(groups)
	}
	// Fixed-size groups in ID order.
	for k := 2; k <= 4 && k < len(set); k++ {
		var groups [][]int
		for i := 0; i < len(set); i += k {
			groups = append(groups, slices.Clone(set[i:min(i+k, len(set))]))
		}
		add(groups)
	}
	return out
}

// evaluate splits the layers among the stages of groups, the heads, FFN
// columns and experts among the members of each stage, and costs the result.
func (e *env) evaluate(groups [][]int) *candidate {
	c := &candidate{groups: groups}
	if len(groups) > e.p.NLayer {
		return c
	}
	for _, g := range groups {
		if len(g) > 1 && len(g) > e.p.HeadUnits() && len(g) > e.p.NExpert {
			return c // more members than head slices and experts
		}
	}
	split := e
	if e.o.Prompt > 0 {
		// Stages balanced for a piece of the prompt.
		split = e.prefillEnv(prefillTokens(len(groups), e.o.Prompt), float64(e.o.Prompt)/2)
	}
	bounds := split.splitLayers(groups)
	if bounds == nil {
		return c
	}
	c.bounds = bounds
	stages := make([]Stage, len(groups))
	for k, g := range groups {
		st, ok := e.allocate(g, bounds[k], bounds[k+1], k == 0, k == len(groups)-1)
		if !ok {
			return c
		}
		stages[k] = st
	}
	c.stages = stages
	c.cost = e.cost(groups, stages)
	c.ok = e.predictPrompt(c)
	return c
}

// predictPrompt sets c.prefill, the predicted prefill of the prompt a plan
// for prompts is made for (Options.Prompt; nothing for decode, or in the
// env of a prefill piece itself), and reports whether it could.
func (e *env) predictPrompt(c *candidate) bool {
	if e.o.Prompt <= 0 || e.prefill {
		return true
	}
	pf, ok := e.prefillOf(c.groups, c.bounds, e.o.Prompt)
	c.prefill = pf
	return ok
}

// entryMs is the hop into stage k: from rank 0 of the previous stage (or,
// for the first stage, from its own rank 0, which embeds) to its members.
func (e *env) entryMs(groups [][]int, k int) float64 {
	src := groups[0][0]
	if k > 0 {
		src = groups[k-1][0]
	}
	return e.fanoutMs(src, groups[k])
}

// splitLayers finds the contiguous layer split that minimizes the slowest
// stage (so a full pipeline's stages take equal time, each in proportion
// to its speed) within every stage's memory: a bisection on the stage time
// with a greedy fill. nil when the stages cannot hold the model.
func (e *env) splitLayers(groups [][]int) []int {
	k := len(groups)
	L := e.p.NLayer
	entry := make([]float64, k)
	for i := range groups {
		entry[i] = e.entryMs(groups, i)
	}
	// fill assigns layers greedily under limit T; nil if it cannot place all.
	fill := func(T float64) []int {
		b := make([]int, k+1)
		lo := 0
		for i := range k {
			first, last := i == 0, i == k-1
			maxHi := L - (k - 1 - i) // leave a layer for every later stage
			if last {
				maxHi = L
			}
			fits := func(hi int) bool {
				t, ok := e.stageEstimate(groups[i], lo, hi, first, last, entry[i])
				return ok && t <= T
			}
			if !fits(lo + 1) {
				return nil
			}
			if last {
				if !fits(L) {
					return nil
				}
				b[i+1] = L
				break
			}
			// largest hi in (lo, maxHi] that fits (time and memory grow with hi)
			a, z := lo+1, maxHi
			for a < z {
				m := (a + z + 1) / 2
				if fits(m) {
					a = m
				} else {
					z = m - 1
				}
			}
			b[i+1] = a
			lo = a
		}
		return b
	}
	inf := fill(math.Inf(1))
	if inf == nil {
		return nil
	}
	hiT := 0.0
	for i := range k {
		t, _ := e.stageEstimate(groups[i], inf[i], inf[i+1], i == 0, i == k-1, entry[i])
		hiT = math.Max(hiT, t)
	}
	best := inf
	loT := 0.0
	for range 40 {
		mid := (loT + hiT) / 2
		if b := fill(mid); b != nil {
			best, hiT = b, mid
		} else {
			loT = mid
		}
		if hiT-loT < 1e-9*hiT {
			break
		}
	}
	return best
}

// allocate turns continuous shares into whole head slices, FFN blocks and
// experts for the members of group on layers [lo,hi), moving slices off any
// member that rounding pushed past its memory.
func (e *env) allocate(group []int, lo, hi int, first, last bool) (Stage, bool) {
	p := e.p
	g := len(group)
	sp := e.stageParts(lo, hi)
	fixed := e.stageFixed(group, sp, first, last)
	sh := e.shares(group, sp, fixed)
	if sh == nil {
		return Stage{}, false
	}
	type dim struct {
		units int
		whole work // the dimension's total work
		n     []int
	}
	dims := []*dim{
		{units: p.HeadUnits(), whole: sp.attn},
		{units: p.FFNUnits(), whole: sp.ffn},
		{units: p.NExpert, whole: sp.exp},
	}
	for _, d := range dims {
		d.n = apportion(sh, d.units)
	}
	// With heads split finer than GQA groups, a member holds the whole
	// KV head of each group it has part of (its K and V weights and
	// cache): the most that can be beyond its share of heads.
	kvWhole := e.kvBytes(lo, hi) + (e.attnB[hi]-e.attnB[lo])*float64(p.NHeadKV)/float64(p.NHead+p.NHeadKV)
	subGroup := p.NHeadKV > 0 && p.NHead%p.NHeadKV == 0 && p.HeadUnit < p.NHead/p.NHeadKV
	replicaBound := func(r int) float64 {
		q := dims[0].n[r] * p.HeadUnit
		if !subGroup || q == 0 {
			return 0
		}
		gq := p.NHead / p.NHeadKV
		held := min(p.NHeadKV, (q+gq-1)/gq+1)
		return max(0, float64(held)/float64(p.NHeadKV)-float64(q)/float64(p.NHead)) * kvWhole
	}
	memOf := func(r int) float64 {
		w := fixed[r]
		for _, d := range dims {
			if d.units > 0 {
				w = w.add(d.whole.scale(float64(d.n[r]) / float64(d.units)))
			}
		}
		return w.mem + replicaBound(r)
	}
	unitMem := func(d *dim) float64 { return d.whole.mem / float64(max(d.units, 1)) }
	// Repair: move a unit from an over-full member to the roomiest one.
	for iter := 0; iter < 4*(p.HeadUnits()+p.FFNUnits()+p.NExpert+1); iter++ {
		over := -1
		for r := range group {
			if memOf(r) > e.usable[group[r]] && (over < 0 || memOf(r)-e.usable[group[r]] > memOf(over)-e.usable[group[over]]) {
				over = r
			}
		}
		if over < 0 {
			break
		}
		moved := false
		order := []int{0, 1, 2}
		sort.SliceStable(order, func(i, j int) bool { return unitMem(dims[order[i]]) > unitMem(dims[order[j]]) })
		for _, di := range order {
			d := dims[di]
			if d.units == 0 || d.n[over] == 0 {
				continue
			}
			// The member that still has the most room once it took the
			// unit (a head unit can bring a replicated KV head with it).
			to, room := -1, 0.0
			for r := range group {
				if r == over {
					continue
				}
				d.n[over]--
				d.n[r]++
				sl := e.usable[group[r]] - memOf(r)
				d.n[over]++
				d.n[r]--
				if sl >= 0 && (to < 0 || sl > room) {
					to, room = r, sl
				}
			}
			if to >= 0 {
				d.n[over]--
				d.n[to]++
				moved = true
				break
			}
		}
		if !moved {
			return Stage{}, false
		}
	}
	// Balance: rounding to whole units can leave one member slow; move
	// units off the slowest member while that lowers the stage's time.
	timeOf := func(r int) float64 {
		w := fixed[r]
		for _, d := range dims {
			if d.units > 0 {
				w = w.add(d.whole.scale(float64(d.n[r]) / float64(d.units)))
			}
		}
		return e.time(group[r], w)
	}
	maxTime := func() (float64, int) {
		t, at := -1.0, 0
		for r := range group {
			if x := timeOf(r); x > t {
				t, at = x, r
			}
		}
		return t, at
	}
	for iter := 0; g > 1 && iter < 4*(p.HeadUnits()+p.FFNUnits()+p.NExpert+1); iter++ {
		cur, slow := maxTime()
		bestT, bestD, bestTo := cur*(1-1e-9), -1, -1
		for di, d := range dims {
			if d.units == 0 || d.n[slow] == 0 {
				continue
			}
			for to := range group {
				if to == slow {
					continue
				}
				d.n[slow]--
				d.n[to]++
				// memOf after the move: a head unit can bring a whole
				// replicated KV head with it.
				if t, _ := maxTime(); t < bestT && memOf(to) <= e.usable[group[to]] {
					bestT, bestD, bestTo = t, di, to
				}
				d.n[slow]++
				d.n[to]--
			}
		}
		if bestD < 0 {
			break
		}
		dims[bestD].n[slow]--
		dims[bestD].n[bestTo]++
	}
	st := Stage{Lo: lo, Hi: hi, Members: make([]Member, g)}
	hLo, fLo, xLo := 0, 0, 0
	for r, m := range group {
		mb := Member{Node: e.nodes[m].ID, TPRank: r, TPSize: g, Embedding: first && r == 0, Output: last && r == 0}
		mb.HeadLo, mb.HeadHi = hLo*p.HeadUnit, (hLo+dims[0].n[r])*p.HeadUnit
		hLo += dims[0].n[r]
		if p.FFNDim > 0 {
			mb.FFNLo, mb.FFNHi = fLo*p.FFNUnit, (fLo+dims[1].n[r])*p.FFNUnit
			fLo += dims[1].n[r]
		}
		if p.NExpert > 0 {
			mb.Experts = make([]int, 0, dims[2].n[r])
			for x := xLo; x < xLo+dims[2].n[r]; x++ {
				mb.Experts = append(mb.Experts, x)
			}
			xLo += dims[2].n[r]
		}
		w := fixed[r]
		for _, d := range dims {
			if d.units > 0 {
				w = w.add(d.whole.scale(float64(d.n[r]) / float64(d.units)))
			}
		}
		kvShare := float64(dims[0].n[r]) / float64(dims[0].units)
		if p.NHeadKV > 0 && p.NHead%p.NHeadKV == 0 {
			// A member holding part of a GQA group holds its whole KV head
			// (its K and V weights and cache), as does the next member.
			qShare := kvShare
			lo, hi := (&model.Slice{HeadLo: mb.HeadLo, HeadHi: mb.HeadHi}).KVHeads(&model.Config{NHead: p.NHead, NHeadKV: p.NHeadKV})
			kvShare = float64(hi-lo) / float64(p.NHeadKV)
			if extra := kvShare - qShare; extra > 0 {
				w.mem += extra * kvWhole
			}
		}
		if w.mem > e.usable[m] {
			return Stage{}, false
		}
		mb.MemBytes = uint64(w.mem) + e.o.Overhead
		mb.KVBytes = uint64(e.kvBytes(lo, hi) * kvShare)
		mb.Ms = e.time(m, w)
		if g := e.gpuShare(m, w.mem); g > 0 {
			mb.GPULayers = min(hi-lo, int(g*float64(hi-lo)+1e-9))
		}
		st.Members[r] = mb
	}
	return st, true
}

// apportion splits units in proportion to shares by largest remainder;
// ties go to the lower rank.
func apportion(shares []float64, units int) []int {
	n := make([]int, len(shares))
	if units == 0 {
		return n
	}
	type rem struct {
		r int
		f float64
	}
	rems := make([]rem, len(shares))
	left := units
	for r, s := range shares {
		x := s * float64(units)
		if !(x >= 0) { // NaN or negative: nothing
			x = 0
		}
		x = min(x, float64(units))
		n[r] = int(math.Floor(x + 1e-9))
		left -= n[r]
		rems[r] = rem{r, x - float64(n[r])}
	}
	sort.SliceStable(rems, func(i, j int) bool { return rems[i].f > rems[j].f })
	for i := 0; left > 0; i = (i + 1) % len(rems) {
		n[rems[i].r]++
		left--
	}
	for i := 0; left < 0; i = (i + 1) % len(rems) { // rounding overshoot
		if r := rems[len(rems)-1-i].r; n[r] > 0 {
			n[r]--
			left++
		}
	}
	return n
}

// cost adds up a decode step: each stage's slowest member (attributed to
// compute or memory by which bound it), the hops between stages, the
// all-reduces and the sampled token's trip back to the first stage.
func (e *env) cost(groups [][]int, stages []Stage) Cost {
	var c Cost
	for k := range stages {
		st := &stages[k]
		g := groups[k]
		slow, slowR := -1.0, 0
		for r := range st.Members {
			if st.Members[r].Ms > slow {
				slow, slowR = st.Members[r].Ms, r
			}
		}
		comp, mem := e.times(g[slowR], e.memberWork(st, slowR))
		c.ComputeMs += comp
		c.MemoryMs += mem
		net := e.entryMs(groups, k) + float64(2*(st.Hi-st.Lo))*e.allReduceMs(g)
		c.NetworkMs += net
		st.Ms = slow + net
		c.MsPerToken += st.Ms
		c.BottleneckMs = math.Max(c.BottleneckMs, st.Ms)
	}
	last, first := groups[len(groups)-1][0], groups[0][0]
	ret := e.sendMs(last, first, e.batch*4)
	c.NetworkMs += ret
	c.MsPerToken += ret
	return c
}

// memberWork recomputes the work of member r of a planned stage.
func (e *env) memberWork(st *Stage, r int) work {
	p := e.p
	m := &st.Members[r]
	sp := e.stageParts(st.Lo, st.Hi)
	w := sp.fixed.add(e.extras(m.Embedding, m.Output))
	w = w.add(sp.attn.scale(float64(m.HeadHi-m.HeadLo) / float64(p.NHead)))
	if p.FFNDim > 0 {
		w = w.add(sp.ffn.scale(float64(m.FFNHi-m.FFNLo) / float64(p.FFNDim)))
	}
	if p.NExpert > 0 {
		w = w.add(sp.exp.scale(float64(len(m.Experts)) / float64(p.NExpert)))
	}
	return w
}

func (e *env) fitError(need, usable float64, evaluated int) error {
	p := e.p
	n := len(e.nodes)
	fe := &FitError{Model: p.Name, Need: uint64(need), Usable: uint64(math.Max(0, usable)), Nodes: n}
	what := fmt.Sprintf("weights %s + KV cache %s for %d tokens x %d sequences", GiB(p.WeightBytes()), GiB(uint64(need)-p.WeightBytes()), e.o.Context, e.o.Batch)
	plural := "s"
	if n == 1 {
		plural = ""
	}
	if need > usable {
		fe.Msg = fmt.Sprintf("placement: model %s needs %s (%s), the best plan fits %s across %d node%s (free memory x %.2f minus %s overhead each); add nodes or memory, shorten the context, or use a smaller quantization",
			p.Name, GiB(uint64(need)), what, GiB(fe.Usable), n, plural, 1-e.o.SafetyMargin, GiB(e.o.Overhead))
	} else {
		fe.Msg = fmt.Sprintf("placement: model %s needs %s (%s) and %d node%s offer %s, but none of %d arrangements (strategy %s) fits: layers are whole, heads split in groups of %d, the first and last stages also hold the embedding (%s) and output (%s)",
			p.Name, GiB(uint64(need)), what, n, plural, GiB(fe.Usable), evaluated, e.o.Strategy, p.HeadUnit, GiB(p.EmbedBytes), GiB(p.OutputBytes))
	}
	return fe
}

// why explains the choice in a few lines.
func (e *env) why(s *search) []string {
	b := s.best
	var out []string
	// ttft is a candidate's predicted prefill of the prompt planned for.
	ttft := func(c *candidate) string {
		if e.o.Prompt <= 0 {
			return ""
		}
		return fmt.Sprintf(", %.0f ms to prefill %d tokens", c.prefill.Ms, e.o.Prompt)
	}
	if e.o.Prompt > 0 {
		by := fmt.Sprintf("the time to first token of a %d-token prompt", e.o.Prompt)
		if e.o.Generate > 0 {
			by = fmt.Sprintf("the time of a request of %d prompt tokens and %d generated", e.o.Prompt, e.o.Generate)
		}
		out = append(out, fmt.Sprintf("planned for prompts (--plan-prompt): stages balanced for prefill, arrangements compared by %s", by))
	}
	out = append(out, fmt.Sprintf("chose %s [%s]: %.2f ms/token (compute %.2f, memory %.2f, network %.2f)%s; %d of %d arrangements fit",
		b.strategy(), e.key(b.groups), b.cost.MsPerToken, b.cost.ComputeMs, b.cost.MemoryMs, b.cost.NetworkMs, ttft(b), s.feasible, s.evaluated))
	if s.second != nil {
		out = append(out, fmt.Sprintf("runner-up %s [%s]: %.2f ms/token%s", s.second.strategy(), e.key(s.second.groups), s.second.cost.MsPerToken, ttft(s.second)))
	}
	if s.bestOne != nil && s.bestOne != b && s.bestOne != s.second {
		out = append(out, fmt.Sprintf("best single node %s: %.2f ms/token%s", e.nodes[s.bestOne.groups[0][0]].ID, s.bestOne.cost.MsPerToken, ttft(s.bestOne)))
	} else if s.bestOne == nil {
		big := 0
		for i := range e.nodes {
			if e.usable[i] > e.usable[big] {
				big = i
			}
		}
		if len(e.o.Pin) > 0 && len(e.nodes) > 1 && e.evaluate([][]int{{big}}).ok {
			// Pinned nodes are used whole: single nodes are not weighed.
			out = append(out, fmt.Sprintf("uses all %d nodes it is held to (pinned, or a re-plan's survivors); %s alone would hold it", len(e.nodes), e.nodes[big].ID))
		} else {
			out = append(out, fmt.Sprintf("no single node holds it (largest usable: %s %s)", e.nodes[big].ID, GiB(uint64(math.Max(0, e.usable[big])))))
		}
	}
	if len(b.groups) > 1 {
		var ls []string
		for _, st := range b.stages {
			ls = append(ls, fmt.Sprint(st.Hi-st.Lo))
		}
		what := "stage times"
		if e.o.Prompt > 0 {
			what = fmt.Sprintf("the stages' prefill of %d-token pieces", prefillTokens(len(b.groups), e.o.Prompt))
		}
		out = append(out, fmt.Sprintf("layers split %s to balance %s within memory; bottleneck stage %.2f ms", strings.Join(ls, "/"), what, b.cost.BottleneckMs))
	}
	for k, g := range b.groups {
		if len(g) < 2 {
			continue
		}
		slow := Link{Gbit: math.Inf(1)}
		direct := math.Inf(1) // the ring's slowest direct link; 0 when one has none
		for r := range g {
			l := e.links.Get(e.nodes[g[r]].ID, e.nodes[g[(r+1)%len(g)]].ID)
			if l.Gbit < slow.Gbit {
				slow = l
			}
			direct = math.Min(direct, l.DirectGbit)
		}
		st := b.stages[k]
		ar := float64(2*(st.Hi-st.Lo)) * e.allReduceMs(g)
		over := fmt.Sprintf("links >= %g Gbit/s", slow.Gbit)
		if direct > 0 && !math.IsInf(direct, 1) {
			over = fmt.Sprintf("direct links (TCP) >= %.3g Gbit/s", direct)
		}
		out = append(out, fmt.Sprintf("stage %d TP group of %d over %s, %g ms: all-reduces %.2f ms/token", k, len(g), over, slow.LatencyMs, ar))
	}
	return out
}
