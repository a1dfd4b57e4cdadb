package node_test

import (
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestLookupServing: a --model served with --lookup drafts tokens from the
// context of a repetitive prompt, and /metrics counts the drafts and the
// accepted ones.
func TestLookupServing(t *testing.T) {
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.Models = []node.ModelConfig{{Path: writeModel(t), Name: "spec", Ctx: 512, Lookup: 4}}
	})
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	body := `{"model":"spec","prompt":"one two three four one two three four one two three four one two","max_tokens":48,"temperature":0,"ignore_eos":true}`
	tc.Eventually(t, 20*time.Second, "the model served", func() bool {
		code, _ := request(t, tc.Secret, "POST", base+"/v1/completions", body)
		return code == http.StatusOK
	})
	code, metrics := request(t, tc.Secret, "GET", base+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("metrics: %d", code)
	}
	count := func(name string) float64 {
		m := regexp.MustCompile(name + `\{model="spec"\} (\S+)`).FindStringSubmatch(metrics)
		if m == nil {
			t.Fatalf("no %s for the model in /metrics", name)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	drafted, accepted := count("shoal_draft_tokens_total"), count("shoal_draft_tokens_accepted_total")
	t.Logf("drafted %.0f, accepted %.0f", drafted, accepted)
	if drafted == 0 || accepted > drafted {
		t.Errorf("drafted %.0f, accepted %.0f", drafted, accepted)
	}
}
