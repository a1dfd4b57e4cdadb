package serve

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/serve/servetest"
)

// TestLookup: the tokens after the latest earlier occurrence of the
// longest n-gram ending the context, at most k of them.
func TestLookup(t *testing.T) {
	for _, c := range []struct {
		toks []int32
		k    int
		want []int32
	}{
		{[]int32{1, 2, 3, 4, 5, 1, 2, 3}, 3, []int32{4, 5, 1}},
		{[]int32{1, 2, 3, 4, 5, 1, 2, 3}, 9, []int32{4, 5, 1, 2, 3, 4, 5, 1, 2}}, // past the context's end, the cycle goes on
		{[]int32{7, 8, 9, 7, 8, 6, 7, 8}, 2, []int32{6, 7}},                      // the latest occurrence of 7 8
		{[]int32{1, 2, 9, 2, 3, 1, 2, 3}, 4, []int32{1, 2, 3, 1}},                // "2 3" beats the older "1 2"
		{[]int32{5, 6, 7, 8}, 4, nil},                                            // nothing repeats
		{[]int32{4, 4, 4, 4}, 3, []int32{4, 4, 4}},                               // the n-gram overlaps its match: a token over and over
		{[]int32{9, 1, 2, 3, 4, 0, 1, 2, 3, 4}, 1, []int32{0}},                   // a 4-gram first
		{[]int32{3}, 4, nil},
	} {
		if got := lookup(c.toks, c.k, nil); !slices.Equal(got, c.want) {
			t.Errorf("lookup(%v, %d) = %v, want %v", c.toks, c.k, got, c.want)
		}
	}
}

// TestLookupSpeculation: greedy generations with prompt-lookup drafting
// are the generations without it (up to a near tie, as batched steps may
// round differently: see TestBatchedEqualsAlone), drafts were made and
// accepted, and no KV block is left held.
func TestLookupSpeculation(t *testing.T) {
	m := testModel(t)
	plain := newSched(t, m, 2048, Options{MaxSeqs: 4, MaxTokens: 64})
	spec := newSched(t, m, 2048, Options{MaxSeqs: 4, MaxTokens: 64, Lookup: 4, alwaysDraft: true})
	var reqs []Request
	for i := range 4 {
		// A prompt that repeats itself, as code and edited text do.
		p := prompt(i, 12)
		p = append(p, p...)
		p = append(p, p[:5]...)
		reqs = append(reqs, Request{Prompt: p, MaxTokens: 48, Sampling: greedy(), TopLogprobs: 2})
	}
	for i, r := range reqs {
		want, top, _ := runLength(t, plain, r)
		got, _, _ := runLength(t, spec, r)
		sameGreedy(t, fmt.Sprintf("request %d", i), got, want, top)
	}
	st := spec.Stats()
	t.Logf("drafted %d, accepted %d (%.0f%%); steps %d with lookup, %d without", st.Drafted, st.Accepted, 100*float64(st.Accepted)/float64(max(st.Drafted, 1)), spec.steps.Load(), plain.steps.Load())
	if st.Accepted == 0 || st.Accepted > st.Drafted || spec.steps.Load() >= plain.steps.Load() {
		t.Errorf("drafted %d, accepted %d; %d steps with lookup, %d without", st.Drafted, st.Accepted, spec.steps.Load(), plain.steps.Load())
	}
	if st.KVBlocksUsed != 0 {
		t.Errorf("%d KV blocks held after every request ended", st.KVBlocksUsed)
	}
}

// runLength runs r on s to its length: the tokens, their top choices and
// the final event.
func runLength(t *testing.T, s *Scheduler, r Request) ([]int32, [][]TokenLogprob, Event) {
	t.Helper()
	ch, err := s.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	var top [][]TokenLogprob
	for ev := range ch {
		if ev.Done {
			if ev.Reason != "length" {
				t.Fatalf("ended %q: %v", ev.Reason, ev.Err)
			}
			return toks, top, ev
		}
		toks = append(toks, ev.Token)
		top = append(top, ev.Top)
	}
	t.Fatal("the events ended without a final one")
	return nil, nil, Event{}
}

// sameGreedy checks that greedy tokens got (with speculation) are want
// (without), up to the first near tie of want's top choices, where a
// batched step may round the other way (see TestBatchedEqualsAlone).
func sameGreedy(t *testing.T, what string, got, want []int32, top [][]TokenLogprob) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tokens with speculation, %d without", what, len(got), len(want))
	}
	for k := range got {
		if got[k] == want[k] {
			continue
		}
		if tk := top[k]; len(tk) < 2 || tk[1].Token != got[k] || tk[0].Logprob-tk[1].Logprob > 0.05 {
			t.Errorf("%s: with speculation %v, without %v (position %d, choices %v)", what, got, want, k, tk)
		}
		return
	}
}

// TestDraftModel: a draft model of the same vocabulary (the oracle's
// Q4_K_M file drafting for the Q8_0 file of the same weights) proposes
// tokens the served model verifies: the greedy tokens are those without a
// draft, drafts were accepted, the final event counts them as Stats does,
// and every KV block, the draft model's too, is free at the end.
func TestDraftModel(t *testing.T) {
	var target, draft, other string
	var toks []int32
	for _, c := range enginetest.OracleCases(t) {
		switch c.Name {
		case "llama-q8_0":
			target, toks = c.Model, c.Tokens
		case "llama-q4_k_m":
			draft = c.Model
		case "qwen2-f16":
			other = c.Model
		}
	}
	if target == "" || draft == "" {
		t.Skip("the oracle's llama-q8_0 or llama-q4_k_m case is absent")
	}
	m, dm := enginetest.OpenPath(t, target), enginetest.OpenPath(t, draft)
	dr, err := model.NewRunner(dm, model.Options{Threads: 2, CacheTokens: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dr.Close() })
	d, err := NewModelDrafter(dr, m.NVocab)
	if err != nil {
		t.Fatal(err)
	}
	plain := newSched(t, m, 1024, Options{MaxSeqs: 4, MaxTokens: 64})
	spec := newSched(t, m, 1024, Options{MaxSeqs: 4, MaxTokens: 64, Draft: d, DraftMax: 5, alwaysDraft: true})
	var drafted, accepted int
	for i := range 3 {
		p := append(slices.Clone(toks[:4+4*i]), prompt(i, 3)...)
		r := Request{Prompt: p, MaxTokens: 40, Sampling: greedy(), TopLogprobs: 2}
		want, top, _ := runLength(t, plain, r)
		got, _, end := runLength(t, spec, r)
		sameGreedy(t, fmt.Sprintf("prompt %d", i), got, want, top)
		drafted += end.Drafted
		accepted += end.Accepted
	}
	st := spec.Stats()
	t.Logf("drafted %d, accepted %d (%.0f%%); steps %d with the draft, %d without", st.Drafted, st.Accepted,
		100*float64(st.Accepted)/float64(max(st.Drafted, 1)), spec.steps.Load(), plain.steps.Load())
	if st.Accepted == 0 || spec.steps.Load() >= plain.steps.Load() {
		t.Errorf("drafted %d, accepted %d; %d steps with the draft, %d without", st.Drafted, st.Accepted, spec.steps.Load(), plain.steps.Load())
	}
	if uint64(drafted) != st.Drafted || uint64(accepted) != st.Accepted {
		t.Errorf("the final events count %d drafted, %d accepted; Stats %d, %d", drafted, accepted, st.Drafted, st.Accepted)
	}
	if st.KVBlocksUsed != 0 {
		t.Errorf("%d KV blocks held after every request ended", st.KVBlocksUsed)
	}
	if c := dr.Cache(); c.FreeBlocks() != c.Config().NumBlocks {
		t.Errorf("the draft model holds %d of %d blocks after every request ended", c.Config().NumBlocks-c.FreeBlocks(), c.Config().NumBlocks)
	}
	// A draft of another vocabulary is refused.
	if _, err := NewModelDrafter(dr, m.NVocab+1); err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Errorf("a draft of another vocabulary: %v", err)
	}
	if err := CheckDraft(draft, target); err != nil {
		t.Errorf("the Q4_K_M file drafting for the Q8_0 file: %v", err)
	}
	if other != "" {
		err := CheckDraft(other, target)
		if err == nil || !strings.Contains(err.Error(), "different vocabularies") {
			t.Errorf("a qwen2 file drafting for a llama file: %v", err)
		}
		if _, err := OpenModelDrafter(other, target, 1, 256); err == nil {
			t.Error("OpenModelDrafter took a draft of another vocabulary")
		}
	}
	od, err := OpenModelDrafter(draft, target, 1, 256)
	if err != nil {
		t.Fatal(err)
	}
	if err := od.Close(); err != nil {
		t.Error(err)
	}
}

// TestSpeculativeSampling: sampled generations with prompt-lookup
// drafting come from the distribution of those without. Over many seeds,
// the same seed gives the same tokens (every token is drawn once from its
// own row, with the same random draws; a batched row may round a near
// boundary the other way, so not always), and the rate at which a token
// is the one lookup would have drafted, the statistic a biased
// verification moves first, is the same within sampling noise
// (two-proportion z-test).
func TestSpeculativeSampling(t *testing.T) {
	var p []int32
	var m *model.Model
	for _, c := range enginetest.OracleCases(t) {
		if c.Name == "real-stories260k-f32" {
			m, p = enginetest.OpenPath(t, c.Model), c.Tokens
		}
	}
	if m == nil {
		t.Skip("the oracle's real-stories260k-f32 case is absent")
	}
	// A trained model's stories repeat their phrases: lookup drafts often.
	const seeds, n = 240, 32
	o := Options{MaxSeqs: 16, MaxTokens: 128, QueueSize: seeds}
	plain := newSched(t, m, 8192, o)
	o.Lookup, o.alwaysDraft = 4, true
	spec := newSched(t, m, 8192, o)
	gen := func(s *Scheduler) [][]int32 {
		chs := make([]<-chan Event, seeds)
		for i := range chs {
			var err error
			chs[i], err = s.Submit(context.Background(), Request{Prompt: p, MaxTokens: n,
				Sampling: sample.Params{Temperature: 0.8, Seed: uint64(i + 1)}})
			if err != nil {
				t.Fatal(err)
			}
		}
		out := make([][]int32, seeds)
		for i, ch := range chs {
			out[i], _ = collect(t, ch)
		}
		return out
	}
	// hits counts the generated tokens lookup would have drafted first.
	hits := func(gens [][]int32) (hit, eligible int) {
		for _, g := range gens {
			ctx := slices.Clone(p)
			for _, tok := range g {
				if d := lookup(ctx, 1, nil); len(d) > 0 {
					eligible++
					if d[0] == tok {
						hit++
					}
				}
				ctx = append(ctx, tok)
			}
		}
		return hit, eligible
	}
	a, b := gen(plain), gen(spec)
	same := 0
	for i := range a {
		if slices.Equal(a[i], b[i]) {
			same++
		}
	}
	ha, ea := hits(a)
	hb, eb := hits(b)
	pa, pb := float64(ha)/float64(ea), float64(hb)/float64(eb)
	pool := float64(ha+hb) / float64(ea+eb)
	z := (pb - pa) / math.Sqrt(pool*(1-pool)*(1/float64(ea)+1/float64(eb)))
	st := spec.Stats()
	t.Logf("%d of %d seeds give the same tokens; lookup's token drawn %d/%d (%.3f) without, %d/%d (%.3f) with (z %.2f); drafted %d, accepted %d",
		same, seeds, ha, ea, pa, hb, eb, pb, z, st.Drafted, st.Accepted)
	if st.Drafted == 0 || st.Accepted == 0 {
		t.Fatalf("drafted %d, accepted %d: the test speculated on nothing", st.Drafted, st.Accepted)
	}
	if same < seeds*8/10 {
		t.Errorf("only %d of %d seeds give the same tokens with speculation", same, seeds)
	}
	if math.Abs(z) > 3 {
		t.Errorf("speculation moved the rate of lookup's token from %.3f to %.3f (z %.2f)", pa, pb, z)
	}
}

// BenchmarkSpeculation: one greedy stream of 128 tokens on one thread,
// without speculation, with prompt lookup (up to 8 drafted tokens a
// step) and with a draft model, on the oracle's models: the trained
// stories model (lookup only: it has no smaller sibling), and the Q8_0
// llama file drafted for by its Q4_K_M file. tok/s counts the tokens after
// the first; the acceptance and the tokens per step are reported.
func BenchmarkSpeculation(b *testing.B) {
	cases := map[string]enginetest.OracleCase{}
	for _, c := range enginetest.OracleCases(b) {
		cases[c.Name] = c
	}
	const gen = 128
	run := func(b *testing.B, m *model.Model, p []int32, o Options) {
		r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: 1024})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		o.MaxSeqs = 1
		s, err := New(r, func(int32) bool { return false }, o)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		rate := servetest.StreamRate(b, gen, func() (<-chan Event, error) {
			return s.Submit(context.Background(), Request{Prompt: p, MaxTokens: gen, Sampling: greedy()})
		}, func(ev Event) error { return ev.Err })
		st := s.Stats()
		b.ReportMetric(rate, "tok/s")
		if st.Drafted > 0 {
			b.ReportMetric(float64(st.Accepted)/float64(st.Drafted), "accepted/drafted")
			b.ReportMetric(float64(st.GeneratedTokens)/float64(st.Steps), "tokens/step")
		}
	}
	if c, ok := cases["real-stories260k-f32"]; ok {
		m := enginetest.OpenPath(b, c.Model)
		b.Run("stories/plain", func(b *testing.B) { run(b, m, c.Tokens, Options{}) })
		b.Run("stories/lookup", func(b *testing.B) { run(b, m, c.Tokens, Options{Lookup: 8}) })
	}
	t, okT := cases["llama-q8_0"]
	d, okD := cases["llama-q4_k_m"]
	if okT && okD {
		m := enginetest.OpenPath(b, t.Model)
		b.Run("llama-q8_0/plain", func(b *testing.B) { run(b, m, t.Tokens, Options{}) })
		b.Run("llama-q8_0/lookup", func(b *testing.B) { run(b, m, t.Tokens, Options{Lookup: 8}) })
		b.Run("llama-q8_0/draft-q4_k_m", func(b *testing.B) {
			dr, err := OpenModelDrafter(d.Model, t.Model, 1, 1024)
			if err != nil {
				b.Fatal(err)
			}
			run(b, m, t.Tokens, Options{Draft: dr, DraftMax: 6})
		})
	}
}

// TestDraftGain: drafting that emits fewer tokens a second than steps
// without drafts is paused, and tried again after the pause (a pause twice
// as long each time it loses again); drafting that emits more goes on,
// pausing only for a few steps to measure those without.
func TestDraftGain(t *testing.T) {
	ms := time.Millisecond
	var g draftGain
	// Every step drafts: after gainSteps of them, a probe of steps without.
	for range gainSteps {
		if g.paused() {
			t.Fatal("paused before any decision")
		}
		g.note(true, 10*ms, 2) // 200 tokens/s
	}
	if g.off != gainProbe {
		t.Fatalf("after %d drafted steps and none without: %d steps off, want a probe of %d", gainSteps, g.off, gainProbe)
	}
	for g.paused() {
		g.note(false, 10*ms, 1) // 100 tokens/s
	}
	for range 50 {
		g.note(true, 10*ms, 2)
		if g.paused() {
			t.Fatal("drafting at twice the rate was paused")
		}
	}
	// Drafting turns slow (a small model, drafts rejected): paused.
	var n int
	for n = 0; !g.paused() && n < 100; n++ {
		g.note(true, 30*ms, 1) // 33 tokens/s
	}
	if !g.paused() || g.off != gainPause {
		t.Fatalf("drafting at a third of the rate: paused %v (%d steps off) after %d steps", g.paused(), g.off, n)
	}
	t.Logf("paused after %d slow drafted steps", n)
	for range gainPause {
		g.note(false, 10*ms, 1)
	}
	if g.paused() {
		t.Fatalf("still paused after %d steps", gainPause)
	}
	// Still slow when tried again: a pause twice as long.
	for n = 0; !g.paused() && n < 100; n++ {
		g.note(true, 30*ms, 1)
	}
	if g.off != 2*gainPause {
		t.Fatalf("drafting lost twice: %d steps off, want %d", g.off, 2*gainPause)
	}
	for g.paused() {
		g.note(false, 10*ms, 1)
	}
	// Fast again: drafting goes on, and a later loss pauses briefly.
	for range 3 * gainSteps {
		g.note(true, 5*ms, 2)
		if g.paused() {
			t.Fatal("drafting at four times the rate was paused")
		}
	}
	for n = 0; !g.paused() && n < 100; n++ {
		g.note(true, 30*ms, 1)
	}
	if g.off != gainPause {
		t.Fatalf("a loss after drafting paid: %d steps off, want %d", g.off, gainPause)
	}
}
