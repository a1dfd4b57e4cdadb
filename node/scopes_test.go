package node_test

import (
	"net/http"
	"testing"
	"time"

	"shoal/api"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestKeyScopes: an inference key calls the OpenAI endpoint and nothing of
// the cluster API; a read key reads the cluster API and the dashboard but
// writes nothing and cannot generate; an inference key limited to other
// models finds no model here; an admin key does everything.
func TestKeyScopes(t *testing.T) {
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.Models = []node.ModelConfig{{Path: writeModel(t), Name: "pinned", Ctx: 256}}
	})
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	root := c.Client(0, tc.Secret)
	admin, err := root.CreateToken(t.Context(), api.TokenRequest{Kind: api.TokenAdmin})
	if err != nil {
		t.Fatal(err)
	}
	key := func(req api.TokenRequest) string {
		t.Helper()
		k, err := c.Client(0, admin.Secret).CreateToken(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		return k.Secret
	}
	infer, limited, read := key(api.TokenRequest{Kind: api.TokenInference}),
		key(api.TokenRequest{Kind: api.TokenInference, Models: []string{"elsewhere"}}), key(api.TokenRequest{Kind: api.TokenRead})
	if _, err := c.Client(0, admin.Secret).CreateToken(t.Context(), api.TokenRequest{Kind: api.TokenRead, Models: []string{"x"}}); err == nil {
		t.Error("a read key limited to models was created")
	}
	call := func(key, method, path, body string) int {
		t.Helper()
		code, _ := request(t, key, method, base+path, body)
		return code
	}
	completion := `{"model":"pinned","prompt":"hi","max_tokens":2}`
	tc.Eventually(t, 20*time.Second, "the model served", func() bool {
		return call(admin.Secret, "POST", "/v1/completions", completion) == http.StatusOK
	})
	id := c.Members[0].Agent.ID()
	for _, x := range []struct {
		who, key, method, path, body string
		want                         int
	}{
		{"inference", infer, "POST", "/v1/completions", completion, 200},
		{"inference", infer, "GET", "/v1/models/pinned", "", 200},
		{"inference", infer, "GET", "/v1/status", "", 403},
		{"inference", infer, "GET", "/v1/cluster/models", "", 403},
		{"inference", infer, "POST", "/v1/tokens", `{"kind":"admin"}`, 403},
		{"inference", infer, "POST", "/v1/nodes/" + id + "/drain", "", 403},
		{"inference", infer, "DELETE", "/v1/cluster/models/pinned", "", 403},
		{"inference", infer, "GET", "/dashboard/api/requests", "", 403},
		{"limited", limited, "POST", "/v1/completions", completion, 404},
		{"limited", limited, "GET", "/v1/models/pinned", "", 404},
		{"read", read, "GET", "/v1/status", "", 200},
		{"read", read, "GET", "/v1/nodes", "", 200},
		{"read", read, "GET", "/v1/cluster/models", "", 200},
		{"read", read, "GET", "/dashboard/api/requests", "", 200},
		{"read", read, "GET", "/v1/tokens", "", 403},
		{"read", read, "POST", "/v1/tokens", `{"kind":"admin"}`, 403},
		{"read", read, "POST", "/v1/nodes/" + id + "/drain", "", 403},
		{"read", read, "DELETE", "/v1/cluster/models/pinned", "", 403},
		{"read", read, "POST", "/v1/completions", completion, 401},
		{"read", read, "GET", "/v1/models", "", 200},
		{"admin", admin.Secret, "GET", "/v1/tokens", "", 200},
		{"admin", admin.Secret, "POST", "/v1/completions", completion, 200},
		// A load with an unknown wire encoding or disaggregation mode is
		// refused before anything is read.
		{"admin", admin.Secret, "POST", "/v1/cluster/models", `{"path":"/nowhere.gguf","name":"w","wire":"f64"}`, 400},
		{"admin", admin.Secret, "POST", "/v1/cluster/models", `{"path":"/nowhere.gguf","name":"w","disagg":"maybe"}`, 400},
	} {
		if got := call(x.key, x.method, x.path, x.body); got != x.want {
			t.Errorf("%s key: %s %s = %d, want %d", x.who, x.method, x.path, got, x.want)
		}
	}
	// Nothing the refused calls asked for happened.
	toks, err := c.Client(0, admin.Secret).Tokens(t.Context())
	if err != nil || len(toks) != 5 { // bootstrap, admin, 2 inference, read
		t.Errorf("%d tokens (%v), want 5", len(toks), err)
	}
	if ms, err := c.Client(0, read).Models(t.Context()); err != nil || len(ms) != 1 {
		t.Errorf("models %v %v: the refused unload went through", ms, err)
	}
	if nodes, err := c.Client(0, read).Nodes(t.Context()); err != nil || nodes[0].Draining {
		t.Errorf("nodes %v %v: the refused drain went through", nodes, err)
	}
}
