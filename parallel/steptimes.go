package parallel

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// StepBuckets are the upper bounds, in seconds, of the step time
// histograms StepTimes keeps.
var StepBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// StepTimes accumulates, per member node, how long the node took to answer
// the driver's steps: from sending it the step to its reply (a later
// stage's time includes waiting for the stages before it). One StepTimes
// outlives sessions and plans: a driver passes it to each Cluster it makes
// (Options.Times). The zero value is ready to use.
type StepTimes struct {
	mu    sync.Mutex
	nodes map[string]*MemberTime
	names map[string]string
}

// MemberTime is one node's step times: how many, their sum and, per
// StepBuckets bound, how many took at most that long (cumulative).
type MemberTime struct {
	Node    string // node ID
	Name    string // node name (the ID when unknown)
	Count   uint64
	Sum     time.Duration
	Buckets []uint64
}

// SetNames gives the names of node IDs for Snapshot.
func (t *StepTimes) SetNames(names map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.names == nil {
		t.names = map[string]string{}
	}
	for id, n := range names {
		t.names[id] = n
	}
}

func (t *StepTimes) observe(node string, d time.Duration) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodes == nil {
		t.nodes = map[string]*MemberTime{}
	}
	m := t.nodes[node]
	if m == nil {
		m = &MemberTime{Node: node, Buckets: make([]uint64, len(StepBuckets))}
		t.nodes[node] = m
	}
	m.Count++
	m.Sum += d
	s := d.Seconds()
	for i, b := range StepBuckets {
		if s <= b {
			m.Buckets[i]++
		}
	}
}

// Snapshot returns every node's step times, by node ID.
func (t *StepTimes) Snapshot() []MemberTime {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]MemberTime, 0, len(t.nodes))
	for id, m := range t.nodes {
		c := *m
		c.Buckets = slices.Clone(m.Buckets)
		c.Name = id
		if n := t.names[id]; n != "" {
			c.Name = n
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b MemberTime) int { return strings.Compare(a.Node, b.Node) })
	return out
}
