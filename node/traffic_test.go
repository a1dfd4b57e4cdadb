package node_test

import (
	"context"
	"encoding/json"
	"testing"

	"shoal/api"
	"shoal/api/dashboard"
	tc "shoal/node/nodetest"
)

// TestClusterTraffic: the dashboard's cluster view sums every agent's
// requests by model: a completion asked of the serving agent directly
// and one asked of the front agent (which passes it on: the serving agent
// answers and counts it) both count in the front agent's cluster view,
// where its own figures have none.
func TestClusterTraffic(t *testing.T) {
	c, a, front := servingElsewhere(t)
	// Greedy: a sampled answer of the random model may spell a stop string of
	// its chat template and end early (once at 2 of 6 tokens).
	chat := `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":6,"ignore_eos":true,"temperature":0}`
	if code, body := post(t, front+"/v1/chat/completions", chat); code != 200 {
		t.Fatalf("chat at the front: %d %s", code, body)
	}
	if code, body := post(t, "http://"+a.HTTPAddr()+"/v1/chat/completions", chat); code != 200 {
		t.Fatalf("chat at gpu-box: %d %s", code, body)
	}
	read, err := c.Client(0, tc.Secret).CreateToken(context.Background(), api.TokenRequest{Kind: api.TokenRead})
	if err != nil {
		t.Fatal(err)
	}
	code, body := request(t, read.Secret, "GET", front+"/dashboard/api/cluster-traffic", "")
	if code != 200 {
		t.Fatalf("cluster traffic: %d %s", code, body)
	}
	var ct dashboard.ClusterTraffic
	if err := json.Unmarshal([]byte(body), &ct); err != nil {
		t.Fatal(err)
	}
	if len(ct.Models) != 1 || ct.Models[0].Model != "tiny" || ct.Models[0].Requests != 2 || ct.Models[0].GeneratedTokens != 12 ||
		len(ct.Answered) != 2 || len(ct.Missing) != 0 {
		t.Fatalf("cluster traffic: %s", body)
	}
	code, body = request(t, read.Secret, "GET", front+"/dashboard/api/traffic", "")
	var nt dashboard.NodeTraffic
	if err := json.Unmarshal([]byte(body), &nt); code != 200 || err != nil || nt.Node != "server-0" || len(nt.Models) != 0 {
		t.Fatalf("the front agent's own traffic: %d %s", code, body)
	}
}
