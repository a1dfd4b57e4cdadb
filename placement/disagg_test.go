package placement

import (
	"strings"
	"testing"

	"shoal/engine/quant"
)

// TestDisaggPools: auto keeps one shared pool until a node is pinned to
// prefill, then plans the decode pool (first: its driver serves) over the
// other nodes with the model's KV and the prefill pool over the pinned ones
// with KV for one prompt; on picks the node with the most compute per
// memory bandwidth when none is pinned; off ignores pins; impossible asks
// are errors that say what to do. Every plan validates and no node is in
// both pools (the decode pool may use fewer of its nodes, as any plan).
func TestDisaggPools(t *testing.T) {
	sh := shape{name: "dense", layers: 16, embd: 2048, heads: 32, kv: 8, ff: 5632, vocab: 32000, typ: quant.Q4_K, out: quant.Q6_K}
	prof, err := sh.profile()
	if err != nil {
		t.Fatal(err)
	}
	node := func(id string, gflops, gbps float64, serves string) Node {
		return Node{ID: id, Status: StatusAlive, MemFree: 8 << 30, GFLOPS: gflops, MemGBps: gbps, Serves: serves}
	}
	var links LinkMatrix
	links.Default = Link{Gbit: 10, LatencyMs: 0.2}
	cases := []struct {
		name    string
		nodes   []Node
		mode    string
		prefill []string // nil: one shared pool
		err     string
	}{
		{"auto, no pins", []Node{node("a", 400, 100, ""), node("b", 2000, 50, "")}, DisaggAuto, nil, ""},
		{"auto, a pinned prefill node", []Node{node("a", 400, 100, ""), node("b", 2000, 50, ServesPrefill), node("c", 300, 90, "")}, "", []string{"b"}, ""},
		{"on picks compute over bandwidth", []Node{node("mac", 400, 400, ""), node("gpu", 8000, 300, ""), node("pc", 500, 60, "")}, DisaggOn, []string{"gpu"}, ""},
		{"on skips a decode pin", []Node{node("a", 9000, 100, ServesDecode), node("b", 500, 100, "")}, DisaggOn, []string{"b"}, ""},
		{"off ignores pins", []Node{node("a", 400, 100, ""), node("b", 2000, 50, ServesPrefill)}, DisaggOff, nil, ""},
		{"on with one node", []Node{node("a", 400, 100, "")}, DisaggOn, nil, "two nodes or more"},
		{"on, all pinned to decode", []Node{node("a", 400, 100, ServesDecode), node("b", 400, 100, ServesDecode)}, DisaggOn, nil, "pin one to prefill"},
		{"on, all pinned to prefill", []Node{node("a", 400, 100, ServesPrefill), node("b", 400, 100, ServesPrefill)}, DisaggOn, nil, "the decode pool needs one"},
		{"unknown mode", []Node{node("a", 400, 100, "")}, "maybe", nil, "unknown disaggregation mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Place(prof, c.nodes, links, Options{Context: 4096, Batch: 4, Disagg: c.mode})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("want an error about %q, got %v (plan %v)", c.err, err, p.Strategy)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Validate(prof); err != nil {
				t.Fatalf("invalid plan: %v", err)
			}
			if c.prefill == nil {
				if len(p.Pools) != 1 || p.Disaggregated() {
					t.Fatalf("want one shared pool, got %d pools (%s)", len(p.Pools), p.Strategy)
				}
				return
			}
			if len(p.Pools) != 2 || p.Pools[0].Role != RoleDecode || p.Pools[1].Role != RolePrefill {
				t.Fatalf("want a decode then a prefill pool, got %+v", p.Pools)
			}
			pre, dec := poolNodes(p.Pools[1]), poolNodes(p.Pools[0])
			if strings.Join(pre, ",") != strings.Join(c.prefill, ",") {
				t.Errorf("prefill pool %v, want %v", pre, c.prefill)
			}
			for _, n := range pre {
				if contains(dec, n) {
					t.Errorf("%s is in both pools", n)
				}
			}
			if kvP, kvD := poolKV(p.Pools[1]), poolKV(p.Pools[0]); kvP*4 != kvD {
				t.Errorf("the prefill pool reserves %d bytes of KV, the decode pool %d: want a quarter (1 sequence of 4)", kvP, kvD)
			}
			t.Logf("%s: %s", p.Strategy, strings.Join(p.Explain[:1], "; "))
		})
	}
}

func poolNodes(p Pool) []string {
	var out []string
	for _, st := range p.Stages {
		for _, m := range st.Members {
			out = append(out, m.Node)
		}
	}
	return out
}

func poolKV(p Pool) uint64 {
	var n uint64
	for _, st := range p.Stages {
		for _, m := range st.Members {
			n += m.KVBytes
		}
	}
	return n
}
