package parallel

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/engine/sample"
	"shoal/serve"
)

// The serving scheduler drives a 2-stage cluster through Engine exactly as it
// drives a local runner: several concurrent greedy requests (continuous
// batching, chunked prefill, sequences freed as they finish) produce the same
// tokens, and every member's cache is empty afterwards.
func TestEngineServes(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second})
	s, err := cl.drv.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	eng, err := NewEngine(s, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	prompts := [][]int32{{1, 450, 496, 173}, {1, 299, 432, 172, 97, 278}, {1, 51}}
	run := func(e serve.Engine) [][]int32 {
		sc, err := serve.NewEngine(e, func(int32) bool { return false }, serve.Options{MaxSeqs: 4, MaxTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		out := make([][]int32, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ch, err := sc.Submit(context.Background(), serve.Request{Prompt: p, MaxTokens: 6, Sampling: sample.Params{}})
				if err != nil {
					t.Error(err)
					return
				}
				for ev := range ch {
					if ev.Err != nil {
						t.Errorf("request %d: %v", i, ev.Err)
					}
					if !ev.Done {
						out[i] = append(out[i], ev.Token)
					}
				}
			}()
		}
		wg.Wait()
		if st := sc.Stats(); st.KVBlocksUsed != 0 {
			t.Errorf("%d KV blocks still used after every request finished", st.KVBlocksUsed)
		}
		return out
	}
	want := run(serve.RunnerEngine{R: r})
	got := run(eng)
	for i := range prompts {
		if len(got[i]) != 6 || !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: cluster generated %v, single node %v", i, got[i], want[i])
		}
	}
	if err := s.Err(); err != nil {
		t.Errorf("session: %v", err)
	}
}

// TestEngineReplays: when the session fails mid-generation, the engine
// waits for a new one, replays every running sequence on it and goes on;
// the requests finish with the tokens a single node gives (greedy), as
// they do when a new session is offered without a failure (a plan
// change). With no new session within ReplayWait, the step fails with an
// error that says so.
//
// With the plan's KV cache in Q8_0 the members replay into quantized
// caches, and the tokens are those of a single node with that cache.
func TestEngineReplays(t *testing.T) {
	for _, kt := range []quant.Type{quant.F16, quant.Q8_0} {
		t.Run(strings.ToLower(kt.String()), func(t *testing.T) { engineReplays(t, kt) })
	}
}

func engineReplays(t *testing.T, kt quant.Type) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	if kt != quant.F16 {
		// heads of 32 values, as a quantized cache needs
		spec := denseQ8
		spec.NHead, spec.NHeadKV = 4, 2
		path = enginetest.Write(t, "", spec)
		ref = enginetest.OpenPath(t, path)
		plan = shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
		plan.KVType = strings.ToLower(kt.String())
	}
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second})
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 64, KVType: kt})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	prompts := [][]int32{{1, 450, 496, 173}, {1, 299, 432, 172, 97, 278}, {1, 51}}
	const n = 10
	// run generates every prompt on e; before e's fourth step (every
	// request is still running then: the prompts take a step or two, each
	// request 10 tokens), disturb runs once. (Tied to the client's third
	// token instead, it could run after the scheduler had stepped every
	// request to its end, the events buffered: nothing left to replay.)
	run := func(e serve.Engine, disturb func()) ([][]int32, []error) {
		if disturb != nil {
			e = &stepHook{Engine: e, at: 4, f: disturb}
		}
		sc, err := serve.NewEngine(e, func(int32) bool { return false }, serve.Options{MaxSeqs: 4, MaxTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		out := make([][]int32, len(prompts))
		errs := make([]error, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ch, err := sc.Submit(context.Background(), serve.Request{Prompt: p, MaxTokens: n, Sampling: sample.Params{}})
				if err != nil {
					errs[i] = err
					return
				}
				for ev := range ch {
					if ev.Err != nil {
						errs[i] = ev.Err
					}
					if !ev.Done {
						out[i] = append(out[i], ev.Token)
					}
				}
			}()
		}
		wg.Wait()
		return out, errs
	}
	want, _ := run(serve.RunnerEngine{R: r}, nil)
	open := func() *Session {
		s, err := cl.drv.Open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	for _, c := range []struct {
		name    string
		disturb func(s *Session, e *Engine)
	}{
		{"session fails", func(s *Session, e *Engine) {
			_ = s.Close(context.Background()) // the next step fails
			go func() {
				time.Sleep(200 * time.Millisecond)
				e.Offer(open())
			}()
		}},
		{"new session offered", func(s *Session, e *Engine) { e.Offer(open()) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := open()
			eng, err := NewEngine(s, 64, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			eng.ReplayWait, eng.MaxReplays = 5*time.Second, 2
			got, errs := run(eng, func() { c.disturb(s, eng) })
			for i := range prompts {
				if errs[i] != nil || !slices.Equal(got[i], want[i]) {
					t.Errorf("request %d: %v, generated %v, single node %v", i, errs[i], got[i], want[i])
				}
			}
			if n, pause := eng.Replays(); n != 1 {
				t.Errorf("%d replays, want 1", n)
			} else {
				t.Logf("replayed once, pausing the steps %v", pause.Round(time.Millisecond))
			}
		})
	}

	t.Run("no new session", func(t *testing.T) {
		s := open()
		eng, err := NewEngine(s, 64, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		eng.ReplayWait, eng.MaxReplays = 300*time.Millisecond, 2
		got, errs := run(eng, func() { _ = s.Close(context.Background()) })
		for i, err := range errs {
			// (A request may have finished before the session closed.)
			if len(got[i]) < n && (err == nil || !strings.Contains(err.Error(), "no new session within 300ms")) {
				t.Errorf("request %d: %v after %d tokens", i, err, len(got[i]))
			}
		}
		if errs[0] == nil {
			t.Error("the request that saw the session close finished")
		}
	})
}

// stepHook runs f once before the at-th step of the engine it wraps.
type stepHook struct {
	serve.Engine
	n, at int
	f     func()
}

func (h *stepHook) Step(b *model.Batch, rows []int) ([]float32, error) {
	h.n++
	if h.n == h.at {
		h.f()
	}
	return h.Engine.Step(b, rows)
}

// nearTop reports whether tok is among a distribution's top choices
// within eps of the best: a near tie that another order of float sums (a
// tensor-parallel all-reduce, a batched step) may break the other way.
func nearTop(top []serve.TokenLogprob, tok int32, eps float32) bool {
	for _, c := range top {
		if c.Token == tok {
			return top[0].Logprob-c.Logprob <= eps
		}
	}
	return false
}

// TestEngineSpeculates: speculative decoding through a plan. The
// scheduler drafts by prompt lookup (partly accepted: the members cut the
// rejected positions at the next step) and with a draft model (the same
// file: accepted but where a batched row rounds the other way); the
// greedy tokens are a single node's without speculation, up to the first
// near tie, every member's cache is empty at the end, and the drafts were
// drawn on the last stage: no logits came back to the driver.
func TestEngineSpeculates(t *testing.T) {
	ref, path := openRef(t)
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var prompts [][]int32
	for i := range 3 {
		p := []int32{1}
		for j := range 10 {
			p = append(p, int32(100+(i*37+j*11)%400))
		}
		prompts = append(prompts, append(p, p[1:]...)) // it repeats itself
	}
	const n = 24
	run := func(e serve.Engine, o serve.Options) ([][]int32, [][][]serve.TokenLogprob, serve.Stats) {
		o.MaxSeqs, o.MaxTokens = 4, 64
		sc, err := serve.NewEngine(e, func(int32) bool { return false }, o)
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		out := make([][]int32, len(prompts))
		top := make([][][]serve.TokenLogprob, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			ch, err := sc.Submit(context.Background(), serve.Request{Prompt: p, MaxTokens: n, TopLogprobs: 20})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ev := range ch {
					if ev.Err != nil {
						t.Errorf("request %d: %v", i, ev.Err)
					}
					if !ev.Done {
						out[i] = append(out[i], ev.Token)
						top[i] = append(top[i], ev.Top)
					}
				}
			}()
		}
		wg.Wait()
		st := sc.Stats()
		if st.KVBlocksUsed != 0 {
			t.Errorf("%d KV blocks still used after every request finished", st.KVBlocksUsed)
		}
		return out, top, st
	}
	want, top, _ := run(serve.RunnerEngine{R: r}, serve.Options{})
	for _, name := range []string{"pp2", "tp2"} {
		plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get(name)
		cl := startClusterCache(t, path, plan, Options{Timeout: 10 * time.Second}, 256)
		dr, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 256})
		if err != nil {
			t.Fatal(err)
		}
		defer dr.Close()
		d, err := serve.NewModelDrafter(dr, ref.NVocab)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []struct {
			what string
			opt  serve.Options
		}{{"plain", serve.Options{}}, {"lookup", serve.Options{Lookup: 4}}, {"draft", serve.Options{Draft: d, DraftMax: 4}}} {
			s, err := cl.drv.Open(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			eng, err := NewEngine(s, 256, 0)
			if err != nil {
				t.Fatal(err)
			}
			before := cl.drv.Stats()
			got, _, st := run(eng, o.opt)
			wire := cl.drv.Stats().Sub(before)
			t.Logf("%s, %s: drafted %d, accepted %d; %d bytes of logits", name, o.what, st.Drafted, st.Accepted, wire.Logits)
			// The drafts are verified where the logits are: only tokens
			// come back to the driver (which is not on the last stage).
			if wire.Logits != 0 {
				t.Errorf("%s, %s: %d bytes of logits sent to the driver", name, o.what, wire.Logits)
			}
			if st.Accepted == 0 && o.what != "plain" {
				t.Errorf("%s, %s: none of %d drafts accepted", name, o.what, st.Drafted)
			}
			for i := range prompts {
				if len(got[i]) != n {
					t.Fatalf("%s, %s, request %d: %d tokens", name, o.what, i, len(got[i]))
				}
				for k := range got[i] {
					if got[i][k] == want[i][k] {
						continue
					}
					if tk := top[i][k]; !nearTop(tk, got[i][k], 0.05) {
						t.Errorf("%s, %s, request %d: %v, single node %v (position %d, choices %v)", name, o.what, i, got[i], want[i], k, tk)
					}
					break
				}
			}
			if err := s.Err(); err != nil {
				t.Errorf("%s, %s: session: %v", name, o.what, err)
			}
			_ = s.Close(context.Background())
		}
	}
}

// TestEngineTruncateReplay: a sequence cut back (drafts rejected) and then
// moved to a new session replays what it kept, not what was cut: the
// next step's logits are a single node's for the kept tokens, within the
// rounding of differently batched steps.
func TestEngineTruncateReplay(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second})
	open := func() *Session {
		s, err := cl.drv.Open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	eng, err := NewEngine(open(), 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	step := func(e serve.Engine, toks ...int32) []float32 {
		b := &model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: 3, N: len(toks)}}}
		l, err := e.Step(b, []int{len(toks) - 1})
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l)
	}
	step(eng, 1, 450, 496, 173, 97, 278) // the last three: drafts
	eng.Truncate(3, 3)
	if !eng.Offer(open()) {
		t.Fatal("offer refused")
	}
	got := step(eng, 299) // replays [1 450 496] first
	if n, _ := eng.Replays(); n != 1 {
		t.Fatalf("%d replays, want 1", n)
	}
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	single := serve.RunnerEngine{R: r}
	step(single, 1, 450, 496)
	want := step(single, 299)
	m := enginetest.Compare(want, got, ref.NVocab)
	t.Logf("after a cut and a replay: %s", m)
	if m.NRMSE > 0.05 || m.MaxAbs > 0.2 {
		t.Errorf("logits after a cut and a replay differ from a single node's for the kept tokens: %s", m)
	}
}
