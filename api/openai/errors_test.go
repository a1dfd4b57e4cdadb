package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"shoal/serve"

	"shoal/api/openai"
	"shoal/node/nodetest"
)

// testKey may use every model; limitedKey only a model "other".
const testKey, limitedKey = "sk-test", "sk-limited"

// checkTestKey is the CheckKey of the tests' endpoints with keys.
func checkTestKey(_ context.Context, k string, _ bool) ([]string, error) {
	switch k {
	case testKey:
		return nil, nil
	case limitedKey:
		return []string{"other"}, nil
	}
	return nil, errors.New("unknown key")
}

func authEnv(t *testing.T, o envOptions) *testEnv {
	o.handler.CheckKey = checkTestKey
	o.neverEOG = true
	return newEnv(t, o)
}

// checkError asserts an OpenAI-shaped error answer.
func checkError(t *testing.T, resp *http.Response, status int, param, code, msgPart string) openai.ErrorBody {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content type %q", ct)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, raw)
	}
	// The four fields are always there (param and code may be null).
	for _, f := range []string{`"message":`, `"type":`, `"param":`, `"code":`} {
		if !bytes.Contains(raw, []byte(f)) {
			t.Fatalf("error body %s lacks %s", raw, f)
		}
	}
	var b openai.ErrorBody
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("error body %s: %v", raw, err)
	}
	if b.Error.Message == "" || b.Error.Type == "" {
		t.Fatalf("error body %s", raw)
	}
	if param != "" && (b.Error.Param == nil || *b.Error.Param != param) {
		t.Fatalf("param: %s, want %q", raw, param)
	}
	if code != "" && (b.Error.Code == nil || *b.Error.Code != code) {
		t.Fatalf("code: %s, want %q", raw, code)
	}
	if msgPart != "" && !strings.Contains(b.Error.Message, msgPart) {
		t.Fatalf("message %q lacks %q", b.Error.Message, msgPart)
	}
	return b
}

// good checks that a normal request still succeeds.
func (e *testEnv) good(t *testing.T) {
	t.Helper()
	resp := e.post(t, "/v1/chat/completions", chatBody("Hello", map[string]any{"max_tokens": 2}), "Authorization", "Bearer "+testKey)
	cc := decodeBody[openai.ChatCompletion](t, resp)
	if resp.StatusCode != http.StatusOK || cc.Usage.CompletionTokens != 2 {
		t.Fatalf("good request after the bad one: %d %+v", resp.StatusCode, cc)
	}
}

func TestBadRequests(t *testing.T) {
	e := authEnv(t, envOptions{})
	auth := []string{"Authorization", "Bearer " + testKey}
	long := strings.Repeat("lorem ipsum dolor sit amet ", 200)
	cases := []struct {
		name    string
		path    string
		body    any
		header  []string
		status  int
		param   string
		code    string
		msgPart string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model": "tiny", "messages": [`, auth, 400, "", "", "parse the JSON"},
		{"not an object", "/v1/chat/completions", `[1, 2]`, auth, 400, "", "", ""},
		{"trailing garbage", "/v1/chat/completions", `{"model": "tiny"} x`, auth, 400, "", "", ""},
		{"empty body", "/v1/chat/completions", ``, auth, 400, "", "", "empty"},
		{"temperature is a string", "/v1/chat/completions", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}`, auth, 400, "temperature", "", "expected a number"},
		{"messages is a number", "/v1/chat/completions", `{"model": "tiny", "messages": 5}`, auth, 400, "messages", "", ""},
		{"content is a number", "/v1/chat/completions", `{"model": "tiny", "messages": [{"role": "user", "content": 5}]}`, auth, 400, "", "", "content"},
		{"stop is a number", "/v1/chat/completions", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stop": 5}`, auth, 400, "stop", "", ""},
		{"max_tokens is a string", "/v1/completions", `{"model": "tiny", "prompt": "hi", "max_tokens": "ten"}`, auth, 400, "max_tokens", "", ""},
		{"empty messages", "/v1/chat/completions", chatBody("", map[string]any{"messages": []any{}}), auth, 400, "messages", "", "non-empty"},
		{"missing messages", "/v1/chat/completions", map[string]any{"model": "tiny"}, auth, 400, "messages", "", ""},
		{"unknown role", "/v1/chat/completions", map[string]any{"model": "tiny", "messages": []map[string]any{{"role": "wizard", "content": "hi"}}}, auth, 400, "messages[0].role", "", ""},
		{"image content", "/v1/chat/completions", map[string]any{"model": "tiny", "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": "http://x"}}}}}}, auth, 400, "messages[0].content", "", "text only"},
		{"prompt over the context", "/v1/chat/completions", chatBody(long, nil), auth, 400, "messages", "context_length_exceeded", "512"},
		{"completion prompt over the context", "/v1/completions", map[string]any{"model": "tiny", "prompt": long}, auth, 400, "prompt", "context_length_exceeded", "512"},
		{"max_tokens 0", "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 0}), auth, 400, "max_tokens", "", ""},
		{"max_tokens negative", "/v1/completions", map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": -3}, auth, 400, "max_tokens", "", ""},
		{"max_completion_tokens 0", "/v1/chat/completions", chatBody("hi", map[string]any{"max_completion_tokens": 0}), auth, 400, "max_completion_tokens", "", ""},
		{"unknown model", "/v1/chat/completions", chatBody("hi", map[string]any{"model": "gpt-17"}), auth, 404, "model", "model_not_found", "gpt-17"},
		{"unknown model on completions", "/v1/completions", map[string]any{"model": "gpt-17", "prompt": "hi"}, auth, 404, "model", "model_not_found", ""},
		{"missing model", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}}, auth, 400, "model", "", ""},
		{"missing API key", "/v1/chat/completions", chatBody("hi", nil), nil, 401, "", "invalid_api_key", ""},
		{"invalid API key", "/v1/chat/completions", chatBody("hi", nil), []string{"Authorization", "Bearer sk-wrong"}, 401, "", "invalid_api_key", ""},
		{"not a bearer key", "/v1/chat/completions", chatBody("hi", nil), []string{"Authorization", "Basic " + testKey}, 401, "", "invalid_api_key", ""},
		{"n = 0", "/v1/chat/completions", chatBody("hi", map[string]any{"n": 0}), auth, 400, "n", "", "n must be between 1 and 16"},
		{"n = 17 on completions", "/v1/completions", map[string]any{"model": "tiny", "prompt": "hi", "n": 17}, auth, 400, "n", "", ""},
		{"temperature out of range", "/v1/chat/completions", chatBody("hi", map[string]any{"temperature": 3}), auth, 400, "temperature", "", ""},
		{"top_p out of range", "/v1/chat/completions", chatBody("hi", map[string]any{"top_p": 1.5}), auth, 400, "top_p", "", ""},
		{"five stops", "/v1/chat/completions", chatBody("hi", map[string]any{"stop": []string{"a", "b", "c", "d", "e"}}), auth, 400, "stop", "", ""},
		{"top_logprobs without logprobs", "/v1/chat/completions", chatBody("hi", map[string]any{"top_logprobs": 2}), auth, 400, "top_logprobs", "", ""},
		{"top_logprobs too many", "/v1/chat/completions", chatBody("hi", map[string]any{"logprobs": true, "top_logprobs": 21}), auth, 400, "top_logprobs", "", ""},
		{"completion logprobs too many", "/v1/completions", map[string]any{"model": "tiny", "prompt": "hi", "logprobs": 50}, auth, 400, "logprobs", "", ""},
		{"several prompts", "/v1/completions", map[string]any{"model": "tiny", "prompt": []string{"a", "b"}}, auth, 400, "prompt", "", ""},
		{"token outside the vocabulary", "/v1/completions", map[string]any{"model": "tiny", "prompt": []int{1, 99999}}, auth, 400, "prompt", "", "99999"},
		{"tools", "/v1/chat/completions", chatBody("hi", map[string]any{"tools": []any{map[string]any{"type": "function"}}}), auth, 400, "tools[0].function.name", "", ""},
		{"unknown URL", "/v1/audio/speech", chatBody("hi", nil), auth, 404, "", "unknown_url", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := e.post(t, c.path, c.body, c.header...)
			checkError(t, resp, c.status, c.param, c.code, c.msgPart)
			e.good(t)
		})
	}
	t.Run("oversized body", func(t *testing.T) {
		big := `{"model": "tiny", "messages": [{"role": "user", "content": "` + strings.Repeat("a", 5<<20) + `"}]}`
		checkError(t, e.post(t, "/v1/chat/completions", big, auth...), http.StatusRequestEntityTooLarge, "", "request_too_large", "")
		e.good(t)
	})
	t.Run("GET on a POST route", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/chat/completions", nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("Allow") != http.MethodPost {
			t.Errorf("Allow %q", resp.Header.Get("Allow"))
		}
		checkError(t, resp, http.StatusMethodNotAllowed, "", "method_not_allowed", "")
		e.good(t)
	})
	t.Run("POST on a GET route", func(t *testing.T) {
		checkError(t, e.post(t, "/v1/models", "{}", auth...), http.StatusMethodNotAllowed, "", "method_not_allowed", "")
		e.good(t)
	})
	t.Run("models need the key", func(t *testing.T) {
		resp, err := e.srv.Client().Get(e.srv.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, resp, http.StatusUnauthorized, "", "invalid_api_key", "")
	})
	t.Run("official client sees the errors", func(t *testing.T) {
		c := newClient(e)
		_, err := c.Chat.Completions.New(context.Background(), oa.ChatCompletionNewParams{Model: "tiny", Messages: []oa.ChatCompletionMessageParamUnion{oa.UserMessage("hi")}, N: oa.Int(20)})
		var ae *oa.Error
		if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Param != "n" || ae.Type != "invalid_request_error" {
			t.Fatalf("n=20 through the client: %v", err)
		}
		wrong := newClient(e, option.WithAPIKey("sk-wrong"))
		_, err = wrong.Models.List(context.Background())
		if !errors.As(err, &ae) || ae.StatusCode != 401 || ae.Code != "invalid_api_key" {
			t.Fatalf("wrong key through the client: %v", err)
		}
	})
}

// TestDisconnectFreesBlocks drops clients mid-generation (a stream whose
// reader goes away, a non-streamed request whose context ends) and checks
// their sequences are cancelled and their KV blocks freed.
func TestDisconnectFreesBlocks(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true, cacheTokens: 4096})
	for _, stream := range []bool{true, false} {
		before := e.sched.Stats().Cancelled
		ctx, cancel := context.WithCancel(context.Background())
		body := chatBody("Tell me everything", map[string]any{"stream": stream}) // no max_tokens: until the context is full
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(mustJSON(t, body)))
		done := make(chan error, 1)
		held := make(chan int, 1) // blocks in use while the stream is read
		go func() {
			resp, err := e.srv.Client().Do(req)
			if err == nil {
				if stream {
					// Read a few chunks, then go away. (The tiny model can
					// generate dozens of tokens between two polls, so the
					// blocks are looked at here, while the stream is open.)
					buf := make([]byte, 4096)
					for i := 0; i < 3 && err == nil; i++ {
						_, err = resp.Body.Read(buf)
					}
					held <- e.sched.Stats().KVBlocksUsed
					cancel()
				} else {
					_, err = io.ReadAll(resp.Body)
				}
				resp.Body.Close()
			}
			done <- err
		}()
		if stream {
			select {
			case n := <-held:
				if n == 0 {
					t.Fatal("an open stream's sequence holds no KV blocks")
				}
			case err := <-done:
				t.Fatalf("the stream ended before it was read: %v", err)
			}
		} else {
			nodetest.Eventually(t, 10*time.Second, "the sequence to hold KV blocks", func() bool { return e.sched.Stats().KVBlocksUsed > 0 })
			cancel()
		}
		<-done
		nodetest.Eventually(t, 10*time.Second, "the KV blocks to be freed", func() bool {
			st := e.sched.Stats()
			return st.KVBlocksUsed == 0 && st.Waiting == 0
		})
		if st := e.sched.Stats(); st.Cancelled != before+1 {
			t.Fatalf("stream=%v: the disconnect did not cancel the sequence: %+v", stream, st)
		}
	}
	e.good(t)
}

// TestQueueFull fills a scheduler that runs one sequence and queues one:
// the third request gets 429 with Retry-After.
func TestQueueFull(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true, cacheTokens: 4096, sched: serve.Options{MaxSeqs: 1, QueueSize: 1}, handler: openai.Options{RetryAfter: 2 * time.Second}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions",
			strings.NewReader(mustJSON(t, chatBody("Go on and on", map[string]any{"stream": true}))))
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp
	}
	running := open()
	defer running.Body.Close()
	if _, err := running.Body.Read(make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	nodetest.Eventually(t, 10*time.Second, "the first request to run", func() bool { return e.sched.Stats().Running == 1 })
	queued := open() // its headers arrive once it is queued
	defer queued.Body.Close()
	if st := e.sched.Stats(); st.Waiting != 1 {
		t.Fatalf("expected one waiting request: %+v", st)
	}
	resp := e.post(t, "/v1/chat/completions", chatBody("one more", map[string]any{"max_tokens": 2}))
	if ra := resp.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q", ra)
	}
	checkError(t, resp, http.StatusTooManyRequests, "", "rate_limit_exceeded", "")
	cancel()
	nodetest.Eventually(t, 10*time.Second, "the cancelled requests to free their blocks", func() bool {
		st := e.sched.Stats()
		return st.KVBlocksUsed == 0 && st.Waiting == 0
	})
	resp = e.post(t, "/v1/chat/completions", chatBody("now there is room", map[string]any{"max_tokens": 2}))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the queue drained: %d", resp.StatusCode)
	}
	resp.Body.Close()
}

func TestPrometheusObserver(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := openai.NewPrometheusObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{neverEOG: true, handler: openai.Options{Observer: obs}})
	resp := e.post(t, "/v1/chat/completions", chatBody("Hi", map[string]any{"max_tokens": 5}))
	cc := decodeBody[openai.ChatCompletion](t, resp)
	resp = e.post(t, "/v1/chat/completions", chatBody("Hi", map[string]any{"max_tokens": 5, "stream": true}))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp = e.post(t, "/v1/chat/completions", chatBody("Hi", map[string]any{"n": 0}))
	resp.Body.Close()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	counter := func(name string, labels ...string) float64 {
		mf := got[name]
		if mf == nil {
			t.Fatalf("no %s in %v", name, got)
		}
	next:
		for _, m := range mf.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.Label {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
		return 0
	}
	if v := counter("shoal_requests_total", "status", "200"); v != 2 {
		t.Errorf("200s: %v", v)
	}
	if v := counter("shoal_requests_total", "status", "400"); v != 1 {
		t.Errorf("400s: %v", v)
	}
	if v := counter("shoal_generated_tokens_total"); v != 10 {
		t.Errorf("generated: %v", v)
	}
	if v := counter("shoal_prompt_tokens_total"); v != float64(2*cc.Usage.PromptTokens) {
		t.Errorf("prompt: %v, want %d", v, 2*cc.Usage.PromptTokens)
	}
	if h := got["shoal_ttft_seconds"].Metric[0].GetHistogram(); h.GetSampleCount() != 2 || h.GetSampleSum() <= 0 {
		t.Errorf("ttft %v", h)
	}
	if h := got["shoal_inter_token_seconds"].Metric[0].GetHistogram(); h.GetSampleCount() != 8 {
		t.Errorf("inter-token samples %d, want 8", h.GetSampleCount())
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

type unavailable struct{}

func (unavailable) Error() string   { return "key store unreachable" }
func (unavailable) HTTPStatus() int { return http.StatusServiceUnavailable }

// TestKeyCheckUnavailable: a key checker that cannot decide answers with its
// own status rather than 401.
func TestKeyCheckUnavailable(t *testing.T) {
	h := openai.NewHandler(openai.NewStaticBackend(), openai.Options{CheckKey: func(context.Context, string, bool) ([]string, error) { return nil, unavailable{} }})
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, resp, http.StatusServiceUnavailable, "", "", "unreachable")
}

// A key limited to other models finds no model "tiny": not in /v1/models,
// 404 on it and on a completion with it, as for a model that does not
// exist; the same requests with an unlimited key succeed.
func TestModelLimitedKey(t *testing.T) {
	e := authEnv(t, envOptions{})
	get := func(key, path string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var list openai.ModelList
	resp := get(limitedKey, "/v1/models")
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 || len(list.Data) != 0 {
		t.Errorf("limited key lists %d models (%d %v), want none", len(list.Data), resp.StatusCode, err)
	}
	resp.Body.Close()
	checkError(t, get(limitedKey, "/v1/models/tiny"), http.StatusNotFound, "model", "model_not_found", "does not exist")
	checkError(t, e.post(t, "/v1/chat/completions", chatBody("hi", nil), "Authorization", "Bearer "+limitedKey),
		http.StatusNotFound, "model", "model_not_found", "does not exist")
	resp = get(testKey, "/v1/models/tiny")
	resp.Body.Close()
	ok := e.post(t, "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 1}), "Authorization", "Bearer "+testKey)
	ok.Body.Close()
	if resp.StatusCode != 200 || ok.StatusCode != 200 {
		t.Errorf("unlimited key: model %d, completion %d", resp.StatusCode, ok.StatusCode)
	}
}
