package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"shoal/api/loadgen"
)

// runBenchEndpoint runs the command (not yet registered in main.go) with
// args and returns stdout.
func runBenchEndpoint(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := benchEndpointCmd()
	var out, errb bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	err := cmd.Execute()
	t.Logf("stderr:\n%s", errb.String())
	return out.String(), err
}

func TestBenchEndpointCommand(t *testing.T) {
	var calls atomic.Int64
	var lastPath, lastAuth, bodies atomic.Value
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastAuth.Store(r.Header.Get("Authorization"))
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m1","object":"model"}]}`)
			return
		}
		calls.Add(1)
		lastPath.Store(r.URL.Path)
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		old, _ := bodies.Load().([]string)
		bodies.Store(append(old, string(body)))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x%d\",\"delta\":{\"content\":\"x%d\"}}]}\n\n", i, i)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()

	out, err := runBenchEndpoint(t, "--endpoint", srv.URL, "--token", "secret", "-c", "1,2", "-n", "3", "--requests", "5", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res loadgen.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	if res.Model != "m1" || res.MaxTokens != 3 || len(res.Levels) != 2 || res.Levels[1].Concurrency != 2 {
		t.Fatalf("result %+v", res)
	}
	for _, l := range res.Levels {
		if l.Requests != 5 || l.Errors != 0 || l.GeneratedTokens != 15 || l.TokensPerSecond <= 0 {
			t.Errorf("c=%d: %+v", l.Concurrency, l)
		}
	}
	if calls.Load() != 11 || lastPath.Load() != "/v1/chat/completions" || lastAuth.Load() != "Bearer secret" {
		t.Errorf("%d calls (want 10 and a warm-up), last %v with %v", calls.Load(), lastPath.Load(), lastAuth.Load())
	}

	out, err = runBenchEndpoint(t, "--endpoint", srv.URL, "-m", "m1", "-c", "3", "--requests", "3", "--api", "completions", "--warmup", "0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "api completions") || !strings.Contains(out, "TTFT p50") || calls.Load() != 14 || lastPath.Load() != "/v1/completions" {
		t.Errorf("table run: %d calls, last %v:\n%s", calls.Load(), lastPath.Load(), out)
	}

	if _, err := runBenchEndpoint(t, "--endpoint", srv.URL, "-c", "1,zero"); err == nil {
		t.Error("a bad -c list was accepted")
	}

	// Steady streams beside a periodic request with a prompt of random
	// token ids: the periodic group is reported apart.
	bodies.Store([]string(nil))
	out, err = runBenchEndpoint(t, "--endpoint", srv.URL, "-m", "m1", "--api", "completions", "-c", "2", "--warmup", "0",
		"--duration", "250ms", "--steady", "--periodic", "100ms", "--periodic-prompt-tokens", "5", "--periodic-max-tokens", "3", "--json")
	if err != nil {
		t.Fatal(err)
	}
	res = loadgen.Result{}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	l := res.Levels[0]
	if !res.Steady || res.Periodic == nil || res.Periodic.PromptTokens != 5 || l.Periodic == nil || l.Periodic.Requests != 2 || l.Requests+l.Cut < 2 {
		t.Errorf("steady with periodic: %s", out)
	}
	var long int
	for _, b := range bodies.Load().([]string) {
		var rb struct {
			Prompt    []int32 `json:"prompt"`
			MaxTokens int     `json:"max_tokens"`
		}
		if json.Unmarshal([]byte(b), &rb) == nil && len(rb.Prompt) == 5 && rb.MaxTokens == 3 {
			long++
		}
	}
	if long != 2 {
		t.Errorf("%d periodic requests with 5 token ids and max_tokens 3, want 2", long)
	}
	if _, err := runBenchEndpoint(t, "--endpoint", srv.URL, "--periodic-prompt-tokens", "5"); err == nil {
		t.Error("--periodic-prompt-tokens without --periodic was accepted")
	}
}
