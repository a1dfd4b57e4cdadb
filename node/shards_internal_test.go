package node

import (
	"testing"

	"shoal/coordinator"
)

// TestModelHoldersSuspectLast: the holders a shard fetch may ask are the
// alive nodes (source, then shard holders, ready first), then the suspect
// ones in the same order; never a failed or left node, one without an
// address, or this node.
func TestModelHoldersSuspectLast(t *testing.T) {
	node := func(id string, st coordinator.NodeStatus) *coordinator.Node {
		return &coordinator.Node{ID: id, Name: "n-" + id, RPCAddr: "127.0.0.1:1" + id, Status: st}
	}
	st := &coordinator.State{
		Nodes: map[string]*coordinator.Node{
			"src": node("src", coordinator.StatusSuspect), "a": node("a", coordinator.StatusAlive),
			"b": node("b", coordinator.StatusSuspect), "c": node("c", coordinator.StatusFailed),
			"d": node("d", coordinator.StatusAlive), "self": node("self", coordinator.StatusAlive),
			"e": {ID: "e", Name: "n-e", Status: coordinator.StatusAlive},
		},
		Shards: map[string]*coordinator.ShardStatus{},
	}
	for _, s := range []struct {
		node  string
		state string
	}{{"a", coordinator.ShardFetching}, {"b", coordinator.ShardReady}, {"c", coordinator.ShardReady}, {"d", coordinator.ShardReady}, {"e", coordinator.ShardReady}, {"self", coordinator.ShardReady}} {
		st.Shards[s.node] = &coordinator.ShardStatus{Node: s.node, Model: "m", State: s.state}
	}
	m := &coordinator.Model{Name: "m", SourceNode: "src"}
	var got []string
	for _, p := range modelHolders(st, m, "self") {
		got = append(got, p.ID)
	}
	want := []string{"d", "a", "src", "b"}
	if len(got) != len(want) {
		t.Fatalf("holders %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("holders %v, want %v", got, want)
		}
	}
}
