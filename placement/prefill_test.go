package placement

import (
	"testing"

	"shoal/engine/quant"
)

// TestPredictPrefill (issue #39): a prompt through two pipeline stages of
// equal nodes is predicted at about (P+1)/(2P) of the same prompt run as
// one step (P pieces: the stages compute different pieces at once); one
// stage is not cut; a longer prompt takes longer; tensor parallel over
// two nodes is faster than its slower member's half would suggest only by
// its compute, never below the all-reduces.
func TestPredictPrefill(t *testing.T) {
	prof, err := shape{name: "m", layers: 22, embd: 2048, heads: 32, kv: 4, ff: 5632, vocab: 32000, typ: quant.Q4_0, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 20, MemGBps: 20},
		{ID: "b", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 20, MemGBps: 20},
	}
	var links LinkMatrix
	links.Set("a", "b", Link{Gbit: 10, LatencyMs: 0.05})
	o := Options{Context: 4096}
	one := mustPlace(t, prof, nodes[:1], o)
	po := o
	po.Strategy = Pipeline
	po.Pin = []string{"a", "b"}
	pipe, err := Place(prof, nodes, links, po)
	if err != nil || len(pipe.Pools[0].Stages) != 2 {
		t.Fatalf("pipeline: %v", err)
	}
	for _, n := range []int{512, 2048} {
		single, ok := PredictPrefill(prof, nodes, links, o, &one, n)
		if !ok || single.Pieces != 1 || single.Ms != single.OneStepMs || single.Ms <= 0 {
			t.Fatalf("one node, %d tokens: %+v (ok %v)", n, single, ok)
		}
		pp, ok := PredictPrefill(prof, nodes, links, po, &pipe, n)
		if !ok || pp.Piece != PrefillPiece(2, n) || pp.Pieces != 8 || len(pp.StageMs) != 2 {
			t.Fatalf("pipeline, %d tokens: %+v (ok %v)", n, pp, ok)
		}
		ideal := float64(pp.Pieces+1) / float64(2*pp.Pieces)
		r := pp.Ms / pp.OneStepMs
		t.Logf("%d tokens: one node %.0f ms (%.0f tok/s); pipeline of 2 as one step %.0f ms, in %d pieces of %d %.0f ms (%.2fx one node; ideal %.3f of one step, predicted %.3f)",
			n, single.Ms, float64(n)/single.Ms*1000, pp.OneStepMs, pp.Pieces, pp.Piece, pp.Ms, single.Ms/pp.Ms, ideal, r)
		if r < ideal*0.95 || r > ideal*1.15 {
			t.Errorf("%d tokens: pipelined %.3f of one step, want about %.3f", n, r, ideal)
		}
		if pp.OneStepMs < single.Ms {
			t.Errorf("%d tokens: one step through two stages (%.1f ms) beats one node (%.1f ms)", n, pp.OneStepMs, single.Ms)
		}
		if single.Ms/pp.Ms < 1.6 {
			t.Errorf("%d tokens: the pipeline is %.2fx one node, want about 1.8x", n, single.Ms/pp.Ms)
		}
	}
	short, _ := PredictPrefill(prof, nodes, links, o, &one, 100)
	long, _ := PredictPrefill(prof, nodes, links, o, &one, 1000)
	if long.Ms <= 5*short.Ms {
		t.Errorf("1,000 tokens %.1f ms, 100 tokens %.1f ms", long.Ms, short.Ms)
	}
	if _, ok := PredictPrefill(prof, nodes, links, o, &one, 0); ok {
		t.Error("an empty prompt has a prediction")
	}
}
