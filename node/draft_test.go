package node_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"shoal/api"
	"shoal/engine/enginetest"
	"shoal/engine/synth"
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
	answer := func(name string) (string, *usageDetails) {
		body := `{"model":"` + name + `","prompt":"one two three four one two three four one two three four one two","max_tokens":40,"temperature":0}`
		var out string
		tc.Eventually(t, 30*time.Second, name+" served", func() bool {
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
	want, none := answer("plain")
	got, d := answer("spec")
	if got != want {
		t.Errorf("with lookup through the pipeline %q, without %q", got, want)
	}
	if none != nil || d == nil || d.Accepted == 0 {
		t.Fatalf("usage details: %+v without lookup, %+v with", none, d)
	}
	t.Logf("through two stages: %d drafts accepted, %d rejected", d.Accepted, d.Rejected)
}

type usageDetails struct {
	Accepted int `json:"accepted_prediction_tokens"`
	Rejected int `json:"rejected_prediction_tokens"`
}
