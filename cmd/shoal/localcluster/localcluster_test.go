package localcluster

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"shoal/api"
)

// TestLayout: the banner's model line, read from a plan.
func TestLayout(t *testing.T) {
	m := func(node string, hlo, hhi int) api.PlacementMember {
		return api.PlacementMember{NodeName: node, HeadLo: hlo, HeadHi: hhi}
	}
	for _, tc := range []struct {
		p    api.PlacementInfo
		want string
	}{
		{api.PlacementInfo{Strategy: "pipeline", Stages: []api.PlacementStage{
			{Lo: 0, Hi: 2, Members: []api.PlacementMember{m("node-3", 0, 8)}},
			{Lo: 2, Hi: 3, Members: []api.PlacementMember{m("node-2", 0, 8)}},
			{Lo: 3, Hi: 6, Members: []api.PlacementMember{m("node-1", 0, 8)}},
		}}, "pipeline, node-3 layers 0-1, node-2 layer 2, node-1 layers 3-5"},
		{api.PlacementInfo{Strategy: "single", Stages: []api.PlacementStage{
			{Lo: 0, Hi: 4, Members: []api.PlacementMember{m("node-1", 0, 8)}},
		}}, "single, node-1 layers 0-3"},
		{api.PlacementInfo{Strategy: "tensor", Stages: []api.PlacementStage{
			{Lo: 0, Hi: 4, Members: []api.PlacementMember{m("node-1", 0, 8), m("node-2", 8, 16)}},
		}}, "tensor, layers 0-3 over node-1 heads 0-7 + node-2 heads 8-15"},
		{api.PlacementInfo{Strategy: "pipeline", Stages: []api.PlacementStage{
			{Pool: "prefill", Lo: 0, Hi: 4, Members: []api.PlacementMember{m("node-1", 0, 8)}},
			{Pool: "decode", Lo: 0, Hi: 4, Members: []api.PlacementMember{m("node-2", 0, 8)}},
		}}, "pipeline, prefill node-1 layers 0-3, decode node-2 layers 0-3"},
	} {
		if got := Layout(&tc.p); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}

// TestSettleWaitsForThisRun (issue #38): shoal up --nodes 1 --model X on
// the data dir of an earlier shoal up --nodes 2 --model X finds X in the
// state as that run left it, pinned to its two nodes, and unservable once
// the leader sees the earlier node-2 failed, until node-1 registers X
// again pinned to itself. Up waits for this run's registration instead of
// failing on the earlier one's status.
func TestSettleWaitsForThisRun(t *testing.T) {
	since := time.Now()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v any
		switch r.URL.Path {
		case "/v1/cluster/models":
			m := api.ModelInfo{Name: "x", Status: "unservable", Reason: "placement: pinned node n2 is failed", CreatedAt: since.Add(-time.Hour)}
			if calls.Add(1) > 3 { // node-1 registered it again
				m = api.ModelInfo{Name: "x", Status: "ready", PlanVersion: 3, CreatedAt: since.Add(time.Second),
					Shards: []api.ShardInfo{{NodeName: "node-1", Lo: 0, Hi: 4, State: "ready"}}}
			}
			v = []api.ModelInfo{m}
		case "/v1/cluster/models/x/placement":
			v = api.PlacementInfo{Model: "x", Version: 3, Strategy: "single", Stages: []api.PlacementStage{
				{Lo: 0, Hi: 4, Members: []api.PlacementMember{{NodeName: "node-1"}}}}}
		default:
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	defer srv.Close()
	c := &Cluster{Model: "x", exited: make(chan int), since: since}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.settle(ctx, api.NewClient(srv.URL, "k"), []string{"node-1"}); err != nil {
		t.Fatalf("up failed on the earlier run's status: %v", err)
	}
	if c.Layout != "single, node-1 layers 0-3" {
		t.Errorf("layout %q", c.Layout)
	}
}
