package node_test

import (
	"context"
	"encoding/json"
	"testing"

	"shoal/api"
	tc "shoal/node/nodetest"
)

// TestMeasuredFromDriver: an agent that does not drive a model answers
// GET /v1/cluster/models/{name}/measured (a read key suffices) with what the
// driver measured of its decode steps beside the plan's prediction: the
// figures placement show prints and the driver's warning compares.
func TestMeasuredFromDriver(t *testing.T) {
	c, _, front := servingElsewhere(t)
	read, err := c.Client(0, tc.Secret).CreateToken(context.Background(), api.TokenRequest{Kind: api.TokenRead})
	if err != nil {
		t.Fatal(err)
	}
	// A plan made before the links were measured may be made again when
	// they are (on a loaded host, during the answer): the new plan's
	// scheduler counts only the steps after it. Another answer then
	// counts in full.
	var m api.Measured
	for try := 0; try < 3 && m.DecodeSteps < 10; try++ {
		if code, body := post(t, front+"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":24,"ignore_eos":true,"temperature":0}`); code != 200 {
			t.Fatalf("chat: %d %s", code, body)
		}
		code, body := request(t, read.Secret, "GET", front+"/v1/cluster/models/tiny/measured", "")
		if code != 200 {
			t.Fatalf("measured through the front agent: %d %s", code, body)
		}
		m = api.Measured{}
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatal(err)
		}
	}
	if m.Driver != "gpu-box" || m.PlanVersion == 0 || m.PredictedMsPerToken <= 0 || m.DecodeSteps < 10 || m.MeasuredMsPerToken <= 0 {
		t.Fatalf("measured: %+v", m)
	}
	t.Logf("driver %s, plan v%d: predicted %.3f ms/token, measured %.3f over %d decode steps", m.Driver, m.PlanVersion, m.PredictedMsPerToken, m.MeasuredMsPerToken, m.DecodeSteps)
	if code, _ := request(t, read.Secret, "GET", front+"/v1/cluster/models/nosuch/measured", ""); code != 404 {
		t.Errorf("an unknown model: %d, want 404", code)
	}
}
