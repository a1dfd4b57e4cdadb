package loadgen_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"shoal/api/loadgen"
	"shoal/engine/enginetest"
	"shoal/node"
	"shoal/node/nodetest"
)

// startAgent starts a one-server cluster on loopback serving a small random
// llama and returns its HTTP base URL.
func startAgent(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	spec := enginetest.Tiny
	spec.Name = "tiny"
	path := enginetest.Write(t, dir, spec)
	cfg := node.Config{
		Name: "bench-node", DataDir: filepath.Join(dir, "data"), Bind: "127.0.0.1",
		Server: true, BootstrapExpect: 1, Token: nodetest.Secret, Version: "test", Tuning: nodetest.Tuning,
		Models: []node.ModelConfig{{Path: path, Ctx: 4096, Threads: 2, MaxSeqs: 16}},
	}
	// A port picked free can be taken by another test process before the
	// agent binds it: then pick again.
	var a *node.Agent
	var err error
	for try := 0; ; try++ {
		cfg.GossipPort, cfg.QUICPort = nodetest.FreeGossipPort(t), nodetest.FreeUDPPort(t)
		if a, err = node.Start(context.Background(), cfg); err == nil || try == 4 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown(false) })
	return "http://" + a.HTTPAddr()
}

func generatedTotal(t *testing.T, base string) float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+nodetest.Secret) // a read key's scope
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	f, ok := fams["shoal_generated_tokens_total"]
	if !ok {
		return 0
	}
	return f.GetMetric()[0].GetCounter().GetValue()
}

// TestAgainstAgent drives a real agent serving a tiny synthetic model at
// three concurrency levels over both endpoints and checks the counts
// against the agent's own metrics. The speeds are only sanity-checked.
func TestAgainstAgent(t *testing.T) {
	base := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	total := 0
	for _, api := range []loadgen.API{loadgen.APIChat, loadgen.APICompletions} {
		b, err := loadgen.New(loadgen.Options{Endpoint: base, APIKey: nodetest.Secret, API: api, MaxTokens: 16,
			Concurrency: []int{1, 4, 8}, Requests: 8, Warmup: -1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var table strings.Builder
		if err := loadgen.WriteTable(&table, res); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s (tiny synthetic model):\n%s", api, table.String())
		if res.Model != "tiny" || len(res.Levels) != 3 {
			t.Fatalf("model %q, %d levels", res.Model, len(res.Levels))
		}
		for _, l := range res.Levels {
			if l.Requests != 8 || l.Errors != 0 {
				t.Errorf("%s c=%d: %d requests, %d errors (%s), want 8 and 0", api, l.Concurrency, l.Requests, l.Errors, l.FirstError)
			}
			if l.GeneratedTokens <= 0 || l.GeneratedTokens > 8*16 || l.PromptTokens <= 0 {
				t.Errorf("%s c=%d: %d generated and %d prompt tokens", api, l.Concurrency, l.GeneratedTokens, l.PromptTokens)
			}
			// A random model may end a request with its first token (end
			// of generation): such a request has no text, hence no TTFT.
			if l.TokensPerSecond <= 0 || l.WallSeconds <= 0 || l.TTFT.N < 1 || l.TTFT.N > 8 || l.TTFT.P50 <= 0 || l.TTFT.P50 > l.TTFT.P99 {
				t.Errorf("%s c=%d: tok/s %v wall %v ttft %+v", api, l.Concurrency, l.TokensPerSecond, l.WallSeconds, l.TTFT)
			}
			if l.InterToken.N == 0 || l.InterToken.P50 <= 0 || l.InterToken.P50 > l.InterToken.P99 {
				t.Errorf("%s c=%d: inter-token %+v", api, l.Concurrency, l.InterToken)
			}
			total += l.GeneratedTokens
		}
	}
	// The agent records a request after its handler returns, which can be
	// just after the client has read the whole response.
	got := generatedTotal(t, base)
	for deadline := time.Now().Add(2 * time.Second); got != float64(total) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		got = generatedTotal(t, base)
	}
	if got != float64(total) {
		t.Errorf("the agent counted %v generated tokens, loadgen %d", got, total)
	}

	// A time-bounded level.
	b, err := loadgen.New(loadgen.Options{Endpoint: base, APIKey: nodetest.Secret, MaxTokens: 8, Concurrency: []int{2},
		Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Levels[0]; l.Requests < 2 || l.Errors != 0 || l.WallSeconds < 0.3 {
		t.Errorf("duration-bound level: %d requests, %d errors, wall %v s", l.Requests, l.Errors, l.WallSeconds)
	}

	// A wrong key fails before any level.
	b, _ = loadgen.New(loadgen.Options{Endpoint: base, APIKey: "nope", Concurrency: []int{1}})
	if _, err := b.Run(ctx); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong key: %v", err)
	}
}
