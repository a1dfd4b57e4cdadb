package localcluster

import (
	"testing"

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
