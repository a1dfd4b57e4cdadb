package coordinator

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"shoal/placement"
)

// planModels is the leader's model loop: every model that has a digest and
// a profile gets a plan from placement.Replan over the schedulable nodes,
// and when nodes join, drain, leave or fail it is planned again. Replan
// prefers the candidate that moves the fewest bytes among those within
// placement.ReplanSlack of the fastest. When nothing fits, the model is
// marked unservable with the planner's reason and its plan emptied.
func (s *Server) planModels() {
	st := s.fsm.State()
	names := make([]string, 0, len(st.Models))
	for n := range st.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	s.mu.Lock()
	if s.planSig == nil {
		s.planSig = map[string]string{}
	}
	s.mu.Unlock()
	for _, name := range names {
		m := st.Models[name]
		if p := st.Plans[name]; m.Status == ModelFailed && p != nil && len(p.Pools) > 0 {
			// A model that failed after it was planned (a hub file whose
			// check failed once its nodes held their ranges) releases them.
			empty := placement.Plan{Version: p.Version + 1, Model: name, Explain: []string{"the model failed: " + m.Reason}}
			for _, id := range p.Nodes() {
				empty.Moved = append(empty.Moved, id+": released")
			}
			if err := s.Apply(PlanSetType, PlanSetRequest{Plan: empty, Inputs: st.PlanInputs[name]}, applyTimeout); err != nil {
				s.log.Warn("releasing a failed model's plan", zap.String("model", name), zap.Error(err))
			}
			continue
		}
		if m.Digest == "" || m.Profile == nil || m.Status == ModelFailed || m.Status == ModelHashing {
			continue
		}
		sig := planSignature(st, m)
		if err := m.Profile.Validate(); err != nil {
			// The FSM keeps no such model (it refuses the upsert and drops
			// it from a snapshot); should one be there all the same, it is
			// not planned: nothing is allocated for its numbers.
			s.mu.Lock()
			if s.planSig[name] != sig {
				s.planSig[name] = sig
				s.log.Error("not planning a model whose profile is out of bounds", zap.String("model", name), zap.Error(err))
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		same := s.planSig[name] == sig
		if !same && m.Status == ModelPlanned && nothingNew(st, m, st.PlanInputs[name]) {
			// The plan stands: planning again could only find it slower
			// or, through this leader's view of the links, move its
			// driver for nothing.
			s.planSig[name], same = sig, true
		}
		if !same && m.Status == ModelPlanned && loadingKeeps(st, m, st.PlanInputs[name]) {
			// A better plan may exist, but nothing forces a move and the
			// nodes are still loading this one: it is weighed again once
			// they hold it (the signature then changes).
			s.planSig[name], same = sig, true
			s.log.Info("keeping a plan its nodes are still loading; it is weighed again once loaded", zap.String("model", name),
				zap.Uint64("version", st.Plans[name].Version))
		}
		s.mu.Unlock()
		if same {
			continue
		}
		if err := s.planModel(st, m, st.Plans[name]); err != nil {
			s.log.Warn("planning failed", zap.String("model", name), zap.Error(err))
			continue // try again on the next pass
		}
		// Remember the inputs only once the decision is committed; the
		// commit itself changes the state, so read the signature again.
		st = s.fsm.State()
		sig = planSignature(st, m)
		s.mu.Lock()
		s.planSig[name] = sig
		s.mu.Unlock()
	}
}

// planSignature is what planning model m reads of the state: its inputs,
// the model's status (as the state has it now), m's registration and its
// plan's version; planning runs again when it changes.
func planSignature(st *State, m *Model) string {
	status := ""
	if cur := st.Models[m.Name]; cur != nil {
		status = cur.Status
	}
	// The registration planned: a model unloaded and loaded again while
	// it was planned is planned again, though its inputs are the same.
	sig := planInputs(st, m) + "|" + status + "|" + m.CreatedAt.String()
	if p := st.Plans[m.Name]; p != nil {
		sig += fmt.Sprintf("|v%d", p.Version)
		if len(p.Pools) > 0 && !PlanLoaded(st, m, p) {
			sig += "|loading"
		}
	}
	return sig
}

// PlanLoaded says whether every node of plan p of model m holds its shards
// ready (reported for p's version) and m's file is checked (a hub file's
// check has ended): the model serves as planned, and no node reads its
// ranges from another.
func PlanLoaded(st *State, m *Model, p *placement.Plan) bool {
	if m.Unverified {
		return false
	}
	for _, id := range p.Nodes() {
		if s := st.Shards[ShardKey(id, m.Name)]; s == nil || s.PlanVersion != p.Version || s.State != ShardReady {
			return false
		}
	}
	return true
}

// loadingKeeps says whether model m's plan stands for now although
// something changed that could make a better one (a link measured, a node
// joined or offering more): the model's settings are those it was planned
// with (inputs) and every node of the plan is schedulable, so nothing
// forces a move, and the nodes are still loading it (fetching their
// shards or, for a hub file, holding them until its check ends). Moving
// it now would throw away what they fetched (a hub file's ranges are read
// from the hub again) for a plan whose speed matters only once the model
// serves; once loaded it is weighed again, and the layers that move are
// read from the nodes that hold them.
func loadingKeeps(st *State, m *Model, inputs string) bool {
	p := st.Plans[m.Name]
	if inputs == "" || p == nil || len(p.Pools) == 0 || PlanLoaded(st, m, p) {
		return false
	}
	then, now := strings.SplitN(inputs, "\n", 2)[0], strings.SplitN(planInputs(st, m), "\n", 2)[0]
	if then != now {
		return false
	}
	for _, id := range p.Nodes() {
		if n := st.Nodes[id]; n == nil || !n.Schedulable() || noRoom(st, id, m.Name) {
			return false
		}
	}
	return true
}

// planInputs is what a plan of model m is decided on (State.PlanInputs
// keeps it with the plan): the model's settings on the first line, then a
// line per schedulable node with what the planner reads of it.
func planInputs(st *State, m *Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%d|%d|%d|%s|%s|%s", m.Digest, m.Ctx, m.Overhead, m.MaxSeqs, m.Strategy, strings.Join(m.Pin, ","), m.Disagg)
	sched := map[string]bool{}
	for _, n := range PlacementNodes(st, m.Name) {
		if n.Schedulable() {
			sched[n.ID] = true
			fmt.Fprintf(&b, "\n%s %d %g %g %s", n.ID, n.MemFree, n.GFLOPS, n.MemGBps, n.Serves)
		}
	}
	keys := make([]string, 0, len(st.Links))
	for k, l := range st.Links {
		if sched[l.From] && sched[l.To] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		l := st.Links[k]
		fmt.Fprintf(&b, "\nlink %s %s %d", l.From, l.To, linkBucket(l.Gbit))
	}
	return b.String()
}

// linkBucket puts a link's bandwidth into steps of a factor of 2 (from 1
// Mbit/s): a plan is weighed again when a link between its nodes moves by
// a step, not on every probe's noise.
func linkBucket(gbit float64) int {
	if gbit <= 0.001 {
		return 0
	}
	return int(math.Floor(math.Log2(gbit * 1000)))
}

// nothingNew says whether model m's plan, decided on inputs, stands as the
// state is now: the model's settings are the same, every node of the plan
// is still schedulable, and no node is schedulable now that was not then,
// or offers more memory or speed than then (nodes lost elsewhere only take
// choices away). A leader that takes over keeps such a plan, so does one
// that sees a node outside the plan fail, be drained or come back.
func nothingNew(st *State, m *Model, inputs string) bool {
	p := st.Plans[m.Name]
	if inputs == "" || p == nil || len(p.Pools) == 0 {
		return false
	}
	then := strings.Split(inputs, "\n")
	now := strings.Split(planInputs(st, m), "\n")
	if then[0] != now[0] {
		return false
	}
	type offer struct {
		mem          uint64
		gflops, gbps float64
		serves       string
	}
	parse := func(line string) (string, offer, bool) {
		var id string
		var o offer
		n, _ := fmt.Sscanf(line, "%s %d %g %g %s", &id, &o.mem, &o.gflops, &o.gbps, &o.serves)
		return id, o, n >= 4
	}
	was := map[string]offer{}
	for _, line := range then[1:] {
		if strings.HasPrefix(line, "link ") {
			continue
		}
		if id, o, ok := parse(line); ok {
			was[id] = o
		}
	}
	inPlan := map[string]bool{}
	for _, id := range p.Nodes() {
		inPlan[id] = true
	}
	// A link between two of the plan's nodes measured since it was
	// planned, or now two steps (4x) slower or faster: weigh the plan
	// again (what the links really do, measured live, is what it was
	// costed on). One step is within what probes on a loaded host read.
	links := func(lines []string) map[string]string {
		out := map[string]string{}
		for _, line := range lines {
			var from, to string
			var bucket int
			if n, _ := fmt.Sscanf(line, "link %s %s %d", &from, &to, &bucket); n == 3 && inPlan[from] && inPlan[to] {
				out[from+">"+to] = strconv.Itoa(bucket)
			}
		}
		return out
	}
	linksThen, linksNow := links(then[1:]), links(now[1:])
	for k, v := range linksNow {
		if w, ok := linksThen[k]; !ok || bucketsApart(w, v) >= 2 {
			return false
		}
	}
	schedulable := map[string]bool{}
	for _, line := range now[1:] {
		if strings.HasPrefix(line, "link ") {
			continue
		}
		id, o, ok := parse(line)
		if !ok {
			return false
		}
		schedulable[id] = true
		w, known := was[id]
		if !known || o.mem > w.mem || o.gflops > w.gflops || o.gbps > w.gbps || o.serves != w.serves {
			return false
		}
	}
	for _, id := range p.Nodes() {
		if !schedulable[id] {
			return false
		}
	}
	return true
}

// PlacementNodes are the state's nodes as the planner sees them, with the
// memory other models' plans already take subtracted.
func PlacementNodes(st *State, except string) []placement.Node {
	used := map[string]uint64{}
	for name, p := range st.Plans {
		if name == except {
			continue
		}
		for _, pool := range p.Pools {
			for _, stg := range pool.Stages {
				for _, m := range stg.Members {
					used[m.Node] += m.MemBytes
				}
			}
		}
	}
	var out []placement.Node
	for _, n := range st.SortedNodes() {
		if except != "" && noRoom(st, n.ID, except) {
			continue
		}
		free := n.Caps.MemFree
		if used[n.ID] >= free {
			free = 0
		} else {
			free -= used[n.ID]
		}
		out = append(out, placement.Node{
			ID: n.ID, Name: n.Name, Status: placement.Status(n.Status), Draining: n.Draining,
			MemFree: free, GFLOPS: n.Caps.GFLOPS, MemGBps: n.Caps.MemGBps, Serves: n.Caps.Serves,
			GPUMem: n.Caps.GPUMem, GPUGBps: n.Caps.GPUGBps, GPUShared: n.Caps.GPUShared,
		})
	}
	return out
}

// noRoomFor is how long a node whose disk could not take its shard of a
// model is left out of that model's plans: the plan moves off it at once,
// and the node is tried again later (its disk may have been freed).
const noRoomFor = 10 * time.Minute

// noRoom says whether node id reported, within noRoomFor, that its disk
// cannot take its shard of model.
func noRoom(st *State, id, model string) bool {
	s := st.Shards[ShardKey(id, model)]
	return s != nil && s.NoRoom && time.Since(s.UpdatedAt) < noRoomFor
}

// planModel asks placement.Replan for model m's plan and commits the
// decision: the new plan, or the model unservable (and its old plan
// released), then the model's status.
func (s *Server) planModel(st *State, m *Model, prev *placement.Plan) error {
	d := decidePlan(st, m, prev)
	inputs := planInputs(st, m)
	if d.Unservable != "" {
		var full []string
		for _, n := range st.SortedNodes() {
			if noRoom(st, n.ID, m.Name) {
				full = append(full, n.Name)
			}
		}
		if len(full) > 0 {
			d.Unservable += fmt.Sprintf("; left out: %s, whose disk had no room for a shard of it (free disk there, or add a node)", strings.Join(full, ", "))
		}
		reason := clipText(d.Unservable, MaxTextLen)
		if m.Status != ModelUnservable || m.Reason != reason {
			s.log.Warn("model is unservable", zap.String("model", m.Name), zap.String("reason", reason))
			mm := *m
			mm.Status, mm.Reason = ModelUnservable, reason
			if err := s.Apply(ModelUpsertType, ModelUpsertRequest{Model: mm, StatusOnly: true, FromStatus: m.Status}, applyTimeout); err != nil {
				return err
			}
		}
		if d.Keep {
			return nil
		}
		return s.Apply(PlanSetType, PlanSetRequest{Plan: d.Plan, Inputs: inputs}, applyTimeout)
	}
	if !d.Keep {
		p := d.Plan
		if err := s.Apply(PlanSetType, PlanSetRequest{Plan: p, Inputs: inputs}, applyTimeout); err != nil {
			return err
		}
		if prev == nil || len(prev.Pools) == 0 {
			s.log.Info("planned model", zap.String("model", m.Name), zap.Uint64("version", p.Version),
				zap.String("strategy", p.Strategy), zap.Int("nodes", len(p.Nodes())),
				zap.Float64("ms_per_token", p.Cost.MsPerToken), zap.Strings("assign", p.Moved))
		} else {
			s.log.Info("re-planned model", zap.String("model", m.Name), zap.Uint64("version", p.Version),
				zap.Strings("weighed", d.Weighed), zap.String("moved", placement.GiB(p.MovedBytes)), zap.Strings("moves", p.Moved))
		}
	}
	if m.Status != ModelPlanned || m.Reason != "" {
		mm := *m
		mm.Status, mm.Reason = ModelPlanned, ""
		return s.Apply(ModelUpsertType, ModelUpsertRequest{Model: mm, StatusOnly: true, FromStatus: m.Status}, applyTimeout)
	}
	return nil
}

// decidePlan is placement.Replan of model m (its profile set) over the
// state's nodes and links, from its previous plan prev (nil if none): what
// the leader's planner commits. It reads st only.
func decidePlan(st *State, m *Model, prev *placement.Plan) placement.Decision {
	opts := modelOptions(m)
	profile := *m.Profile
	profile.Name = m.Name
	// The source node reads its shard from its own copy of the file; a
	// hub file's source (the agent that loaded it, or the leader that took
	// its check over) has none: every node reads its ranges.
	local := m.SourceNode
	if m.Hub != nil {
		local = ""
	}
	d := placement.Replan(profile, PlacementNodes(st, m.Name), LinkMatrix(st), opts, prev, local)
	// The plan's words within what a plan in the state may hold (a line
	// per node of a large cluster could pass them).
	d.Plan.Explain = clipLines(d.Plan.Explain)
	d.Plan.Moved = clipLines(d.Plan.Moved)
	return d
}

// PrefillPrediction is model name's plan's predicted prefill of one prompt
// of n tokens, on the nodes' and links' figures in st now
// (placement.PredictPrefill). ok is false when the model has no placed
// plan, or one the prediction cannot weigh (several pools).
func PrefillPrediction(st *State, name string, n int) (version uint64, pf placement.Prefill, ok bool) {
	p, m := st.Plans[name], st.Models[name]
	if p == nil || len(p.Pools) == 0 || m == nil || m.Profile == nil {
		return 0, pf, false
	}
	profile := *m.Profile
	profile.Name = m.Name
	pf, ok = placement.PredictPrefill(profile, PlacementNodes(st, name), LinkMatrix(st), modelOptions(m), p, n)
	return p.Version, pf, ok
}

// modelOptions are the planner's options for model m.
func modelOptions(m *Model) placement.Options {
	o := placement.Options{Context: m.Ctx, Batch: m.MaxSeqs, Overhead: m.Overhead, Strategy: placement.Strategy(m.Strategy), Pin: m.Pin, Disagg: m.Disagg, KVType: m.KVType,
		Prompt: m.PlanPrompt, Generate: m.PlanGen}
	if d := m.Draft; d != nil {
		o.DriverBytes, o.DriverKVBytesPerToken = d.Bytes, d.KVBytesPerToken
	}
	return o
}

// DecodePrediction is the predicted time of a decode step of one sequence
// through model name's plan, costed on the nodes' and links' figures in st
// now: what a driver's measured decode steps (serve.Stats.DecodeMs, one
// sequence each) are held against. The plan's own Cost is for a step of
// its whole batch, on the figures of when it was made, often before any
// link was measured. A plan Recost cannot weigh (several pools) answers
// its own Cost. ok is false when the model has no placed plan.
func DecodePrediction(st *State, name string) (version uint64, ms float64, ok bool) {
	p := st.Plans[name]
	if p == nil || len(p.Pools) == 0 {
		return 0, 0, false
	}
	version, ms = p.Version, p.Cost.MsPerToken
	if m := st.Models[name]; m != nil && m.Profile != nil {
		opts := modelOptions(m)
		opts.Batch = 1
		profile := *m.Profile
		profile.Name = m.Name
		if c, ok := placement.Recost(profile, PlacementNodes(st, name), LinkMatrix(st), opts, p); ok {
			ms = c.MsPerToken
		}
	}
	return version, ms, true
}

// clipLines keeps at most placement.MaxPlanLines lines of at most
// placement.MaxPlanLine bytes each.
func clipLines(lines []string) []string {
	long := len(lines) > placement.MaxPlanLines
	for _, l := range lines {
		long = long || len(l) > placement.MaxPlanLine
	}
	if !long {
		return lines
	}
	out := make([]string, 0, min(len(lines), placement.MaxPlanLines))
	for _, l := range lines[:min(len(lines), placement.MaxPlanLines)] {
		if len(l) > placement.MaxPlanLine {
			l = clipText(l, placement.MaxPlanLine)
		}
		out = append(out, l)
	}
	return out
}

// clipText makes s free text the state takes (checkText): control
// characters but tab and newline dropped, cut to at most bound bytes on a
// character boundary.
func clipText(s string, bound int) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "?") {
		if r < 0x20 && r != '\t' && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 {
			continue
		}
		if b.Len()+utf8.RuneLen(r) > bound {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// LinkMatrix builds the planner's link matrix from the state. Pairs
// nobody measured take placement.DefaultLink.
func LinkMatrix(st *State) placement.LinkMatrix {
	var lm placement.LinkMatrix
	for _, l := range st.Links {
		lm.SetOneWay(l.From, l.To, placement.Link{Gbit: l.Gbit, LatencyMs: l.LatencyMs, DirectGbit: l.DirectGbit})
	}
	return lm
}

// bucketsApart is how many linkBucket steps two bucket strings differ by.
func bucketsApart(a, b string) int {
	x, _ := strconv.Atoi(a)
	y, _ := strconv.Atoi(b)
	if x > y {
		return x - y
	}
	return y - x
}
