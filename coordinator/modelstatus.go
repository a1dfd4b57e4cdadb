package coordinator

import "sort"

// What the state says of a model's file and shards: who holds the whole
// file, which nodes should copy it next, which layers no live node holds,
// and the status of a planned model from its shards. Pure functions of
// the state, so that every agent computes the same answer from the same
// state; the agents act on them (catalog copies the file, the admin API
// shows the status).

// Statuses of a planned model, computed from its shards (ModelStatus);
// a model's Status field holds the ones written to the state.
const (
	ModelPlanning  = "planning"
	ModelLoading   = "loading"
	ModelVerifying = "verifying"
	ModelReady     = "ready"
	ModelDegraded  = "degraded"
)

// WholeHolders lists the live nodes with m's whole file: the source, then
// the nodes whose copy is ready, by name. A node without an RPC address
// cannot serve it and is not listed.
func WholeHolders(st *State, m *Model) []*Node {
	var out []*Node
	alive := func(id string) *Node {
		if n := st.Nodes[id]; n != nil && n.Status == StatusAlive && n.RPCAddr != "" {
			return n
		}
		return nil
	}
	if n := alive(m.SourceNode); n != nil {
		out = append(out, n)
	}
	for _, n := range st.SortedNodes() {
		if h := m.Holders[n.ID]; h != nil && h.State == HolderReady && n.ID != m.SourceNode && alive(n.ID) != nil {
			out = append(out, n)
		}
	}
	return out
}

// CopyChosen reports whether node id is among the first nodes that should
// copy m's file now: the file has fewer live whole holders than m wants,
// and id comes early enough among the nodes that may copy it (alive, not
// draining, not the source, without the file, with room as far as is
// known; by name, those whose copy failed last).
func CopyChosen(st *State, m *Model, id string) bool {
	need := m.WantReplicas() - len(WholeHolders(st, m))
	if need <= 0 {
		return false
	}
	var cands []*Node
	for _, n := range st.SortedNodes() {
		if n.ID == m.SourceNode || !n.Schedulable() || n.RPCAddr == "" {
			continue
		}
		if h := m.Holders[n.ID]; h != nil && (h.State == HolderReady || h.State == HolderNoRoom) {
			continue
		}
		cands = append(cands, n)
	}
	failed := func(n *Node) bool {
		h := m.Holders[n.ID]
		return h != nil && h.State == HolderFailed
	}
	sort.SliceStable(cands, func(i, j int) bool { return !failed(cands[i]) && failed(cands[j]) })
	for i, n := range cands {
		if i >= need {
			break
		}
		if n.ID == id {
			return true
		}
	}
	return false
}

// LayersHeldByNone returns the first run of m's layers that no live node
// holds in a ready shard, if any.
func LayersHeldByNone(st *State, m *Model) (lo, hi int, ok bool) {
	if m.Layers <= 0 {
		return 0, 0, false
	}
	held := make([]bool, m.Layers)
	for _, s := range st.Shards {
		n := st.Nodes[s.Node]
		if s.Model != m.Name || s.State != ShardReady || n == nil || n.Status != StatusAlive {
			continue
		}
		for l := max(s.Lo, 0); l < min(s.Hi, m.Layers); l++ {
			held[l] = true
		}
	}
	for lo = 0; lo < m.Layers && held[lo]; lo++ {
	}
	if lo == m.Layers {
		return 0, 0, false
	}
	for hi = lo; hi < m.Layers && !held[hi]; hi++ {
	}
	return lo, hi, true
}

// ShardTally counts the shards of a model's plan by state: Shards in all,
// and those ready, verifying (an unverified hub model's ranges held) and
// failed.
type ShardTally struct {
	Shards, Ready, Verifying, Failed int
}

// ModelStatus is the status of planned model m from its shards: degraded
// when a shard failed; verifying while m is an unverified hub model whose
// shards all hold their ranges; ready when every shard is and m is
// verified; loading otherwise.
func ModelStatus(m *Model, t ShardTally) string {
	switch {
	case t.Failed > 0:
		return ModelDegraded
	case m.Unverified && t.Ready+t.Verifying == t.Shards:
		return ModelVerifying
	case t.Ready == t.Shards && !m.Unverified:
		return ModelReady
	}
	return ModelLoading
}
