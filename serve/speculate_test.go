package serve

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/model"
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
		{[]int32{1, 2, 3, 4, 5, 1, 2, 3}, 9, []int32{4, 5, 1, 2, 3}},
		{[]int32{7, 8, 9, 7, 8, 6, 7, 8}, 2, []int32{6, 7}},    // the latest occurrence of 7 8
		{[]int32{1, 2, 9, 2, 3, 1, 2, 3}, 4, []int32{1, 2, 3}}, // "2 3" beats the older "1 2"
		{[]int32{5, 6, 7, 8}, 4, nil},                          // nothing repeats
		{[]int32{4, 4, 4, 4}, 2, []int32{4}},                   // the n-gram overlaps its match: what the context holds after it
		{[]int32{9, 1, 2, 3, 4, 0, 1, 2, 3, 4}, 1, []int32{0}}, // a 4-gram first
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
	spec := newSched(t, m, 2048, Options{MaxSeqs: 4, MaxTokens: 64, Lookup: 4})
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
	spec := newSched(t, m, 1024, Options{MaxSeqs: 4, MaxTokens: 64, Draft: d, DraftMax: 5})
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
