package serve

import (
	"context"
	"sync"
	"testing"

	"shoal/engine/kv"
	"shoal/engine/model"
)

// recorder is an Engine that notes which sequences each step advanced.
type recorder struct {
	RunnerEngine
	mu    sync.Mutex
	steps [][]kv.SeqID
}

func (r *recorder) Step(b *model.Batch, rows []int) ([]float32, error) {
	var seqs []kv.SeqID
	for _, c := range b.Chunks {
		seqs = append(seqs, c.Seq)
	}
	r.mu.Lock()
	r.steps = append(r.steps, seqs)
	r.mu.Unlock()
	return r.RunnerEngine.Step(b, rows)
}

// TestEverySequenceAdvances: with KV for 4 sequences of 128 tokens (a
// plan's max-seqs and ctx), 4 requests with 100-token prompts and no
// token limit run together: each step advances every one still running
// (prefill shares the step's budget, decode is a token each), none is
// preempted for another, and each ends at its own 128 tokens.
func TestEverySequenceAdvances(t *testing.T) {
	m := testModel(t)
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 4 * 128})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{RunnerEngine: RunnerEngine{r}}
	s, err := NewEngine(rec, func(int32) bool { return false }, Options{MaxSeqs: 4, MaxTokens: 64, SeqTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); r.Close() })
	if s.Capacity() != 128 {
		t.Fatalf("capacity %d, want 128 per sequence", s.Capacity())
	}
	// Hold the loop until all four are queued, so they start together.
	rec.mu.Lock()
	chans := make([]<-chan Event, 4)
	for i := range chans {
		if chans[i], err = s.Submit(context.Background(), Request{Prompt: prompt(i, 100), Sampling: greedy()}); err != nil {
			t.Fatal(err)
		}
	}
	rec.mu.Unlock()
	for i, ch := range chans {
		toks, ev := collect(t, ch)
		if ev.Reason != "length" || len(toks) != 28 || ev.Preempted != 0 {
			t.Errorf("request %d: %d tokens, ended %q, preempted %d times", i, len(toks), ev.Reason, ev.Preempted)
		}
	}
	if st := s.Stats(); st.Preemptions != 0 || st.KVBlocksUsed != 0 {
		t.Errorf("stats %+v", st)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// The first step may have run before the others were queued; from
	// the step where all four run to the end, every step has all four.
	start := -1
	for i, seqs := range rec.steps {
		if len(seqs) == 4 {
			start = i
			break
		}
	}
	if start < 0 || start > 1 {
		t.Fatalf("the four sequences never ran together early: steps %v", rec.steps)
	}
	// From then on every step advances every sequence that has not ended
	// (a sequence that started a step earlier ends a step earlier).
	last := map[kv.SeqID]int{}
	for i, seqs := range rec.steps {
		for _, q := range seqs {
			last[q] = i
		}
	}
	for i := start; i < len(rec.steps); i++ {
		in := map[kv.SeqID]bool{}
		for _, q := range rec.steps[i] {
			in[q] = true
		}
		for q, l := range last {
			if i <= l && !in[q] {
				t.Fatalf("step %d did not advance sequence %d, which ran until step %d (steps %v)", i, q, l, rec.steps)
			}
		}
	}
	t.Logf("%d steps, every running sequence in each from step %d", len(rec.steps), start)
}
