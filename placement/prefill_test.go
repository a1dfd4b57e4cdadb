package placement

import (
	"slices"
	"strings"
	"testing"

	"shoal/engine/quant"
)

// tinyLlamaOnTwo is TinyLlama's shapes in Q4_0 and two equal nodes "a"
// and "b" of gflops each.
func tinyLlamaOnTwo(t *testing.T, gflops float64) (ModelProfile, []Node) {
	t.Helper()
	prof, err := shape{name: "m", layers: 22, embd: 2048, heads: 32, kv: 4, ff: 5632, vocab: 32000, typ: quant.Q4_0, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	return prof, []Node{
		{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: gflops, MemGBps: 20},
		{ID: "b", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: gflops, MemGBps: 20},
	}
}

// TestPredictPrefill (issue #39): a prompt through two pipeline stages of
// equal nodes is predicted at about (P+1)/(2P) of the same prompt run as
// one step (P pieces: the stages compute different pieces at once); one
// stage is not cut; a longer prompt takes longer; tensor parallel over
// two nodes is faster than its slower member's half would suggest only by
// its compute, never below the all-reduces.
func TestPredictPrefill(t *testing.T) {
	prof, nodes := tinyLlamaOnTwo(t, 20)
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
		if !ok || pp.Piece != PrefillPiece(2, n) || pp.Pieces != 16 || len(pp.StageMs) != 2 {
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

// TestPlanForPrompt (issue #39): planned for decode, two equal one-core
// nodes serve TinyLlama's shapes from one node (a second stage's hop
// costs more than its layers save a decode step), and a forced pipeline
// gives the last stage fewer layers for the output matrix. Planned for
// 2,048-token prompts (Options.Prompt) a pipeline's layers are split for
// the prefill pieces (the output runs for one row there: equal halves),
// predicted faster to the first token than the decode split, and the
// planner's choice is the arrangement predicted fastest to the first
// token, faster than one node; with many generated tokens beside the
// prompt it goes back to the plan that decodes fastest.
func TestPlanForPrompt(t *testing.T) {
	prof, err := shape{name: "m", layers: 22, embd: 2048, heads: 32, kv: 4, ff: 5632, vocab: 32000, typ: quant.Q4_0, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 200, MemGBps: 25},
		{ID: "b", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 200, MemGBps: 25},
	}
	var links LinkMatrix
	links.Set("a", "b", Link{Gbit: 10, LatencyMs: 0.05})
	links.Set("b", "a", Link{Gbit: 10, LatencyMs: 0.05})
	o := Options{Context: 2304}
	decode, err := Place(prof, nodes, links, o)
	if err != nil {
		t.Fatal(err)
	}
	po := o
	po.Strategy = Pipeline
	decodePipe, err := Place(prof, nodes, links, po)
	if err != nil {
		t.Fatal(err)
	}
	layers := func(p Plan) []int {
		var out []int
		for _, st := range p.Pools[0].Stages {
			out = append(out, st.Hi-st.Lo)
		}
		return out
	}
	const n = 2048
	o.Prompt, po.Prompt = n, n
	prompt, err := Place(prof, nodes, links, o)
	if err != nil {
		t.Fatal(err)
	}
	promptPipe, err := Place(prof, nodes, links, po)
	if err != nil {
		t.Fatal(err)
	}
	ttft := func(p Plan) float64 {
		pf, ok := PredictPrefill(prof, nodes, links, o, &p, n)
		if !ok {
			t.Fatalf("no prediction for %s %v", p.Strategy, layers(p))
		}
		return pf.Ms
	}
	t.Logf("for decode: %s %v (%.2f ms/token, %.0f ms to prefill %d); pipeline %v (%.0f ms)", decode.Strategy, layers(decode), decode.Cost.MsPerToken, ttft(decode), n, layers(decodePipe), ttft(decodePipe))
	t.Logf("for prompts: %s %v (%.2f ms/token, %.0f ms); pipeline %v", prompt.Strategy, layers(prompt), prompt.Cost.MsPerToken, ttft(prompt), layers(promptPipe))
	for _, l := range prompt.Explain {
		t.Log("  " + l)
	}
	if decode.Strategy != "single" {
		t.Errorf("planned for decode: %s, want single", decode.Strategy)
	}
	if l := layers(decodePipe); l[1] >= l[0] {
		t.Errorf("the decode split %v gives the last stage no fewer layers", l)
	}
	if s := layers(promptPipe); s[0] != 11 || s[1] != 11 {
		t.Errorf("a pipeline planned for %d-token prompts splits %v, want 11/11", n, s)
	}
	if a, b := ttft(promptPipe), ttft(decodePipe); a >= b {
		t.Errorf("predicted TTFT: the prefill split %.0f ms, the decode split %.0f", a, b)
	}
	to := o
	to.Strategy = Tensor
	tensor, err := Place(prof, nodes, links, to)
	if err != nil {
		t.Fatal(err)
	}
	best := min(ttft(promptPipe), ttft(tensor), ttft(decode))
	if got := ttft(prompt); got != best || got >= ttft(decode) {
		t.Errorf("planned for prompts: %s predicted %.0f ms; pipeline %.0f, tensor %.0f, one node %.0f", prompt.Strategy, got, ttft(promptPipe), ttft(tensor), ttft(decode))
	}
	if !slices.ContainsFunc(prompt.Explain, func(l string) bool { return strings.Contains(l, "--plan-prompt") }) {
		t.Errorf("the explanation does not say what the plan is for: %q", prompt.Explain)
	}
	// A re-plan weighs its candidates the same way: the decode plan, one
	// node, is not kept when the model is now planned for prompts.
	if d := Replan(prof, nodes, links, o, &decode, "a"); d.Keep || d.Plan.Strategy == "single" {
		t.Errorf("re-planned for prompts: kept %v, %s (weighed %q)", d.Keep, d.Plan.Strategy, d.Weighed)
	}
	o.Generate = 100000
	long, err := Place(prof, nodes, links, o)
	if err != nil {
		t.Fatal(err)
	}
	if long.Strategy != decode.Strategy {
		t.Errorf("with %d generated tokens: %s, want the decode plan's %s", o.Generate, long.Strategy, decode.Strategy)
	}
	o.Generate = 0
	o.Prompt = -1
	if _, err := Place(prof, nodes, links, o); err == nil || !strings.Contains(err.Error(), "prompt") {
		t.Errorf("a negative prompt: %v", err)
	}
}

// TestDirectLinkAllReduces (issue #39): a measured direct link carries a
// tensor-parallel group's all-reduces at its own bandwidth and message
// cost: a link whose QUIC probe reads 0.5 Gbit/s (QUIC on a slow core)
// and whose direct link reads 8 predicts a TP group's prefill and decode
// faster than the QUIC figures do, and a pipeline's hops, which stay on
// QUIC, the same.
func TestDirectLinkAllReduces(t *testing.T) {
	prof, nodes := tinyLlamaOnTwo(t, 200)
	var quic, direct LinkMatrix
	quic.Set("a", "b", Link{Gbit: 0.5, LatencyMs: 0.1})
	direct.Set("a", "b", Link{Gbit: 0.5, LatencyMs: 0.1, DirectGbit: 8})
	predict := func(links LinkMatrix, s Strategy) (float64, float64) {
		o := Options{Context: 4096, Strategy: s, Pin: []string{"a", "b"}}
		p, err := Place(prof, nodes, links, o)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		pf, ok := PredictPrefill(prof, nodes, links, o, &p, 512)
		if !ok {
			t.Fatalf("%s: no prediction", s)
		}
		return pf.Ms, p.Cost.MsPerToken
	}
	tq, dq := predict(quic, Tensor)
	td, dd := predict(direct, Tensor)
	t.Logf("tensor over 2: 512-token prefill %.0f ms over QUIC, %.0f ms over the direct link; decode %.2f and %.2f ms/token", tq, td, dq, dd)
	if td >= 0.9*tq || dd >= dq {
		t.Errorf("the direct link does not speed up the TP group: prefill %.0f -> %.0f ms, decode %.2f -> %.2f ms", tq, td, dq, dd)
	}
	pq, _ := predict(quic, Pipeline)
	pd, _ := predict(direct, Pipeline)
	if pq != pd {
		t.Errorf("a pipeline's prefill moved with the direct link: %.1f -> %.1f ms", pq, pd)
	}
}

// TestDriverBytes: memory the driver's node holds beyond its share (a
// draft model and its cache) is reserved on rank 0 of the first stage:
// it shows in that member's memory, a node too small for it does not
// drive, and a plan that cannot hold it anywhere is refused.
func TestDriverBytes(t *testing.T) {
	prof, nodes := tinyLlamaOnTwo(t, 20)
	o := Options{Context: 4096}
	plain := mustPlace(t, prof, nodes[:1], o)
	od := o
	od.DriverBytes = 1 << 30
	withDraft := mustPlace(t, prof, nodes[:1], od)
	if got, want := withDraft.Pools[0].Stages[0].Members[0].MemBytes, plain.Pools[0].Stages[0].Members[0].MemBytes+1<<30; got != want {
		t.Errorf("the driver's memory with a 1 GiB draft: %d, want %d", got, want)
	}
	ok := o
	ok.DriverBytes, ok.DriverKVBytesPerToken = 512<<20, 128<<10 // and 128 KiB x 4096 positions
	if got, want := mustPlace(t, prof, nodes[:1], ok).Pools[0].Stages[0].Members[0].MemBytes, plain.Pools[0].Stages[0].Members[0].MemBytes+1<<30; got != want {
		t.Errorf("the driver's memory with a 512 MiB draft and its cache: %d, want %d", got, want)
	}
	od.DriverBytes = 8 << 30
	if _, err := Place(prof, nodes[:1], LinkMatrix{}, od); err == nil {
		t.Error("a draft larger than the only node was placed")
	}
	// a holds its share of a pipeline but not the draft beside it: b drives.
	small := []Node{nodes[0], nodes[1]}
	small[0].MemFree = 2 << 30
	var links LinkMatrix
	links.Set("a", "b", Link{Gbit: 10, LatencyMs: 0.05})
	po := od
	po.DriverBytes, po.Strategy, po.Pin = 4<<30, Pipeline, []string{"a", "b"}
	p, err := Place(prof, small, links, po)
	if err != nil || len(p.Pools[0].Stages) != 2 {
		t.Fatalf("pipeline with a draft: %v (%s)", err, p.Explain)
	}
	if d := p.Pools[0].Stages[0].Members[0].Node; d != "b" {
		t.Errorf("driver %s: the node without room for the draft drives", d)
	}
}
