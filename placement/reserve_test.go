package placement

import (
	"testing"

	"shoal/engine/quant"
)

// TestPlanReservesKV: a plan for 512 tokens x 4 sequences records them,
// gives each member the KV of its layers and heads for 512 x 4 tokens,
// and counts it in the member's memory (4 times a 1-sequence plan's KV);
// a replan for another batch does not keep the old plan.
func TestPlanReservesKV(t *testing.T) {
	prof, err := shape{name: "m", layers: 16, embd: 2048, heads: 16, kv: 4, ff: 5632, vocab: 32000, typ: quant.Q4_K, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 1 << 30, GFLOPS: 100, MemGBps: 20},
		{ID: "b", Status: StatusAlive, MemFree: 1 << 30, GFLOPS: 100, MemGBps: 20},
	}
	opts := Options{Context: 512, Batch: 4, Strategy: Pipeline, Overhead: 64 << 20}
	p4, err := Place(prof, nodes, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if p4.Context != 512 || p4.Batch != 4 {
		t.Fatalf("plan context %d batch %d, want 512 x 4", p4.Context, p4.Batch)
	}
	o1 := opts
	o1.Batch = 1
	p1, err := Place(prof, nodes, LinkMatrix{}, o1)
	if err != nil {
		t.Fatal(err)
	}
	if !samePlacement(&p1, &p4) {
		t.Fatalf("the batch changed the placement; the comparison below needs the same one")
	}
	var total uint64
	for k, st := range p4.Pools[0].Stages {
		for r, m := range st.Members {
			want := uint64(st.Hi-st.Lo) * 512 * 4 * prof.KVBytesPerToken * uint64(m.HeadHi-m.HeadLo) / uint64(prof.NHead)
			if m.KVBytes != want || want == 0 {
				t.Errorf("stage %d member %s: KV %d bytes, want %d", k, m.Node, m.KVBytes, want)
			}
			m1 := p1.Pools[0].Stages[k].Members[r]
			if m.MemBytes-m1.MemBytes != m.KVBytes-m1.KVBytes || m.KVBytes != 4*m1.KVBytes {
				t.Errorf("stage %d member %s: memory %d (KV %d) for 4 sequences, %d (KV %d) for 1", k, m.Node, m.MemBytes, m.KVBytes, m1.MemBytes, m1.KVBytes)
			}
			if m.MemBytes != heldBytes(&prof, st, m, p4Opts(p4))+opts.Overhead {
				t.Errorf("stage %d member %s: memory %d, recomputed %d", k, m.Node, m.MemBytes, heldBytes(&prof, st, m, p4Opts(p4))+opts.Overhead)
			}
			total += m.KVBytes
		}
	}
	if want := uint64(prof.NLayer) * 512 * 4 * prof.KVBytesPerToken; total != want {
		t.Errorf("the members reserve %d KV bytes, want %d", total, want)
	}

	// The model asked again for one sequence: the plan is not kept.
	d := Replan(prof, nodes, LinkMatrix{}, o1, &p4, "")
	if d.Keep || d.Plan.Batch != 1 || d.Plan.Version != p4.Version+1 {
		t.Errorf("replan for batch 1 over a batch-4 plan: keep %v, batch %d, v%d", d.Keep, d.Plan.Batch, d.Plan.Version)
	}
	if d := Replan(prof, nodes, LinkMatrix{}, opts, &p4, ""); !d.Keep {
		t.Errorf("replan with the same options did not keep the plan: %+v", d.Weighed)
	}
}

func p4Opts(p Plan) Options { return Options{Context: p.Context, Batch: p.Batch} }
