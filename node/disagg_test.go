package node_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/engine/enginetest"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestDisaggregatedServing (issue 22): with one agent pinned to prefill
// (--role prefill) and a model loaded with --disagg on, the plan has a
// decode pool and a prefill pool on that agent alone (placement show says
// so); chat completions through any agent prefill there, the KV streams to
// the decode pool over the kv link, and the greedy answers equal those of
// the same file loaded without disaggregation. The driver's metrics count
// the remote prefills, the prefill agent's the KV bytes it sent.
func TestDisaggregatedServing(t *testing.T) {
	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		if i == 2 {
			cfg.Serves = "prefill"
		}
	})
	waitHealthy(t, c, 0, 3, 3, 20*time.Second)
	p := loadSplitAndPlain(t, c, writeModel(t), "split", "plain")
	pools := map[string][]string{}
	for _, st := range p.Stages {
		for _, m := range st.Members {
			pools[st.Pool] = append(pools[st.Pool], m.NodeName)
		}
	}
	t.Logf("plan v%d %s: %v", p.Version, p.Strategy, pools)
	if len(pools["prefill"]) != 1 || pools["prefill"][0] != "server-2" || len(pools["decode"]) == 0 || strings.Contains(strings.Join(pools["decode"], ","), "server-2") {
		t.Fatalf("pools %v: want server-2 alone prefilling, the others decoding", pools)
	}
	mi := modelInfo(t, c, 0, "split")
	for _, sh := range mi.Shards {
		if want := map[bool]string{true: "prefill", false: "decode"}[sh.NodeName == "server-2"]; sh.Pool != want {
			t.Errorf("model ls: %s's shard in pool %q, want %q", sh.NodeName, sh.Pool, want)
		}
	}
	driver := -1
	for i, m := range c.Members {
		if m.Cfg.Name == p.Stages[0].Members[0].NodeName {
			driver = i
		}
	}
	// The driver opens its session to the prefill pool in a reconcile pass
	// after the model is ready (and retries it every few seconds); until
	// then it prefills every prompt itself, which this test does not
	// measure. Wait for a first remote prefill, then count from there.
	driverMetric := func(series string) float64 {
		v, _ := metric(get(t, "http://"+c.Members[driver].Agent.HTTPAddr()+"/metrics"), series)
		return v
	}
	prefillMetric := func(series string) float64 {
		v, _ := metric(get(t, "http://"+c.Members[2].Agent.HTTPAddr()+"/metrics"), series)
		return v
	}
	tc.Eventually(t, 30*time.Second, "a first remote prefill", func() bool {
		post(t, "http://"+c.Members[driver].Agent.HTTPAddr()+"/v1/chat/completions",
			`{"model":"split","messages":[{"role":"user","content":"warm up the prefill pool"}],"max_tokens":1}`)
		return driverMetric(`shoal_remote_prefills_total{model="split",outcome="ok"}`) >= 1
	})
	ok0 := driverMetric(`shoal_remote_prefills_total{model="split",outcome="ok"}`)
	failed0 := driverMetric(`shoal_remote_prefills_total{model="split",outcome="failed"}`)
	sent0 := prefillMetric(`shoal_kv_link_bytes_total{direction="sent",kind="payload"}`)
	framing0 := prefillMetric(`shoal_kv_link_bytes_total{direction="sent",kind="framing"}`)
	prompted := 0 // prompt tokens of the disaggregated model's requests
	answer := func(model string, via int) string {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me about the sea and the shore"}],"max_tokens":8,"temperature":0}`, model)
		var code int
		var out string
		tc.Eventually(t, 30*time.Second, "a completion of "+model, func() bool {
			code, out = post(t, "http://"+c.Members[via].Agent.HTTPAddr()+"/v1/chat/completions", body)
			return code == 200
		})
		var r struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				Prompt int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s: %v %s", model, err, out)
		}
		if model == "split" {
			prompted += r.Usage.Prompt
		}
		return r.Choices[0].Message.Content
	}
	want := answer("plain", 0)
	for via := range c.Members {
		if got := answer("split", via); got != want {
			t.Errorf("through %s the disaggregated model answers %q, the plain one %q", c.Members[via].Cfg.Name, got, want)
		}
	}
	ok := driverMetric(`shoal_remote_prefills_total{model="split",outcome="ok"}`) - ok0
	failed := driverMetric(`shoal_remote_prefills_total{model="split",outcome="failed"}`) - failed0
	if ok < 3 || failed != 0 {
		t.Errorf("the driver (%s) counted %v remote prefills and %v failed, want 3 and 0", c.Members[driver].Cfg.Name, ok, failed)
	}
	sent := prefillMetric(`shoal_kv_link_bytes_total{direction="sent",kind="payload"}`) - sent0
	framing := prefillMetric(`shoal_kv_link_bytes_total{direction="sent",kind="framing"}`) - framing0
	// The tiny model's KV: 2 layers x 4 KV heads x 16 dims, K and V, F16.
	const kvPerToken = 2 * 4 * 16 * 2 * 2
	t.Logf("remote prefills %v (failed %v); the prefill agent sent %v bytes of KV and %v of framing for %d prompt tokens: %.1f B/token (the model's KV is %d), framing %.2f%%",
		ok, failed, sent, framing, prompted, (sent+framing)/float64(prompted), kvPerToken, 100*framing/sent)
	if int(sent) != prompted*kvPerToken {
		t.Errorf("the prefill agent sent %v bytes of KV for %d prompt tokens, want %d", sent, prompted, prompted*kvPerToken)
	}
	if framing <= 0 || framing > 0.03*sent {
		t.Errorf("framing %v bytes on %v of KV: want some, under 3%%", framing, sent)
	}

	// The prefill agent dies: requests are still answered (the decode pool
	// prefills them until the leader's new plan has a prefill pool again),
	// with the same answer.
	c.Stop(2, false)
	killed := time.Now()
	for i := range 3 {
		t0 := time.Now()
		if got := answer("split", 0); got != want {
			t.Errorf("after the prefill agent died, request %d answers %q, want %q", i, got, want)
		}
		t.Logf("request %d after the prefill agent died: %v", i, time.Since(t0).Round(time.Millisecond))
	}
	tc.Eventually(t, 60*time.Second, "a new plan without server-2", func() bool {
		p, err := c.Client(0, "").Placement(ctx(t), "split")
		if err != nil || p.Status != "ready" {
			return false
		}
		for _, st := range p.Stages {
			for _, m := range st.Members {
				if m.NodeName == "server-2" {
					return false
				}
			}
		}
		return true
	})
	t.Logf("re-planned without the prefill agent %v after it died", time.Since(killed).Round(time.Millisecond))
	if got := answer("split", 1); got != want {
		t.Errorf("on the new plan: %q, want %q", got, want)
	}
	// Every request ended: the driver's KV gauge is back to zero.
	drivers := 0
	for i, m := range c.Members {
		if m.Agent == nil {
			continue
		}
		page := get(t, "http://"+m.Agent.HTTPAddr()+"/metrics")
		if used, ok := metric(page, `shoal_kv_blocks_used{model="split"}`); ok {
			drivers++
			if used != 0 {
				t.Errorf("%s: %v KV blocks of the model still used after every request ended", c.Members[i].Cfg.Name, used)
			}
		}
	}
	if drivers != 1 {
		t.Errorf("%d agents report the model's KV gauge, want its one driver", drivers)
	}
}

// TestDisaggregatedMLA (issue 37): a latent-attention model (deepseek2)
// served with a prefill pool: what crosses the kv link is one latent row
// per token and layer ((kv_lora_rank + rope_dim) F16 values, no V), and
// the greedy completions equal those of the same file without
// disaggregation.
func TestDisaggregatedMLA(t *testing.T) {
	oc := enginetest.ArchCase(t, "deepseek2-f16")
	mc := configOf(t, oc.Model)
	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		if i == 2 {
			cfg.Serves = "prefill"
		}
	})
	waitHealthy(t, c, 0, 3, 3, 20*time.Second)
	p := loadSplitAndPlain(t, c, oc.Model, "mla-split", "mla-plain")
	driver := -1
	for i, m := range c.Members {
		if m.Cfg.Name == p.Stages[0].Members[0].NodeName {
			driver = i
		}
	}
	base := func(i int) string { return "http://" + c.Members[i].Agent.HTTPAddr() }
	metricOf := func(i int, series string) float64 {
		v, _ := metric(get(t, base(i)+"/metrics"), series)
		return v
	}
	// a prompt long enough that the cost model sends it to the prefill pool
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 4)
	tc.Eventually(t, 30*time.Second, "a first remote prefill", func() bool {
		post(t, base(driver)+"/v1/completions", fmt.Sprintf(`{"model":"mla-split","prompt":%q,"max_tokens":1}`, "warm "+prompt))
		ok := metricOf(driver, `shoal_remote_prefills_total{model="mla-split",outcome="ok"}`) >= 1
		if !ok {
			for _, l := range strings.Split(get(t, base(driver)+"/metrics"), "\n") {
				if strings.Contains(l, "prefill") && !strings.HasPrefix(l, "#") {
					t.Log(l)
				}
			}
		}
		return ok
	})
	sent0 := metricOf(2, `shoal_kv_link_bytes_total{direction="sent",kind="payload"}`)
	prompted := 0
	answer := func(model string) string {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":8,"temperature":0}`, model, prompt)
		var code int
		var out string
		tc.Eventually(t, 30*time.Second, "a completion of "+model, func() bool {
			code, out = post(t, base(0)+"/v1/completions", body)
			return code == 200
		})
		var r struct {
			Choices []struct{ Text string } `json:"choices"`
			Usage   struct {
				Prompt int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s: %v %s", model, err, out)
		}
		if model == "mla-split" {
			prompted += r.Usage.Prompt
		}
		return r.Choices[0].Text
	}
	want := answer("mla-plain")
	if got := answer("mla-split"); got != want {
		t.Errorf("the disaggregated model answers %q, the plain one %q", got, want)
	}
	sent := metricOf(2, `shoal_kv_link_bytes_total{direction="sent",kind="payload"}`) - sent0
	perToken := (mc.MLA.KVLora + mc.RopeDim) * mc.NLayer * 2
	t.Logf("the prefill agent sent %v bytes of KV for %d prompt tokens: %d per token ((%d + %d) x %d layers x 2)", sent, prompted, int(sent)/max(prompted, 1), mc.MLA.KVLora, mc.RopeDim, mc.NLayer)
	if prompted == 0 || int(sent) != prompted*perToken {
		t.Errorf("the prefill agent sent %v bytes of KV for %d prompt tokens, want %d per token", sent, prompted, perToken)
	}
}

// loadSplitAndPlain loads the file at path twice, as split (disaggregated)
// and plain (not), waits for both to be ready and returns split's
// placement.
func loadSplitAndPlain(t *testing.T, c *tc.Cluster, path, split, plain string) *api.PlacementInfo {
	t.Helper()
	for _, req := range []api.LoadModelRequest{
		{Path: path, Name: split, Ctx: 256, Disagg: "on"},
		{Path: path, Name: plain, Ctx: 256, Disagg: "off"},
	} {
		if _, err := c.Client(0, "").LoadModel(ctx(t), req); err != nil {
			t.Fatal(err)
		}
	}
	tc.Eventually(t, 60*time.Second, "both models ready", func() bool {
		a, b := modelInfo(t, c, 0, split), modelInfo(t, c, 0, plain)
		return a != nil && b != nil && a.Status == "ready" && b.Status == "ready"
	})
	p, err := c.Client(0, "").Placement(ctx(t), split)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
