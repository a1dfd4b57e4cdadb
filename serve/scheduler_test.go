package serve

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"shoal/engine/device"
	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/serve/servetest"
)

func testModel(t *testing.T) *model.Model {
	t.Helper()
	return enginetest.Open(t, enginetest.Tiny)
}

func newSched(t *testing.T, m *model.Model, cacheTokens int, o Options) *Scheduler {
	t.Helper()
	return newSchedOn(t, m, cacheTokens, nil, o)
}

// newSchedOn is a scheduler on a runner of m on dev (the CPU if nil).
func newSchedOn(t *testing.T, m *model.Model, cacheTokens int, dev device.Device, o Options) *Scheduler {
	t.Helper()
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: cacheTokens, Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(r, func(int32) bool { return false }, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); r.Close() })
	return s
}

func prompt(i, n int) []int32 {
	p := make([]int32, n)
	for j := range p {
		p[j] = int32((i*37 + j*11) % 500)
	}
	return p
}

func collect(t *testing.T, ch <-chan Event) ([]int32, Event) {
	t.Helper()
	return servetest.Until(t, ch, func(ev Event) bool { return ev.Done }, func(ev Event) int32 { return ev.Token })
}

func greedy() sample.Params { return sample.Params{} }

// TestBatchedEqualsAlone runs 8 greedy requests at once (they share the
// batch, with chunked prefill) and checks each produces the tokens it
// produces alone. Batched steps may run other kernels than a lone decode
// step (prefill tiles), whose float sums round differently; through the
// quantized activations that can move a logit by ~1e-2, so a greedy choice
// may flip where the two best tokens nearly tie. The test allows exactly
// that: up to the first difference the tokens are equal, and there the
// token chosen batched is the lone run's second choice within 0.05 of the
// first. A batch that mixed up sequences would differ far more.
func TestBatchedEqualsAlone(t *testing.T) {
	m := testModel(t)
	s := newSched(t, m, 2048, Options{MaxSeqs: 8, MaxTokens: 48})
	const n = 8
	type gen struct {
		toks []int32
		top  [][]TokenLogprob
	}
	run := func(ch <-chan Event) gen {
		var g gen
		timeout := time.After(60 * time.Second)
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					t.Fatal("channel closed without a Done event")
				}
				if ev.Done {
					return g
				}
				g.toks = append(g.toks, ev.Token)
				g.top = append(g.top, ev.Top)
			case <-timeout:
				t.Fatal("no Done event within 60 s")
			}
		}
	}
	req := func(i int) Request {
		return Request{Prompt: prompt(i, 10+7*i), MaxTokens: 12, Sampling: greedy(), TopLogprobs: 2}
	}
	alone := make([]gen, n)
	for i := 0; i < n; i++ {
		ch, err := s.Submit(context.Background(), req(i))
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = run(ch)
		if len(alone[i].toks) != 12 {
			t.Fatalf("request %d produced %d tokens", i, len(alone[i].toks))
		}
	}
	var wg sync.WaitGroup
	got := make([]gen, n)
	for i := 0; i < n; i++ {
		ch, err := s.Submit(context.Background(), req(i))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = run(ch) }()
	}
	wg.Wait()
	for i := range got {
		if len(got[i].toks) != 12 {
			t.Fatalf("batched request %d produced %d tokens", i, len(got[i].toks))
		}
		for k, tok := range got[i].toks {
			if tok == alone[i].toks[k] {
				continue
			}
			top := alone[i].top[k]
			if len(top) < 2 || top[1].Token != tok || top[0].Logprob-top[1].Logprob > 0.05 {
				t.Errorf("request %d: batched %v, alone %v (position %d, alone's choices %v)", i, got[i].toks, alone[i].toks, k, top)
			} else {
				t.Logf("request %d: position %d is a near tie (%v); batched chose the second", i, k, top)
			}
			break
		}
	}
	// Running is noted at the end of the step that finished the last one.
	deadline := time.Now().Add(2 * time.Second)
	st := s.Stats()
	for st.Running != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		st = s.Stats()
	}
	if st.KVBlocksUsed != 0 || st.Completed != 2*n || st.Running != 0 {
		t.Fatalf("after all requests: %+v", st)
	}
}

// TestPreemption gives the cache room for fewer sequences than are running:
// the newest is preempted and recomputed, and every request still gets its
// full, correct output.
func TestPreemption(t *testing.T) {
	m := testModel(t)
	ref := newSched(t, m, 2048, Options{MaxSeqs: 1})
	const n = 4
	want := make([][]int32, n)
	for i := 0; i < n; i++ {
		ch, _ := ref.Submit(context.Background(), Request{Prompt: prompt(i, 20), MaxTokens: 40, Sampling: greedy()})
		want[i], _ = collect(t, ch)
	}
	// Every request is queued before the loop's first step: one admitted
	// alone could run ahead and leave the others room enough.
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	s, err := newScheduler(RunnerEngine{r}, func(int32) bool { return false }, Options{MaxSeqs: 4, MaxTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); r.Close() })
	var wg sync.WaitGroup
	got := make([][]int32, n)
	evs := make([]Event, n)
	for i := 0; i < n; i++ {
		ch, err := s.Submit(context.Background(), Request{Prompt: prompt(i, 20), MaxTokens: 40, Sampling: greedy()})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); got[i], evs[i] = collect(t, ch) }()
	}
	go s.loop()
	wg.Wait()
	for i := range got {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: %v, want %v", i, got[i], want[i])
		}
		if evs[i].Reason != "length" || evs[i].Generated != 40 {
			t.Errorf("request %d ended %+v", i, evs[i])
		}
	}
	st := s.Stats()
	if st.Preemptions == 0 {
		t.Fatalf("4 sequences of 60 tokens in a 128-token cache ran without preemption: %+v", st)
	}
	if st.KVBlocksUsed != 0 {
		t.Fatalf("blocks still used: %+v", st)
	}
	t.Logf("preemptions: %d", st.Preemptions)
}

func TestCancelFreesBlocks(t *testing.T) {
	m := testModel(t)
	s := newSched(t, m, 2048, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := s.Submit(ctx, Request{Prompt: prompt(1, 100), Sampling: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until it is generating, then disconnect.
	<-ch
	if s.Stats().KVBlocksUsed == 0 {
		t.Fatal("a running sequence holds no blocks")
	}
	cancel()
	_, ev := collect(t, ch)
	if ev.Reason != "cancelled" {
		t.Fatalf("reason %q", ev.Reason)
	}
	if st := s.Stats(); st.KVBlocksUsed != 0 || st.Cancelled != 1 {
		t.Fatalf("after cancel: %+v", st)
	}
}

func TestRefusals(t *testing.T) {
	m := testModel(t)
	s := newSched(t, m, 64, Options{MaxSeqs: 1, QueueSize: 2})
	_, err := s.Submit(context.Background(), Request{Prompt: prompt(0, 64)})
	if !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), "64 tokens") || !strings.Contains(err.Error(), "holds 64") {
		t.Fatalf("too long: %v", err)
	}
	if _, err := s.Submit(context.Background(), Request{}); !errors.Is(err, ErrBadInput) {
		t.Fatalf("empty prompt: %v", err)
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: []int32{1, 99999}}); !errors.Is(err, ErrBadInput) {
		t.Fatalf("bad token: %v", err)
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: []int32{1}, Sampling: sample.Params{Temperature: -1}}); !errors.Is(err, ErrBadInput) {
		t.Fatalf("bad sampling: %v", err)
	}
	// Fill the queue: one running (long), two waiting, the next is refused.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var chans []<-chan Event
	full := false
	for i := 0; i < 10; i++ {
		ch, err := s.Submit(ctx, Request{Prompt: prompt(i, 8), MaxTokens: 50, Sampling: greedy()})
		if errors.Is(err, ErrQueueFull) {
			full = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if !full {
		t.Fatal("queue of 2 never refused")
	}
	cancel()
	for _, ch := range chans {
		collect(t, ch)
	}
}

func TestLogprobs(t *testing.T) {
	m := testModel(t)
	s := newSched(t, m, 256, Options{})
	ch, err := s.Submit(context.Background(), Request{Prompt: prompt(3, 5), MaxTokens: 3, Sampling: greedy(), Logprobs: true, TopLogprobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	for ev := range ch {
		if ev.Done {
			break
		}
		if len(ev.Top) != 3 || ev.Top[0].Token != ev.Token || ev.Top[0].Logprob != ev.Logprob {
			t.Fatalf("greedy token %d lp %v, top %v", ev.Token, ev.Logprob, ev.Top)
		}
		if !(ev.Top[0].Logprob >= ev.Top[1].Logprob && ev.Top[1].Logprob >= ev.Top[2].Logprob && ev.Logprob <= 0) {
			t.Fatalf("top logprobs not ordered: %v", ev.Top)
		}
	}
}

// TestPrefixCache sends a prompt, then the same prompt, then twice one
// extending it: each reads the full blocks its prompt shares with what ran
// before (the first request's generated tokens follow its prompt, so the
// longer prompt shares 2 blocks, then 4 from its own first run; a block
// holding the last prompt token is always computed), and generates what a
// cold run does, up to a near tie (shared positions were computed in other
// batches).
func TestPrefixCache(t *testing.T) {
	m := testModel(t)
	s := newSched(t, m, 2048, Options{})
	cold := newSched(t, m, 2048, Options{NoPrefixCache: true})
	p := prompt(3, 40)
	longer := append(append([]int32(nil), p...), prompt(4, 30)...)
	type out struct {
		toks []int32
		top  [][]TokenLogprob
		ev   Event
	}
	run := func(s *Scheduler, pr []int32) out {
		ch, err := s.Submit(context.Background(), Request{Prompt: pr, MaxTokens: 10, Sampling: greedy(), TopLogprobs: 2})
		if err != nil {
			t.Fatal(err)
		}
		var o out
		for ev := range ch {
			if ev.Done {
				o.ev = ev
				break
			}
			o.toks = append(o.toks, ev.Token)
			o.top = append(o.top, ev.Top)
		}
		return o
	}
	first := run(s, p)
	if first.ev.Cached != 0 {
		t.Fatalf("first request read %d cached positions", first.ev.Cached)
	}
	for _, c := range []struct {
		pr     []int32
		cached int
	}{{p, 32}, {longer, 32}, {longer, 64}} {
		got, want := run(s, c.pr), run(cold, c.pr)
		if got.ev.Cached != c.cached || got.ev.Prompt != len(c.pr) || want.ev.Cached != 0 {
			t.Fatalf("prompt of %d: cached %d (want %d), cold cached %d", len(c.pr), got.ev.Cached, c.cached, want.ev.Cached)
		}
		for k, tok := range got.toks {
			if tok == want.toks[k] {
				continue
			}
			top := want.top[k]
			if len(top) < 2 || top[1].Token != tok || top[0].Logprob-top[1].Logprob > 0.05 {
				t.Fatalf("prompt of %d: with the prefix cache %v, cold %v", len(c.pr), got.toks, want.toks)
			}
			break
		}
	}
	st := s.Stats()
	if st.CachedPromptTokens != 128 || st.KVBlocksUsed != 0 {
		t.Fatalf("stats %+v: want 128 cached prompt tokens and no block in use", st)
	}
	if cold.Stats().CachedPromptTokens != 0 {
		t.Fatal("NoPrefixCache read the cache")
	}
}

// rowSampler is a RunnerEngine that samples its rows itself, as the last
// stage of a plan on another node does for the driver (RowSampler).
type rowSampler struct {
	RunnerEngine
	samplers map[sample.Params]*sample.Sampler
	steps    int
	accepted *int // when set, counts the chained rows drawn (drafts accepted)
}

func (e *rowSampler) SamplesRemotely() bool { return true }

func (e *rowSampler) StepSampled(b *model.Batch, rows []int, reqs []sample.Request) ([]sample.Result, error) {
	l, err := e.Step(b, rows)
	if err != nil {
		return nil, err
	}
	e.steps++
	V := e.NVocab()
	out := make([]sample.Result, len(rows))
	err = sample.RemoteRows(reqs, func(i int) []float32 { return l[i*V : (i+1)*V] }, func(p sample.Params) *sample.Sampler {
		sm := e.samplers[p]
		if sm == nil {
			sm = sample.New(p, V)
			e.samplers[p] = sm
		}
		return sm
	}, out)
	if e.accepted != nil {
		for i := range reqs {
			if reqs[i].After != nil && out[i-1].Token == *reqs[i].After {
				*e.accepted++
			}
		}
	}
	return out, err
}

// TestSampledWhereTheLogitsAre runs the same seeded, penalized requests on
// a scheduler that samples from the logits and on one whose engine
// samples the rows itself (RowSampler): the same tokens and
// log-probabilities come out, the second scheduler asking its engine for
// tokens every step. With prompt lookup on both (repetitive prompts),
// the drafts are verified where the logits are, each draft's row drawn
// only after the row before drew the draft: the same tokens again, and
// only tokens come back.
func TestSampledWhereTheLogitsAre(t *testing.T) {
	m := testModel(t)
	p := sample.Params{Temperature: 0.8, TopK: 30, TopP: 0.9, MinP: 0.02, RepeatPenalty: 1.1, RepeatLastN: 16, PresencePenalty: 0.3, Seed: 9}
	lookup := false
	run := func(e Engine) [][]Event {
		o := Options{MaxSeqs: 3, MaxTokens: 64}
		if lookup {
			o.Lookup, o.alwaysDraft = 4, true
			// Nearly greedy, mildly penalized: the random model loops, and
			// lookup's drafts are accepted.
			p.Temperature, p.PresencePenalty, p.RepeatPenalty, p.RepeatLastN = 0.2, 0, 1.05, 8
		}
		s, err := NewEngine(e, func(int32) bool { return false }, o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		chs := make([]<-chan Event, 3)
		for i := range chs {
			q := p
			q.Seed += uint64(i)
			pr := prompt(i, 6+5*i)
			if lookup {
				pr = append(pr, pr...)
			}
			if chs[i], err = s.Submit(context.Background(), Request{Prompt: pr, MaxTokens: 20, Sampling: q, TopLogprobs: 2}); err != nil {
				t.Fatal(err)
			}
		}
		out := make([][]Event, len(chs))
		for i, ch := range chs {
			for ev := range ch {
				if ev.Done {
					break
				}
				out[i] = append(out[i], ev)
			}
		}
		return out
	}
	runner := func() *model.Runner {
		r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	want := run(RunnerEngine{runner()})
	rs := &rowSampler{RunnerEngine: RunnerEngine{runner()}, samplers: map[sample.Params]*sample.Sampler{}}
	got := run(rs)
	for i := range want {
		if len(want[i]) != 20 || !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("request %d: sampled by the engine %v, by the scheduler %v", i, got[i], want[i])
		}
	}
	if rs.steps == 0 {
		t.Fatal("the scheduler never asked its RowSampler for tokens")
	}

	lookup = true
	want = run(RunnerEngine{runner()})
	rs = &rowSampler{RunnerEngine: RunnerEngine{runner()}, samplers: map[sample.Params]*sample.Sampler{}, accepted: new(int)}
	got = run(rs)
	for i := range want {
		if len(want[i]) != 20 || !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("lookup, request %d: sampled by the engine %v, by the scheduler %v", i, got[i], want[i])
		}
	}
	if *rs.accepted == 0 {
		t.Fatal("no draft was drawn where the logits are")
	}
	t.Logf("lookup: %d drafts drawn by the engine", *rs.accepted)
}

// TestDecodeMs: a sequence's decode steps, alone in their batches, are
// timed into Stats.DecodeMs; prompt steps and batches of several are not.
func TestDecodeMs(t *testing.T) {
	s := newSched(t, testModel(t), 512, Options{})
	ch, err := s.Submit(context.Background(), Request{Prompt: prompt(0, 20), MaxTokens: 16, Sampling: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := collect(t, ch)
	st := s.Stats()
	// The first token comes from the prompt's step; each later one from a
	// decode step of this sequence alone.
	if want := uint64(len(toks) - 1); st.DecodeSteps != want || st.DecodeMs <= 0 {
		t.Fatalf("%d tokens: %d decode steps timed at %.3f ms, want %d and a positive time", len(toks), st.DecodeSteps, st.DecodeMs, want)
	}
}

// TestPrefillBudget: a prompt alone prefills in steps of PrefillTokens,
// not MaxTokens; a PrefillTime shorter than any step keeps the steps at
// MaxTokens once the first is measured; and while another sequence
// decodes, a prompt gets MaxTokens a step (the decoding stream is not
// held up by a long step).
func TestPrefillBudget(t *testing.T) {
	m := testModel(t)
	p := prompt(3, 200)
	steps := func(o Options) uint64 {
		s := newSched(t, m, 1024, o)
		ch, err := s.Submit(context.Background(), Request{Prompt: p, MaxTokens: 1, Sampling: greedy()})
		if err != nil {
			t.Fatal(err)
		}
		collect(t, ch)
		return s.Stats().Steps
	}
	if n := steps(Options{MaxTokens: 16}); n != 13 {
		t.Errorf("200 tokens at 16 a step: %d steps, want 13", n)
	}
	if n := steps(Options{MaxTokens: 16, PrefillTokens: 256}); n != 1 {
		t.Errorf("200 tokens alone with a prefill budget of 256: %d steps, want 1", n)
	}
	if n := steps(Options{MaxTokens: 16, PrefillTokens: 256, PrefillTime: time.Nanosecond}); n != 13 {
		t.Errorf("200 tokens with a prefill step of at most 1ns: %d steps, want 13", n)
	}
	if n := steps(Options{MaxTokens: 16, PrefillTokens: 256, PrefillTime: time.Hour}); n != 2 {
		t.Errorf("200 tokens with a prefill step of at most an hour: %d steps, want 2 (16 measured, then the rest)", n)
	}
	// A stream decoding: the prompt beside it goes 16 tokens a step at
	// most (steps run by hand: the loop is not started).
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := newScheduler(RunnerEngine{r}, func(int32) bool { return false }, Options{MaxTokens: 16, PrefillTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: prompt(1, 4), MaxTokens: 100, Sampling: greedy()}); err != nil {
		t.Fatal(err)
	}
	s.step() // its prompt; it decodes from here on
	if _, err := s.Submit(context.Background(), Request{Prompt: p, MaxTokens: 1, Sampling: greedy()}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.step()
		if st := s.Stats(); st.LastBatchTokens != 16 {
			t.Errorf("a step beside a decoding stream held %d tokens, want 16 (1 decode token, 15 of the prompt)", st.LastBatchTokens)
		}
	}
}
