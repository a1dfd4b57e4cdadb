package placement

import (
	"strings"
	"testing"

	"shoal/engine/quant"
)

// TestFallbackFewLayers: a 2-layer model pinned to 3 nodes with strategy
// pipeline (what `shoal up` asks for by default) has no plan as asked: the
// planner makes a pipeline on 2 of the nodes, says which constraint failed
// and what it did instead, and Replan keeps that plan rather than
// replanning it each time. A model short of memory everywhere still gets
// the memory error.
func TestFallbackFewLayers(t *testing.T) {
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1},
		{ID: "b", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1},
		{ID: "c", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1},
	}
	two, err := shape{name: "two", layers: 2, embd: 256, heads: 8, kv: 2, ff: 704, vocab: 4096, typ: quant.Q8_0, out: quant.Q8_0}.profile()
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Context: 128, Batch: 1, Overhead: 64 << 20, Strategy: Pipeline, Pin: []string{"a", "b", "c"}}
	if _, err := placeExact(two, nodes, LinkMatrix{}, opts); err == nil {
		t.Fatal("a pipeline of 3 stages for 2 layers: the exact options fit")
	}
	p, err := Place(two, nodes, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Pools[0].Stages; len(st) != 2 || p.Strategy != "pipeline" {
		t.Fatalf("plan %s with %d stages, want a pipeline of 2", p.Strategy, len(st))
	}
	f := p.Fallback
	if f == nil || !f.Unpinned || f.Strategy != Pipeline || !strings.Contains(f.Msg, "2 layers for 3 nodes") || !strings.HasPrefix(p.Explain[0], "fallback: ") {
		t.Fatalf("fallback %+v, explain %q", f, p.Explain)
	}
	d := Replan(two, nodes, LinkMatrix{}, opts, &p, "a")
	if d.Unservable != "" || !d.Keep {
		t.Errorf("replanning the fallback plan: %+v", d)
	}

	big, err := shape{name: "big", layers: 2, embd: 4096, heads: 32, kv: 8, ff: 14336, vocab: 128256, typ: quant.Q8_0, out: quant.Q8_0}.profile()
	if err != nil {
		t.Fatal(err)
	}
	small := []Node{{ID: "a", Status: StatusAlive, MemFree: 1 << 30, GFLOPS: 10, MemGBps: 1}}
	_, err = Place(big, small, LinkMatrix{}, Options{Context: 128, Batch: 1, Strategy: Pipeline})
	if err == nil || !strings.Contains(err.Error(), "add nodes or memory") || strings.Contains(err.Error(), "either") {
		t.Errorf("short of memory: %v", err)
	}
}
