package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/engine/enginetest"
	"shoal/engine/synth"
	"shoal/node"
	tc "shoal/node/nodetest"
)

func writeModel(t *testing.T) string {
	t.Helper()
	return enginetest.Write(t, "", synth.Spec{Name: "tiny", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q8_0", Seed: 3})
}

// request sends an HTTP request with key and returns the answer's status
// and body.
func request(t *testing.T, key, method, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post sends body with the cluster secret.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	return request(t, tc.Secret, "POST", url, body)
}

// servingElsewhere starts a cluster of one server that holds no model
// and an agent gpu-box that serves model tiny; it returns them and the
// server's HTTP address, once the server lists tiny.
func servingElsewhere(t *testing.T) (*tc.Cluster, *node.Agent, string) {
	t.Helper()
	c := tc.New(t, 1)
	cfg := node.Config{Name: "gpu-box", DataDir: filepath.Join(t.TempDir(), "gpu"), Bind: "127.0.0.1",
		GossipPort: tc.FreeGossipPort(t), QUICPort: tc.FreeUDPPort(t), Token: tc.Secret, Version: "test", Tuning: tc.Tuning,
		Join:   []string{fmt.Sprintf("127.0.0.1:%d", c.Members[0].Cfg.QUICPort)},
		Models: []node.ModelConfig{{Path: writeModel(t), Ctx: 256}}}
	a, err := node.Start(context.Background(), cfg)
	for try := 0; err != nil && strings.Contains(err.Error(), "address already in use") && try < 4; try++ {
		cfg.QUICPort, cfg.GossipPort = tc.FreeUDPPort(t), tc.FreeGossipPort(t)
		a, err = node.Start(context.Background(), cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Shutdown(false) })
	front := "http://" + c.Members[0].Agent.HTTPAddr()

	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", front+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+tc.Secret)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var list struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			if len(list.Data) == 1 && list.Data[0].ID == "tiny" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the front agent never listed the model served by gpu-box")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c, a, front
}

// TestForwardToServingAgent: a server that holds no model accepts OpenAI
// requests for a model another agent serves, lists it in /v1/models, and
// passes completions (plain and streamed) through to that agent.
func TestForwardToServingAgent(t *testing.T) {
	c, a, front := servingElsewhere(t)
	code, body := post(t, front+"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	if code != 200 || !strings.Contains(body, `"completion_tokens":5`) {
		t.Fatalf("forwarded chat: %d %s", code, body)
	}
	// A key limited to another model does not see the forwarded one.
	limited, err := c.Client(0, tc.Secret).CreateToken(context.Background(), api.TokenRequest{Kind: api.TokenInference, Models: []string{"elsewhere"}})
	if err != nil {
		t.Fatal(err)
	}
	lreq, _ := http.NewRequest("GET", front+"/v1/models", nil)
	lreq.Header.Set("Authorization", "Bearer "+limited.Secret)
	if resp, err := http.DefaultClient.Do(lreq); err != nil {
		t.Fatal(err)
	} else if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || strings.Contains(string(b), "tiny") {
		t.Errorf("a key limited to other models lists: %d %s", resp.StatusCode, b)
	}
	// GET /v1/models/tiny answers on the front agent as its list does; the
	// limited key gets 404 for it, and an unknown model is 404.
	if code, body := request(t, tc.Secret, "GET", front+"/v1/models/tiny", ""); code != 200 || !strings.Contains(body, `"id":"tiny"`) || !strings.Contains(body, "gpu-box") {
		t.Errorf("GET /v1/models/tiny on the front agent: %d %s", code, body)
	}
	if code, body := request(t, limited.Secret, "GET", front+"/v1/models/tiny", ""); code != 404 {
		t.Errorf("GET /v1/models/tiny with a key limited to other models: %d %s", code, body)
	}
	if code, body := request(t, tc.Secret, "GET", front+"/v1/models/nosuch", ""); code != 404 {
		t.Errorf("GET /v1/models/nosuch: %d %s", code, body)
	}
	// Streamed: the events come through one by one as the serving agent
	// writes them.
	req, _ := http.NewRequest("POST", front+"/v1/completions", strings.NewReader(`{"model":"tiny","prompt":"hello","max_tokens":4,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tc.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("forwarded stream: %d %s", resp.StatusCode, ct)
	}
	events := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: {") {
			events++
		} else if line == "data: [DONE]" {
			break
		}
	}
	resp.Body.Close()
	if events < 2 {
		t.Fatalf("forwarded stream: %d events before [DONE], want the tokens as separate events", events)
	}
	code, body = post(t, front+"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	if code != 404 || !strings.Contains(body, "model_not_found") {
		t.Fatalf("unknown model: %d %s", code, body)
	}
	// The front agent checks the key before passing a request on (the
	// serving agent never sees it): no key, a key for other models, and
	// the marker that stands in for checked keys between agents, sent
	// over HTTP, are refused.
	for _, c := range []struct {
		agent, key string
		want       int
	}{
		{front, "", 401},
		{front, limited.Secret, 404},
		{front, "shoal-forwarded-request", 401},
		{"http://" + a.HTTPAddr(), "shoal-forwarded-request", 401},
	} {
		req, _ = http.NewRequest("POST", c.agent+"/v1/chat/completions", strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`))
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("key %q at %s: %d %s, want %d", c.key, c.agent, resp.StatusCode, b, c.want)
		}
	}

	// The serving agent dies: until gossip notices, the front answers with
	// an OpenAI error that names it; then the model is gone.
	a.Shutdown(false)
	t0 := time.Now()
	code, body = post(t, front+"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	var oe struct {
		Error struct {
			Message, Type, Code string
		}
	}
	if err := json.Unmarshal([]byte(body), &oe); err != nil || oe.Error.Type == "" {
		t.Fatalf("dead serving agent: %d %s, want an OpenAI error", code, body)
	}
	switch {
	case (code == 502 || code == 504) && strings.Contains(oe.Error.Message, "gpu-box") && strings.Contains(oe.Error.Message, "did not answer"):
	case code == 404 && oe.Error.Code == "model_not_found": // gossip noticed first
	default:
		t.Fatalf("dead serving agent: %d %s", code, body)
	}
	t.Logf("dead serving agent after %v: %d %s", time.Since(t0).Round(time.Millisecond), code, oe.Error.Message)
}
