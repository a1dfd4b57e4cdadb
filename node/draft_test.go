package node_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/coordinator"
	"shoal/engine/enginetest"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestDraftServing: a --model served with --draft (the same weights in a
// lower-bit file) decodes speculatively: the usage of a completion counts
// the drafted tokens the model accepted and rejected, and /metrics the
// drafts.
func TestDraftServing(t *testing.T) {
	draft := enginetest.Write(t, "", synth.Spec{Name: "tiny-q4", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q4_0", Seed: 3})
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.Models = []node.ModelConfig{{Path: writeModel(t), Name: "spec", Ctx: 512, Draft: draft, DraftMax: 4}}
	})
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	body := `{"model":"spec","prompt":"one two three","max_tokens":40,"temperature":0}`
	var out string
	tc.Eventually(t, 20*time.Second, "the model served", func() bool {
		var code int
		code, out = request(t, tc.Secret, "POST", base+"/v1/completions", body)
		return code == http.StatusOK
	})
	var resp struct {
		Usage struct {
			CompletionTokens int           `json:"completion_tokens"`
			Details          *usageDetails `json:"completion_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	u := resp.Usage
	if u.CompletionTokens == 0 || u.Details == nil || u.Details.Accepted+u.Details.Rejected == 0 || u.Details.Accepted >= u.CompletionTokens {
		t.Fatalf("usage of a speculative completion: %s", out)
	}
	t.Logf("%d tokens: %d drafts accepted, %d rejected", u.CompletionTokens, u.Details.Accepted, u.Details.Rejected)
}

// TestLookupThroughPlan: a model loaded over two agents as a pipeline
// with --lookup decodes speculatively through both stages: its greedy
// answer is the one the same file gives loaded without, and the usage
// counts accepted drafts.
func TestLookupThroughPlan(t *testing.T) {
	c, names := equalNodes(t, 2)
	cl := c.Client(0, "")
	path := writeModel(t)
	for _, req := range []api.LoadModelRequest{
		{Path: path, Name: "plain", Nodes: names, Strategy: "pipeline", Ctx: 256},
		{Path: path, Name: "spec", Nodes: names, Strategy: "pipeline", Ctx: 256, Lookup: 4},
	} {
		if _, err := cl.LoadModel(ctx(t), req); err != nil {
			t.Fatal(err)
		}
		waitModelReady(t, c, req.Name)
		if pl, err := cl.Placement(ctx(t), req.Name); err != nil || len(pl.Stages) != 2 {
			t.Fatalf("%s: placement %+v, %v: want two stages", req.Name, pl, err)
		}
	}
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	prompt := "one two three four one two three four one two three four one two"
	want, none := greedyAnswer(t, base, "plain", prompt)
	got, d := greedyAnswer(t, base, "spec", prompt)
	if got != want {
		t.Errorf("with lookup through the pipeline %q, without %q", got, want)
	}
	if none != nil || d == nil || d.Accepted == 0 {
		t.Fatalf("usage details: %+v without lookup, %+v with", none, d)
	}
	t.Logf("through two stages: %d drafts accepted, %d rejected", d.Accepted, d.Rejected)
}

// greedyAnswer is model name's greedy completion of prompt (40 tokens)
// from the agent at base, and its usage details.
func greedyAnswer(t *testing.T, base, name, prompt string) (string, *usageDetails) {
	t.Helper()
	body := `{"model":"` + name + `","prompt":"` + prompt + `","max_tokens":40,"temperature":0}`
	var out string
	tc.Eventually(t, 60*time.Second, name+" served", func() bool {
		var code int
		code, out = request(t, tc.Secret, "POST", base+"/v1/completions", body)
		return code == http.StatusOK
	})
	var resp struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			Details *usageDetails `json:"completion_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Choices) != 1 {
		t.Fatalf("%s: %s (%v)", name, out, err)
	}
	return resp.Choices[0].Text, resp.Usage.Details
}

type usageDetails struct {
	Accepted int `json:"accepted_prediction_tokens"`
	Rejected int `json:"rejected_prediction_tokens"`
}

// TestDraftThroughPlan: a model loaded over two agents as a pipeline with
// --draft (a lower-bit file of the same weights) drafts on the node that
// drives it: that node fetches the draft whole from the source and
// reports its shard, the greedy answer is the one the file gives without
// a draft, and the usage counts accepted drafts. Drafts of another
// vocabulary, or beside --lookup or --hub, are refused when loading.
func TestDraftThroughPlan(t *testing.T) {
	// server-1 has more room: it drives a plan with a draft, and the
	// draft's file is on server-0, so it is fetched over the network.
	c, names := fingerprinted(t, 2, func(i int, cfg *node.Config) { cfg.MemoryLimit = uint64(2+i) << 30 })
	const src = 0
	cl := c.Client(0, "")
	path := writeModel(t)
	draft := enginetest.Write(t, "", synth.Spec{Name: "tiny-q4", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q4_0", Seed: 3})
	v, err := tokenizer.ByteLevelVocab(280) // 20 merges fewer than the model's
	if err != nil {
		t.Fatal(err)
	}
	v.Pad(512)
	other := enginetest.Write(t, "", synth.Spec{Name: "other", Arch: "llama", NEmbd: 64, NLayer: 1, NHead: 4, NFF: 128, Type: "q8_0", Seed: 5, Tokenizer: v.KVs()})
	for _, bad := range []struct {
		req  api.LoadModelRequest
		want string
	}{
		{api.LoadModelRequest{Path: path, Name: "bad", Draft: other}, "vocabular"},
		{api.LoadModelRequest{Path: path, Name: "bad", Draft: draft, Lookup: 4}, "not both"},
		{api.LoadModelRequest{Path: path, Name: "bad", Draft: "relative.gguf"}, "not absolute"},
		{api.LoadModelRequest{Path: path, Name: "bad", Draft: path + ".missing"}, "not found"},
		{api.LoadModelRequest{Path: path, Name: "bad", DraftMax: 4}, "without a draft"},
	} {
		if _, err := cl.LoadModel(ctx(t), bad.req); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("draft %q lookup %d max %d: %v, want an error saying %q", bad.req.Draft, bad.req.Lookup, bad.req.DraftMax, err, bad.want)
		}
	}
	if modelInfo(t, c, 0, "bad") != nil {
		t.Fatal("a refused load registered the model")
	}

	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: path, Name: "plain", Nodes: names, Strategy: "pipeline", Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	waitModelReady(t, c, "plain")
	req := api.LoadModelRequest{Path: path, Name: "spec", Nodes: names, Strategy: "pipeline", Ctx: 256, Draft: draft, DraftMax: 4, Node: names[src]}
	if _, err := cl.LoadModel(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	waitModelReady(t, c, "spec")
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	want, none := greedyAnswer(t, base, "plain", "one two three")
	got, d := greedyAnswer(t, base, "spec", "one two three")
	if got != want {
		t.Errorf("with the draft through the pipeline %q, without %q", got, want)
	}
	if none != nil || d == nil || d.Accepted == 0 {
		t.Fatalf("usage details: %+v without a draft, %+v with", none, d)
	}
	t.Logf("through two stages: %d drafts accepted, %d rejected", d.Accepted, d.Rejected)

	specPl, err := cl.Placement(ctx(t), "spec")
	if err != nil || len(specPl.Stages) != 2 {
		t.Fatalf("placement %+v, %v: want two stages", specPl, err)
	}
	drv := specPl.Stages[0].Members[0].Node
	st := c.Members[0].Agent.Server().FSM().State()
	var reports []string
	for _, sh := range st.Shards {
		if sh.Model == coordinator.DraftShardModel("spec") {
			reports = append(reports, sh.Node)
			t.Logf("draft shard on %s (driver %s, source %s): %s, %d bytes fetched from %q", sh.Node, drv, c.Members[src].Agent.ID(), sh.State, sh.Fetched, sh.Source)
			if sh.State != coordinator.ShardReady || sh.Fetched == 0 || sh.Source != c.Members[src].Agent.ID() {
				t.Errorf("the draft's shard on %s: %+v, want it ready, fetched from the source", sh.Node, sh)
			}
		}
	}
	if len(reports) != 1 || reports[0] != drv || drv == c.Members[src].Agent.ID() {
		t.Errorf("draft shards reported by %v; the driver is %s, the source %s", reports, drv, c.Members[src].Agent.ID())
	}
	if m := st.Models["spec"]; m.Draft == nil || !m.Draft.Hashed() || m.Draft.Layers != 2 {
		t.Errorf("the model's draft in the state: %+v", m.Draft)
	}
	if di := modelInfo(t, c, 0, "spec").Draft; di == nil || di.Path != draft || di.State != coordinator.ShardReady || di.Max != 4 || di.NodeName == c.Members[src].Cfg.Name {
		t.Errorf("model ls's draft: %+v", di)
	}
}

// TestDraftFollowsDriver: when the node that drives a model with a draft
// is drained, the plan moves to the other node, which takes the draft up
// (its own file, or fetched from the source, which still serves while it
// drains) and drafts with it; the answer is unchanged.
func TestDraftFollowsDriver(t *testing.T) {
	c, names := fingerprinted(t, 2, func(i int, cfg *node.Config) { cfg.MemoryLimit = uint64(2+i) << 30 })
	cl := c.Client(0, "")
	path := writeModel(t)
	draft := enginetest.Write(t, "", synth.Spec{Name: "tiny-q4", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q4_0", Seed: 3})
	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: path, Name: "plain", Nodes: names[:1], Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: path, Name: "spec", Ctx: 256, Draft: draft, DraftMax: 4, Node: names[0]}); err != nil {
		t.Fatal(err)
	}
	waitModelReady(t, c, "plain")
	waitModelReady(t, c, "spec")
	driver := func() string {
		pl, err := cl.Placement(ctx(t), "spec")
		if err != nil || len(pl.Stages) == 0 {
			t.Fatalf("placement %+v: %v", pl, err)
		}
		return pl.Stages[0].Members[0].NodeName
	}
	first := driver()
	next := names[0]
	if first == names[0] {
		next = names[1]
	}
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	want, _ := greedyAnswer(t, base, "plain", "one two three")
	if got, d := greedyAnswer(t, base, "spec", "one two three"); got != want || d == nil || d.Accepted == 0 {
		t.Fatalf("on %s: %q (drafts %+v), without a draft %q", first, got, d, want)
	}
	t.Logf("driven by %s; draining it", first)
	if err := cl.Drain(ctx(t), first, true); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 60*time.Second, "the plan moved to "+next, func() bool {
		mi := modelInfo(t, c, 0, "spec")
		return driver() == next && mi != nil && mi.Status == "ready" && mi.Draft != nil && mi.Draft.State == coordinator.ShardReady && mi.Draft.NodeName == next
	})
	var got string
	var d *usageDetails
	tc.Eventually(t, 30*time.Second, "drafts on "+next, func() bool {
		got, d = greedyAnswer(t, base, "spec", "one two three")
		return d != nil && d.Accepted > 0
	})
	if got != want {
		t.Errorf("after the move %q, without a draft %q", got, want)
	}
}

// TestDraftThroughTensor: the same through a tensor-parallel group of the
// two agents: rank 0 drives, drafts, and the group verifies the drafts in
// one pass; the greedy answer is the file's without a draft.
func TestDraftThroughTensor(t *testing.T) {
	c, names := fingerprinted(t, 2, func(i int, cfg *node.Config) { cfg.MemoryLimit = uint64(2+i) << 30 })
	cl := c.Client(0, "")
	path := writeModel(t)
	draft := enginetest.Write(t, "", synth.Spec{Name: "tiny-q4", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q4_0", Seed: 3})
	for _, req := range []api.LoadModelRequest{
		{Path: path, Name: "plain", Nodes: names[:1], Ctx: 256},
		{Path: path, Name: "spec", Nodes: names, Strategy: "tensor", Ctx: 256, Draft: draft, DraftMax: 4},
	} {
		if _, err := cl.LoadModel(ctx(t), req); err != nil {
			t.Fatal(err)
		}
		waitModelReady(t, c, req.Name)
	}
	pl, err := cl.Placement(ctx(t), "spec")
	if err != nil || len(pl.Stages) != 1 || len(pl.Stages[0].Members) != 2 {
		t.Fatalf("placement %+v, %v: want one tensor-parallel group of two", pl, err)
	}
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	want, _ := greedyAnswer(t, base, "plain", "one two three")
	got, d := greedyAnswer(t, base, "spec", "one two three")
	if got != want {
		t.Errorf("with the draft through the tensor group %q, without %q", got, want)
	}
	if d == nil || d.Accepted == 0 {
		t.Fatalf("usage details with the draft: %+v", d)
	}
	t.Logf("through a tensor group of two: %d drafts accepted, %d rejected", d.Accepted, d.Rejected)
}
