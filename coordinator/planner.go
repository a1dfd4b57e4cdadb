package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/placement"
)

// ReplanSlack is how much slower (predicted ms/token) a plan that moves
// fewer bytes may be and still win a re-plan: 10%.
const ReplanSlack = 0.10

// planModels is the leader's model loop: every model that has a digest and
// a profile gets a plan from placement.Place over the schedulable nodes;
// when nodes join, drain, leave or fail it is planned again, preferring
// the candidate that moves the fewest bytes among those within
// ReplanSlack of the fastest. When nothing fits, the model is marked
// unservable with the planner's reason and its plan emptied.
func (s *Server) planModels() {
	st := s.fsm.State()
	names := make([]string, 0, len(st.Models))
	for n := range st.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	nodesSig := nodeSignature(st)
	s.mu.Lock()
	if s.planSig == nil {
		s.planSig = map[string]string{}
	}
	s.mu.Unlock()
	for _, name := range names {
		m := st.Models[name]
		if m.Digest == "" || m.Profile == nil || m.Status == ModelFailed || m.Status == ModelHashing {
			continue
		}
		old := st.Plans[name]
		sig := fmt.Sprintf("%s|%s|%d|%d|%s", nodesSig, m.Digest, m.Ctx, m.Overhead, m.Status)
		if old != nil {
			sig += fmt.Sprintf("|v%d", old.Version)
		}
		s.mu.Lock()
		same := s.planSig[name] == sig
		s.mu.Unlock()
		if same {
			continue
		}
		if err := s.planModel(st, m, old); err != nil {
			s.log.Warn("planning failed", zap.String("model", name), zap.Error(err))
			continue // try again on the next pass
		}
		// Remember the inputs only once the decision is committed; the
		// commit itself changes the state, so read the signature again.
		st = s.fsm.State()
		sig = fmt.Sprintf("%s|%s|%d|%d|%s", nodeSignature(st), m.Digest, m.Ctx, m.Overhead, statusOf(st, name))
		if p := st.Plans[name]; p != nil {
			sig += fmt.Sprintf("|v%d", p.Version)
		}
		s.mu.Lock()
		s.planSig[name] = sig
		s.mu.Unlock()
	}
}

func statusOf(st *State, name string) string {
	if m := st.Models[name]; m != nil {
		return m.Status
	}
	return ""
}

// nodeSignature is what planning reads of the nodes, in a stable form.
func nodeSignature(st *State) string {
	var b strings.Builder
	for _, n := range st.SortedNodes() {
		fmt.Fprintf(&b, "%s:%s:%t:%d:%g:%g;", n.ID, n.Status, n.Draining, n.Caps.MemFree, n.Caps.GFLOPS, n.Caps.MemGBps)
	}
	return b.String()
}

// PlacementNodes are the state's nodes as the planner sees them, with the
// memory other models' plans already take subtracted.
func PlacementNodes(st *State, except string) []placement.Node {
	used := map[string]uint64{}
	for name, p := range st.Plans {
		if name == except || p.Placement == nil {
			continue
		}
		for _, pool := range p.Placement.Pools {
			for _, stg := range pool.Stages {
				for _, m := range stg.Members {
					used[m.Node] += m.MemBytes
				}
			}
		}
	}
	var out []placement.Node
	for _, n := range st.SortedNodes() {
		free := n.Caps.MemFree
		if used[n.ID] >= free {
			free = 0
		} else {
			free -= used[n.ID]
		}
		out = append(out, placement.Node{
			ID: n.ID, Status: placement.Status(n.Status), Draining: n.Draining,
			MemFree: free, GFLOPS: n.Caps.GFLOPS, MemGBps: n.Caps.MemGBps,
		})
	}
	return out
}

// planModel decides model m's plan and commits it (or marks the model
// unservable).
func (s *Server) planModel(st *State, m *Model, old *Plan) error {
	nodes := PlacementNodes(st, m.Name)
	schedulable := map[string]bool{}
	for _, n := range nodes {
		if n.Schedulable() {
			schedulable[n.ID] = true
		}
	}
	var version uint64 = 1
	var prev *placement.Plan
	oldValid := false
	if old != nil {
		version = old.Version + 1
		prev = old.Placement
		if prev != nil && len(prev.Pools) > 0 {
			oldValid = true
			for _, id := range old.Nodes() {
				if !schedulable[id] {
					oldValid = false
				}
			}
		}
	}
	opts := placement.Options{Context: m.Ctx, Overhead: m.Overhead, Version: version, Strategy: placement.Strategy(m.Strategy), Pin: m.Pin}
	profile := *m.Profile
	profile.Name = m.Name
	links := LinkMatrix(st)

	type cand struct {
		plan  placement.Plan
		moved uint64
		keep  bool
	}
	var cands []cand
	best, err := placement.Place(profile, nodes, links, opts)
	if err == nil {
		cands = append(cands, cand{plan: best, moved: MovedBytes(&profile, prev, &best, m.SourceNode)})
	}
	if oldValid {
		cands = append(cands, cand{plan: *prev, keep: true})
	} else if prev != nil && len(prev.Pools) > 0 {
		// Keep the survivors of the old plan: they hold most bytes already.
		var pin []string
		pp := NewPlan(*prev)
		for _, id := range pp.Nodes() {
			if schedulable[id] {
				pin = append(pin, id)
			}
		}
		if len(pin) > 0 && len(pin) < len(schedulable) {
			o := opts
			o.Pin = pin
			if p, err := placement.Place(profile, nodes, links, o); err == nil {
				cands = append(cands, cand{plan: p, moved: MovedBytes(&profile, prev, &p, m.SourceNode)})
			}
		}
	}
	if len(cands) == 0 {
		reason := err.Error()
		var fe *placement.FitError
		if errors.As(err, &fe) {
			reason = fe.Msg
		}
		reason = strings.TrimPrefix(reason, "placement: ")
		if m.Status != ModelUnservable || m.Reason != reason {
			s.log.Warn("model is unservable", zap.String("model", m.Name), zap.String("reason", reason))
			mm := *m
			mm.Status, mm.Reason = ModelUnservable, reason
			if err := s.Apply(ModelUpsertType, ModelUpsertRequest{Model: mm}, applyTimeout); err != nil {
				return err
			}
		}
		if old != nil && len(old.Pools) > 0 {
			empty := Plan{Version: version, Model: m.Name, CreatedAt: time.Now().UTC(),
				Placement: &placement.Plan{Version: version, Model: m.Name, Explain: []string{reason}}}
			for _, id := range old.Nodes() {
				empty.Moved = append(empty.Moved, fmt.Sprintf("%s: released", nodeName(st, id)))
			}
			return s.Apply(PlanSetType, PlanSetRequest{Plan: empty}, applyTimeout)
		}
		return nil
	}
	fastest := cands[0].plan.Cost.MsPerToken
	for _, c := range cands[1:] {
		fastest = min(fastest, c.plan.Cost.MsPerToken)
	}
	pick := -1
	for i, c := range cands {
		if c.plan.Cost.MsPerToken > fastest*(1+ReplanSlack) {
			continue
		}
		if pick < 0 || c.moved < cands[pick].moved ||
			(c.moved == cands[pick].moved && c.plan.Cost.MsPerToken < cands[pick].plan.Cost.MsPerToken) {
			pick = i
		}
	}
	chosen := cands[pick]
	if !chosen.keep && prev != nil && samePlacement(prev, &chosen.plan) {
		chosen.keep = true
	}
	if !chosen.keep {
		p := NewPlan(chosen.plan)
		p.CreatedAt = time.Now().UTC()
		p.MovedBytes = chosen.moved
		p.Moved = describeMoves(st, &profile, prev, &chosen.plan, m.SourceNode)
		if err := s.Apply(PlanSetType, PlanSetRequest{Plan: p}, applyTimeout); err != nil {
			return err
		}
		if prev == nil || len(prev.Pools) == 0 {
			s.log.Info("planned model", zap.String("model", m.Name), zap.Uint64("version", p.Version),
				zap.String("strategy", chosen.plan.Strategy), zap.Int("nodes", len(p.Nodes())),
				zap.Float64("ms_per_token", chosen.plan.Cost.MsPerToken), zap.Strings("assign", p.Moved))
		} else {
			s.log.Info("re-planned model", zap.String("model", m.Name), zap.Uint64("version", p.Version),
				zap.Int("candidates", len(cands)), zap.String("moved", placement.GiB(p.MovedBytes)), zap.Strings("moves", p.Moved))
		}
	}
	if m.Status != ModelPlanned || m.Reason != "" {
		mm := *m
		mm.Status, mm.Reason = ModelPlanned, ""
		return s.Apply(ModelUpsertType, ModelUpsertRequest{Model: mm}, applyTimeout)
	}
	return nil
}

// LinkMatrix builds the planner's link matrix from the state. Pairs
// nobody measured take placement.DefaultLink.
func LinkMatrix(st *State) placement.LinkMatrix {
	var lm placement.LinkMatrix
	for _, l := range st.Links {
		lm.SetOneWay(l.From, l.To, placement.Link{Gbit: l.Gbit, LatencyMs: l.LatencyMs})
	}
	return lm
}

func nodeName(st *State, id string) string {
	if n := st.Nodes[id]; n != nil && n.Name != "" {
		return n.Name
	}
	return id
}

func samePlacement(a, b *placement.Plan) bool {
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

func holdings(p *placement.Plan, prof *placement.ModelProfile) map[string][]holding {
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

// uncovered is the length of [lo,hi) not covered by any of the ranges.
func uncovered(lo, hi int, ranges [][2]int) int {
	n := 0
	for x := lo; x < hi; x++ {
		in := false
		for _, r := range ranges {
			if x >= r[0] && x < r[1] {
				in = true
				break
			}
		}
		if !in {
			n++
		}
	}
	return n
}

// nodeMoved is the weight bytes node must fetch to go from what it held
// in the old plan (olds) to what it holds in the new one (news): per layer,
// the heads, FFN columns and experts it did not hold, and the replicated
// tensors of layers it did not hold at all.
func nodeMoved(prof *placement.ModelProfile, olds, news []holding) uint64 {
	var total float64
	for _, h := range news {
		for l := h.lo; l < h.hi; l++ {
			lp := prof.Layers[l]
			var heads, ffns [][2]int
			var exps []int
			allExp, held := false, false
			for _, o := range olds {
				if l < o.lo || l >= o.hi {
					continue
				}
				held = true
				heads = append(heads, [2]int{o.headLo, o.headHi})
				ffns = append(ffns, [2]int{o.ffnLo, o.ffnHi})
				if o.experts == nil {
					allExp = true
				}
				exps = append(exps, o.experts...)
			}
			if prof.NHead > 0 {
				total += float64(lp.AttnBytes) * float64(uncovered(h.headLo, h.headHi, heads)) / float64(prof.NHead)
			}
			if prof.FFNDim > 0 {
				total += float64(lp.FFNBytes) * float64(uncovered(h.ffnLo, h.ffnHi, ffns)) / float64(prof.FFNDim)
			}
			if prof.NExpert > 0 && !allExp {
				want := h.experts
				if want == nil {
					want = make([]int, prof.NExpert)
					for i := range want {
						want[i] = i
					}
				}
				for _, e := range want {
					if !slices.Contains(exps, e) {
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
func MovedBytes(prof *placement.ModelProfile, a, b *placement.Plan, local string) uint64 {
	olds, news := holdings(a, prof), holdings(b, prof)
	var n uint64
	for node, hs := range news {
		if node != local {
			n += nodeMoved(prof, olds[node], hs)
		}
	}
	return n
}

// describeMoves says, per node, what changes from plan a to plan b.
func describeMoves(st *State, prof *placement.ModelProfile, a, b *placement.Plan, local string) []string {
	olds, news := holdings(a, prof), holdings(b, prof)
	ids := map[string]bool{}
	for id := range olds {
		ids[id] = true
	}
	for id := range news {
		ids[id] = true
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Slice(sorted, func(i, j int) bool { return nodeName(st, sorted[i]) < nodeName(st, sorted[j]) })
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
				s += " experts " + placement.ExpertList(h.experts)
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ", ")
	}
	var out []string
	for _, id := range sorted {
		o, n := desc(olds[id]), desc(news[id])
		if o == n {
			continue
		}
		how := "reads its own copy of the file"
		if id != local {
			how = "fetches " + placement.GiB(nodeMoved(prof, olds[id], news[id]))
		}
		if len(news[id]) == 0 {
			how = "releases its shard"
		}
		out = append(out, fmt.Sprintf("%s: %s -> %s (%s)", nodeName(st, id), o, n, how))
	}
	return out
}
