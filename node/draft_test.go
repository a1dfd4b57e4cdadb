package node_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

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
			CompletionTokens int `json:"completion_tokens"`
			Details          *struct {
				Accepted int `json:"accepted_prediction_tokens"`
				Rejected int `json:"rejected_prediction_tokens"`
			} `json:"completion_tokens_details"`
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
