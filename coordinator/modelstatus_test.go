package coordinator

import (
	"slices"
	"testing"
)

// statusState is a state of nodes by ID ("a" alive, "f" failed, "d"
// draining, "x" alive without an RPC address) whose names sort like their
// IDs, and model m sourced on src with the given holders.
func statusState(nodes map[string]string, src string, holders map[string]string) (*State, *Model) {
	st := NewState()
	for id, kind := range nodes {
		n := &Node{ID: id, Name: "n-" + id, Status: StatusAlive, RPCAddr: id + ":1"}
		switch kind {
		case "f":
			n.Status = StatusFailed
		case "d":
			n.Draining = true
		case "x":
			n.RPCAddr = ""
		}
		st.Nodes[id] = n
	}
	m := &Model{Name: "m", Digest: "d", SourceNode: src, Layers: 4, Holders: map[string]*ModelHolder{}}
	for id, state := range holders {
		m.Holders[id] = &ModelHolder{Node: id, Digest: "d", State: state}
	}
	st.Models["m"] = m
	return st, m
}

func ids(ns []*Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.ID)
	}
	return out
}

func TestWholeHolders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   map[string]string
		src     string
		holders map[string]string
		want    []string
	}{
		{"source only", map[string]string{"a": "a", "b": "a"}, "b", nil, []string{"b"}},
		{"source first, then copies by name", map[string]string{"a": "a", "b": "a", "c": "a"}, "c",
			map[string]string{"b": HolderReady, "a": HolderReady}, []string{"c", "a", "b"}},
		{"a failed source is left out", map[string]string{"a": "f", "b": "a"}, "a",
			map[string]string{"b": HolderReady}, []string{"b"}},
		{"copies not ready are left out", map[string]string{"a": "a", "b": "a", "c": "a", "d": "a"}, "a",
			map[string]string{"b": HolderCopying, "c": HolderFailed, "d": HolderNoRoom}, []string{"a"}},
		{"a copy on a failed node or without an address is left out", map[string]string{"a": "a", "b": "f", "c": "x", "d": "d"}, "a",
			map[string]string{"b": HolderReady, "c": HolderReady, "d": HolderReady}, []string{"a", "d"}},
		{"an unknown source", map[string]string{"a": "a"}, "gone", map[string]string{"a": HolderReady}, []string{"a"}},
		{"the source listed as a holder counts once", map[string]string{"a": "a"}, "a", map[string]string{"a": HolderReady}, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, m := statusState(tc.nodes, tc.src, tc.holders)
			if got := ids(WholeHolders(st, m)); !slices.Equal(got, tc.want) {
				t.Errorf("WholeHolders = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCopyChosen(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    map[string]string
		src      string
		holders  map[string]string
		replicas int
		pin      bool
		chosen   []string // the nodes CopyChosen says yes to
	}{
		{"the first node by name copies (2 replicas by default)", map[string]string{"a": "a", "b": "a", "c": "a"}, "a", nil, 0, false, []string{"b"}},
		{"three replicas: the first two", map[string]string{"a": "a", "b": "a", "c": "a", "d": "a"}, "a", nil, 3, false, []string{"b", "c"}},
		{"enough holders: nobody", map[string]string{"a": "a", "b": "a", "c": "a"}, "a", map[string]string{"b": HolderReady}, 0, false, nil},
		{"a pinned model is not copied", map[string]string{"a": "a", "b": "a"}, "a", nil, 3, true, nil},
		{"a failed source: two copies wanted", map[string]string{"a": "f", "b": "a", "c": "a", "d": "a"}, "a", nil, 0, false, []string{"b", "c"}},
		{"draining, failed and address-less nodes do not copy", map[string]string{"a": "a", "b": "d", "c": "f", "e": "x", "g": "a"}, "a", nil, 0, false, []string{"g"}},
		{"a node without room is skipped", map[string]string{"a": "a", "b": "a", "c": "a"}, "a", map[string]string{"b": HolderNoRoom}, 0, false, []string{"c"}},
		{"a node whose copy failed goes last", map[string]string{"a": "a", "b": "a", "c": "a"}, "a", map[string]string{"b": HolderFailed}, 0, false, []string{"c"}},
		{"a failed copy is retried when no one else may", map[string]string{"a": "a", "b": "a"}, "a", map[string]string{"b": HolderFailed}, 0, false, []string{"b"}},
		{"a node copying is still chosen", map[string]string{"a": "a", "b": "a", "c": "a"}, "a", map[string]string{"b": HolderCopying}, 0, false, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, m := statusState(tc.nodes, tc.src, tc.holders)
			m.Replicas = tc.replicas
			if tc.pin {
				m.Pin = []string{tc.src}
			}
			var got []string
			for _, n := range st.SortedNodes() {
				if CopyChosen(st, m, n.ID) {
					got = append(got, n.ID)
				}
			}
			if !slices.Equal(got, tc.chosen) {
				t.Errorf("chosen %v, want %v", got, tc.chosen)
			}
		})
	}
}

func TestLayersHeldByNone(t *testing.T) {
	type sh struct {
		node, model, state string
		lo, hi             int
	}
	for _, tc := range []struct {
		name   string
		layers int
		shards []sh
		lo, hi int
		ok     bool
	}{
		{"no shards: all layers", 4, nil, 0, 4, true},
		{"no layers", 0, nil, 0, 0, false},
		{"every layer held", 4, []sh{{"a", "m", ShardReady, 0, 2}, {"b", "m", ShardReady, 2, 4}}, 0, 0, false},
		{"the first gap", 6, []sh{{"a", "m", ShardReady, 0, 2}, {"b", "m", ShardReady, 4, 5}}, 2, 4, true},
		{"a gap at the start", 4, []sh{{"a", "m", ShardReady, 1, 4}}, 0, 1, true},
		{"a shard not ready holds nothing", 4, []sh{{"a", "m", ShardFetching, 0, 4}}, 0, 4, true},
		{"a failed node holds nothing", 4, []sh{{"f", "m", ShardReady, 0, 4}}, 0, 4, true},
		{"another model's shard holds nothing", 4, []sh{{"a", "other", ShardReady, 0, 4}}, 0, 4, true},
		{"a shard past the model's layers is clipped", 4, []sh{{"a", "m", ShardReady, -1, 9}}, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, m := statusState(map[string]string{"a": "a", "b": "a", "f": "f"}, "a", nil)
			m.Layers = tc.layers
			for _, s := range tc.shards {
				st.Shards[ShardKey(s.node, s.model)] = &ShardStatus{Node: s.node, Model: s.model, State: s.state, Lo: s.lo, Hi: s.hi}
			}
			lo, hi, ok := LayersHeldByNone(st, m)
			if lo != tc.lo || hi != tc.hi || ok != tc.ok {
				t.Errorf("LayersHeldByNone = %d, %d, %v; want %d, %d, %v", lo, hi, ok, tc.lo, tc.hi, tc.ok)
			}
		})
	}
}

func TestModelStatus(t *testing.T) {
	for _, tc := range []struct {
		name       string
		unverified bool
		tally      ShardTally
		want       string
	}{
		{"every shard ready", false, ShardTally{Shards: 3, Ready: 3}, ModelReady},
		{"some still loading", false, ShardTally{Shards: 3, Ready: 2}, ModelLoading},
		{"one failed", false, ShardTally{Shards: 3, Ready: 2, Failed: 1}, ModelDegraded},
		{"a failure outranks verifying", true, ShardTally{Shards: 2, Verifying: 1, Failed: 1}, ModelDegraded},
		{"unverified, every range held", true, ShardTally{Shards: 2, Ready: 1, Verifying: 1}, ModelVerifying},
		{"unverified, every shard ready", true, ShardTally{Shards: 2, Ready: 2}, ModelVerifying},
		{"unverified, still fetching", true, ShardTally{Shards: 2, Verifying: 1}, ModelLoading},
		{"verified, a shard verifying", false, ShardTally{Shards: 2, Ready: 1, Verifying: 1}, ModelLoading},
		{"a plan without shards", false, ShardTally{}, ModelReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ModelStatus(&Model{Unverified: tc.unverified}, tc.tally); got != tc.want {
				t.Errorf("ModelStatus = %q, want %q", got, tc.want)
			}
		})
	}
}
