package catalog

import (
	"strings"
	"testing"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/placement"
)

// TestModelStatusWithoutFileHolder: a model whose file is on no live node
// says so, naming the layers no live node's shard holds; with a live copy
// of the file, or with every layer in a live node's ready shard, it does
// not.
func TestModelStatusWithoutFileHolder(t *testing.T) {
	st := coordinator.NewState()
	for _, n := range []struct {
		id     string
		status coordinator.NodeStatus
	}{{"a", coordinator.StatusFailed}, {"b", coordinator.StatusAlive}, {"c", coordinator.StatusAlive}} {
		st.Nodes[n.id] = &coordinator.Node{ID: n.id, Name: n.id, Status: n.status, RPCAddr: n.id + ":1"}
	}
	m := &coordinator.Model{Name: "m", Digest: "d", Manifest: "x", SourceNode: "a", Layers: 4, Status: coordinator.ModelPlanned}
	st.Models["m"] = m
	st.Plans["m"] = &placement.Plan{Version: 2, Model: "m", Pools: []placement.Pool{{Role: "shared", Stages: []placement.Stage{
		{Lo: 0, Hi: 4, Members: []placement.Member{{Node: "c", TPSize: 1, Embedding: true, Output: true}}}}}}}
	st.Shards[coordinator.ShardKey("c", "m")] = &coordinator.ShardStatus{Node: "c", Model: "m", Lo: 0, Hi: 4, PlanVersion: 2,
		State: coordinator.ShardFailed, Error: "no live node holds bytes [0,+10) of the model file"}
	st.Shards[coordinator.ShardKey("b", "m")] = &coordinator.ShardStatus{Node: "b", Model: "m", Lo: 0, Hi: 2, PlanVersion: 1, State: coordinator.ShardReady}
	b := &Catalog{id: "b", name: "b", log: zap.NewNop()}

	info := b.ModelInfo(st, m)
	want := "no live node has the model file (source a is failed; no copy) and layers [2,4) are in no live node's shard"
	if info.Status != "degraded" || !strings.Contains(info.Reason, want) || info.Copies != 0 || info.Replicas != 2 {
		t.Errorf("without a holder: %s %q (copies %d of %d), want %q", info.Status, info.Reason, info.Copies, info.Replicas, want)
	}
	// Every layer in a live node's ready shard: the shards can be fetched.
	st.Shards[coordinator.ShardKey("b", "m")].Hi = 4
	if info := b.ModelInfo(st, m); strings.Contains(info.Reason, "no live node has the model file") {
		t.Errorf("with every layer held: %q", info.Reason)
	}
	st.Shards[coordinator.ShardKey("b", "m")].Hi = 2
	// A live copy of the file.
	m.Holders = map[string]*coordinator.ModelHolder{"b": {Node: "b", Digest: "d", State: coordinator.HolderReady}}
	if info := b.ModelInfo(st, m); strings.Contains(info.Reason, "no live node has the model file") || info.Copies != 1 ||
		len(info.Holders) != 2 || info.Holders[1].NodeName != "b" || info.Holders[1].State != coordinator.HolderReady {
		t.Errorf("with a live copy: %q, copies %d, holders %+v", info.Reason, info.Copies, info.Holders)
	}
	// The copy's node dies too.
	st.Nodes["b"].Status = coordinator.StatusFailed
	want = "no live node has the model file (source a is failed; the copy on b is failed) and layers [0,4)"
	if info := b.ModelInfo(st, m); !strings.Contains(info.Reason, want) {
		t.Errorf("with the copy's node failed: %q, want %q", info.Reason, want)
	}
}
