package node_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// get reads url with the cluster secret, which must answer 200.
func get(t *testing.T, url string) string {
	t.Helper()
	code, b := request(t, tc.Secret, "GET", url, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", url, code, b)
	}
	return b
}

// TestOneServingPath: a model given to an agent with --model and one
// loaded with `model load` are the same kind of model: both are in the
// cluster's model list, ready with a plan and a shard on their node, both
// are listed in /v1/models of every agent, serve completions through any
// agent, and have scheduler metrics on the agent that drives them.
func TestOneServingPath(t *testing.T) {
	c := tc.NewWith(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Models = []node.ModelConfig{{Path: writeModel(t), Name: "pinned", Ctx: 256}}
		}
	})
	ctx := t.Context()
	tc.Eventually(t, 20*time.Second, "a leader", func() bool {
		s, err := c.Client(0, "").Status(ctx)
		return err == nil && s.Leader != "" && s.NodesAlive == 2
	})
	second := c.Members[1].Cfg.Name
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err = c.Client(1, tc.Secret).LoadModel(ctx, api.LoadModelRequest{Path: writeModel(t), Name: "loaded", Node: second, Ctx: 256}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	var models []api.ModelInfo
	tc.Eventually(t, 30*time.Second, "both models ready", func() bool {
		models, err = c.Client(1, tc.Secret).Models(ctx)
		return err == nil && len(models) == 2 && models[0].Status == "ready" && models[1].Status == "ready"
	})
	for _, m := range models {
		if m.PlanVersion == 0 || len(m.Shards) == 0 || m.Shards[0].State != "ready" || m.Digest == "" {
			t.Errorf("model %s: %+v", m.Name, m)
		}
	}
	if models[0].Name != "loaded" || models[1].Name != "pinned" || models[1].SourceName != c.Members[0].Cfg.Name ||
		len(models[1].Shards) != 1 || models[1].Shards[0].NodeName != c.Members[0].Cfg.Name || models[1].Shards[0].Source != "local" {
		t.Errorf("models %+v", models)
	}

	// fields[i][model] is the sorted field names of model's /v1/models
	// entry on agent i (what the dashboard renders a model's row from).
	fields := make([]map[string]string, len(c.Members))
	for i := range c.Members {
		base := "http://" + c.Members[i].Agent.HTTPAddr()
		tc.Eventually(t, 20*time.Second, "both models in /v1/models", func() bool {
			l := get(t, base+"/v1/models")
			return strings.Contains(l, `"pinned"`) && strings.Contains(l, `"loaded"`)
		})
		var list struct{ Data []map[string]any }
		if err := json.Unmarshal([]byte(get(t, base+"/v1/models")), &list); err != nil {
			t.Fatal(err)
		}
		fields[i] = map[string]string{}
		for _, m := range list.Data {
			keys := slices.Sorted(maps.Keys(m))
			fields[i][fmt.Sprint(m["id"])] = strings.Join(keys, ",")
		}
		for _, name := range []string{"pinned", "loaded"} {
			code, body := post(t, base+"/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":3,"temperature":0}`, name)) // greedy: the same tokens every run (sampled, the random model stopped after 1 once)
			var out struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if code != 200 || json.Unmarshal([]byte(body), &out) != nil || out.Usage.CompletionTokens != 3 {
				t.Errorf("completion of %s through %s: %d %s", name, c.Members[i].Cfg.Name, code, body)
			}
		}
	}

	// Each model's scheduler metrics are on the agent that drives it.
	drivers := map[string]int{"pinned": 0}
	p, err := c.Client(0, tc.Secret).Placement(ctx, "loaded")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range c.Members {
		if m.Agent.ID() == p.Stages[0].Members[0].Node {
			drivers["loaded"] = i
		}
	}
	// Each model is listed on the agent that drives it as the other is on
	// its driver, and elsewhere as the other is elsewhere.
	for i := range c.Members {
		for j := range c.Members {
			if (i == drivers["pinned"]) == (j == drivers["loaded"]) && fields[i]["pinned"] != fields[j]["loaded"] {
				t.Errorf("/v1/models entries differ: pinned on agent %d %q, loaded on agent %d %q", i, fields[i]["pinned"], j, fields[j]["loaded"])
			}
		}
	}
	for name, i := range drivers {
		metrics := get(t, "http://"+c.Members[i].Agent.HTTPAddr()+"/metrics")
		if !strings.Contains(metrics, fmt.Sprintf(`shoal_batch_steps_total{model=%q}`, name)) {
			t.Errorf("no scheduler metrics of %s on %s", name, c.Members[i].Cfg.Name)
		}
	}
}
