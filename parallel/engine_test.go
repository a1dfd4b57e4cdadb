package parallel

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"shoal/engine/model"
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
