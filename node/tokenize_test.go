package node_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestTokenizeEndpoints: POST /tokenize and /detokenize (llama-server's
// shapes) round-trip a text through the served model's vocabulary, name
// the model, refuse ids outside it; GET /health answers like /v1/health.
func TestTokenizeEndpoints(t *testing.T) {
	path := writeModel(t)
	c := tc.NewWith(t, 1, func(_ int, cfg *node.Config) {
		cfg.Models = []node.ModelConfig{{Path: path, Name: "tiny", Ctx: 256}}
	})
	c.Leader(20 * time.Second)
	base := c.Members[0].Agent.HTTPURL()
	var tok struct {
		Model  string  `json:"model"`
		Tokens []int32 `json:"tokens"`
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := post(t, base+"/tokenize", `{"content": "hello world"}`)
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &tok); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tokenize: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if tok.Model != "tiny" || len(tok.Tokens) == 0 {
		t.Fatalf("tokenize: %+v", tok)
	}
	ids, _ := json.Marshal(tok.Tokens)
	code, body := post(t, base+"/detokenize", `{"model": "tiny", "tokens": `+string(ids)+`}`)
	var de struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal([]byte(body), &de); code != http.StatusOK || err != nil || de.Content != "hello world" {
		t.Fatalf("detokenize %s: %d %s", ids, code, body)
	}
	if code, body := post(t, base+"/detokenize", `{"tokens": [-1]}`); code != http.StatusBadRequest {
		t.Fatalf("detokenize of id -1: %d %s", code, body)
	}
	if code, body := post(t, base+"/tokenize", `{"model": "nosuch", "content": "x"}`); code != http.StatusNotFound {
		t.Fatalf("tokenize with an unknown model: %d %s", code, body)
	}
	resp, err := http.Get(base + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /health: %v %v", resp, err)
	}
	resp.Body.Close()
}
