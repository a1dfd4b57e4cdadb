package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"shoal/api"
	"shoal/api/openai"
	"shoal/engine/enginetest"
	"shoal/node"
	"shoal/node/nodetest"
)

const (
	nodeName  = "dash-node-1"
	modelName = "tiny-synth"
)

// writeModel writes a small random llama with a byte-level vocabulary.
func writeModel(t testing.TB, dir string) string {
	t.Helper()
	spec := enginetest.Tiny
	spec.Name = modelName
	return enginetest.Write(t, dir, spec)
}

// startAgent starts a one-server cluster on loopback serving the tiny model
// and waits until it leads and lists itself.
func startAgent(t testing.TB) (*node.Agent, string) {
	t.Helper()
	return startAgentWith(t, nil)
}

// startAgentWith is startAgent after edit changed the configuration.
func startAgentWith(t testing.TB, edit func(*node.Config)) (*node.Agent, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := node.Config{
		Name: nodeName, DataDir: filepath.Join(dir, "data"), Bind: "127.0.0.1",
		GossipPort: nodetest.FreeGossipPort(t), QUICPort: nodetest.FreeUDPPort(t),
		Server: true, BootstrapExpect: 1, Token: nodetest.Secret, Version: "test", Tuning: nodetest.Tuning,
		Models: []node.ModelConfig{{Path: writeModel(t, dir), Ctx: 2048, Threads: 2, MaxSeqs: 8}},
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown(false) })
	base := a.HTTPURL()
	ca, _ := os.ReadFile(node.HTTPSCAPath(cfg.DataDir)) // none on plain HTTP
	cl, err := api.NewClientCA(base, nodetest.Secret, ca)
	if err != nil {
		t.Fatal(err)
	}
	nodetest.Eventually(t, 20*time.Second, "the agent to lead and list itself", func() bool {
		nodes, err := cl.Nodes(context.Background())
		return err == nil && len(nodes) == 1 && nodes[0].Name == nodeName
	})
	return a, base
}

// complete runs one non-streamed completion and returns the tokens it
// generated.
func complete(t testing.TB, base, prompt string, maxTokens int) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": modelName, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0})
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+nodetest.Secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d %s", resp.StatusCode, raw)
	}
	var c openai.Completion
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	var u openai.Usage
	if err := json.Unmarshal(c.Usage, &u); err != nil {
		t.Fatalf("usage %s: %v", c.Usage, err)
	}
	if u.CompletionTokens <= 0 {
		t.Fatalf("completion generated no tokens: %s", raw)
	}
	return u.CompletionTokens
}

func getText(t testing.TB, url string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+nodetest.Secret) // /metrics takes a read key
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}
