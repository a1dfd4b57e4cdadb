package node

import (
	"testing"

	"shoal/coordinator"
	"shoal/parallel"
	"shoal/placement"
	"shoal/transport"
)

// TestPrefillRule: the routing rule of a disaggregated plan follows its
// mode and cost model: with --disagg on every prompt goes to the prefill
// pool; in auto a prefill node as fast as the decode node or faster takes
// long prompts only (sparing the decode node's streams), over a link too
// slow for the KV none; a plan without a prefill pool has no rule.
// The handoff chunk is about 2 s of the prefill pool's measured speed.
func TestPrefillRule(t *testing.T) {
	// TinyLlama-shaped: 22 layers of ~2 x 50 M weights, 22.5 KB of KV per
	// token over all layers.
	prof := &placement.ModelProfile{NLayer: 22, NEmbd: 2048, NVocab: 32000, KVBytesPerToken: 1024}
	for range 22 {
		prof.Layers = append(prof.Layers, placement.LayerProfile{AttnFLOPs: 2 * 10.5e6, FFNFLOPs: 2 * 34.6e6})
	}
	node := func(id string, gflops float64) *coordinator.Node {
		return &coordinator.Node{ID: id, Status: coordinator.StatusAlive, Caps: coordinator.Capabilities{GFLOPS: gflops}}
	}
	plan := &placement.Plan{Pools: []placement.Pool{
		{Role: placement.RoleDecode, Stages: []placement.Stage{{Lo: 0, Hi: 22, Members: []placement.Member{{Node: "mac"}}}}},
		{Role: placement.RolePrefill, Stages: []placement.Stage{{Lo: 0, Hi: 22, Members: []placement.Member{{Node: "gpu"}}}}},
	}}
	state := func(gbit float64, gpu float64) *coordinator.State {
		st := coordinator.NewState()
		st.Nodes["mac"], st.Nodes["gpu"] = node("mac", 100), node("gpu", gpu)
		st.Links = map[string]*coordinator.LinkStat{
			"gpu>mac": {From: "gpu", To: "mac", Gbit: gbit, LatencyMs: 0.2},
			"mac>gpu": {From: "mac", To: "gpu", Gbit: gbit, LatencyMs: 0.2},
		}
		return st
	}
	cases := []struct {
		name      string
		mode      string
		gbit, gpu float64
		now       parallel.Load
		short     bool // a 100-token prompt goes remote
		long      bool // a 4,000-token prompt goes remote
	}{
		{"on", "on", 1, 100, parallel.Load{}, true, true},
		{"auto, 8x prefill over 10 Gbit", "auto", 10, 800, parallel.Load{}, false, true},
		{"auto, equal nodes", "auto", 10, 100, parallel.Load{}, false, true},
		{"auto, a prefill node 2x slower, idle decode node", "auto", 10, 50, parallel.Load{}, false, false},
		// 8 streams would stall for as long as the prompt prefills here.
		{"auto, a prefill node 2x slower, 8 streams", "auto", 10, 50, parallel.Load{Streams: 8}, false, true},
		{"auto, a prefill node 4x slower", "auto", 10, 25, parallel.Load{}, false, false},
		// The probe said 4x slower; its handoffs showed it as fast.
		{"auto, probed 4x slower, measured equal", "auto", 10, 25, parallel.Load{RemoteTokPerSec: 100e9 / (22*2*45.1e6 + 2*2048*32000)}, false, true},
		{"auto, 8x prefill over 0.01 Gbit", "", 0.01, 800, parallel.Load{Streams: 8}, false, false},
	}
	for _, c := range cases {
		st := state(c.gbit, c.gpu)
		rule, chunk := prefillRule(st, &coordinator.Model{Profile: prof, Disagg: c.mode}, plan)
		if rule == nil {
			t.Fatalf("%s: no rule", c.name)
		}
		if got := rule(100, c.now); got != c.short {
			t.Errorf("%s: a 100-token prompt remote = %v, want %v", c.name, got, c.short)
		}
		if got := rule(4000, c.now); got != c.long {
			t.Errorf("%s: a 4,000-token prompt remote = %v, want %v", c.name, got, c.long)
		}
		if chunk < 32 || chunk > 512 {
			t.Errorf("%s: chunk %d", c.name, chunk)
		}
		t.Logf("%s: chunk %d tokens", c.name, chunk)
	}
	if rule, _ := prefillRule(state(10, 800), &coordinator.Model{Profile: prof}, &placement.Plan{Pools: plan.Pools[:1]}); rule != nil {
		t.Error("a plan without a prefill pool has a rule")
	}
}

// TestWireFor: a model's activations travel in its own choice of wire
// encoding, else f32 for f32 weights (held to the float tolerance), else
// f16.
func TestWireFor(t *testing.T) {
	prof := func(bytesPerWeight float64) *placement.ModelProfile {
		const w = 1e6
		return &placement.ModelProfile{Layers: []placement.LayerProfile{{AttnBytes: uint64(bytesPerWeight * w), AttnFLOPs: 2 * w}}}
	}
	for _, c := range []struct {
		name string
		m    coordinator.Model
		want transport.DType
	}{
		{"q4_0 weights", coordinator.Model{Profile: prof(0.5625)}, transport.F16},
		{"f16 weights", coordinator.Model{Profile: prof(2)}, transport.F16},
		{"f32 weights", coordinator.Model{Profile: prof(4)}, transport.F32},
		{"q4_0, --wire q8_0", coordinator.Model{Profile: prof(0.5625), Wire: "q8_0"}, transport.Q8_0},
		{"f32, --wire f16", coordinator.Model{Profile: prof(4), Wire: "f16"}, transport.F16},
		{"no profile", coordinator.Model{}, parallel.DefaultWire},
	} {
		if got := wireFor(&c.m); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
