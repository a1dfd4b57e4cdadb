package serve

import (
	"context"
	"slices"
	"testing"
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
	run := func(s *Scheduler, r Request) ([]int32, [][]TokenLogprob) {
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
				break
			}
			toks = append(toks, ev.Token)
			top = append(top, ev.Top)
		}
		return toks, top
	}
	for i, r := range reqs {
		want, top := run(plain, r)
		got, _ := run(spec, r)
		if len(got) != len(want) {
			t.Fatalf("request %d: %d tokens with lookup, %d without", i, len(got), len(want))
		}
		for k := range got {
			if got[k] == want[k] {
				continue
			}
			if tk := top[k]; len(tk) < 2 || tk[1].Token != got[k] || tk[0].Logprob-tk[1].Logprob > 0.05 {
				t.Errorf("request %d: with lookup %v, without %v (position %d, choices %v)", i, got, want, k, tk)
			}
			break
		}
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
