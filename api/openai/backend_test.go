package openai_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"shoal/api/openai"
)

// farBackend serves no model itself: "far" is answered by another server
// from the request as it came, "driven-elsewhere" is served here with
// another driver's vocabulary, "loading" is not ready, the rest do not
// exist.
type farBackend struct {
	mu       sync.Mutex
	resolved []string // the names Resolve was asked for
	passed   []string // what PassOn's Serve got: the body, then the stream flag
}

func (b *farBackend) Models() []*openai.Model            { return nil }
func (b *farBackend) Model(string) (*openai.Model, bool) { return nil, false }

func (b *farBackend) Resolve(_ context.Context, name string) (*openai.Model, error) {
	b.mu.Lock()
	b.resolved = append(b.resolved, name)
	b.mu.Unlock()
	switch name {
	case "far":
		return nil, &openai.PassOn{Serve: func(w http.ResponseWriter, r *http.Request, body []byte, stream bool) {
			rest, _ := io.ReadAll(r.Body)
			b.mu.Lock()
			b.passed = append(b.passed, string(body)+string(rest), map[bool]string{true: "stream", false: "whole"}[stream])
			b.mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, "answered elsewhere")
		}}
	case "driven-elsewhere":
		return &openai.Model{Name: name}, nil // a generative model another agent drives
	case "loading":
		return nil, &openai.Refusal{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "model_not_ready", Message: "model loading is not ready", RetryAfter: 2}
	}
	return nil, openai.ErrNoModel
}

type recordObserver struct {
	mu   sync.Mutex
	recs []openai.Record
}

func (o *recordObserver) RequestDone(r openai.Record) {
	o.mu.Lock()
	o.recs = append(o.recs, r)
	o.mu.Unlock()
}

// TestBackendPassesOn: a completion whose model the Backend resolves to a
// PassOn is handed over with the body the endpoint read (nothing is left
// to read, nothing was re-encoded) and its stream flag, after the key was
// checked; the endpoint writes nothing and reports nothing of it. A
// Refusal is answered as it says, Retry-After included; ErrNoModel is a
// 404.
func TestBackendPassesOn(t *testing.T) {
	b := &farBackend{}
	obs := &recordObserver{}
	h := openai.NewHandler(b, openai.Options{Log: zap.NewNop(), Observer: obs, CheckKey: checkTestKey})
	do := func(key, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	chat := `{"messages": [{"role":"user","content":"hi"}], "stream": true,  "model": "far"}`
	if w := do(testKey, "/v1/chat/completions", chat); w.Code != http.StatusAccepted || w.Body.String() != "answered elsewhere" {
		t.Fatalf("passed on: %d %s", w.Code, w.Body)
	}
	cmpl := `{"model":"far","prompt":"hi"}`
	if w := do(testKey, "/v1/completions", cmpl); w.Code != http.StatusAccepted {
		t.Fatalf("passed on: %d %s", w.Code, w.Body)
	}
	if w := do(limitedKey, "/v1/completions", cmpl); w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "model_not_found") {
		t.Fatalf("a key limited to other models: %d %s", w.Code, w.Body)
	}
	w := do(testKey, "/v1/completions", `{"model":"loading","prompt":"hi"}`)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "2" ||
		!strings.Contains(w.Body.String(), `"code":"model_not_ready"`) || !strings.Contains(w.Body.String(), "model loading is not ready") {
		t.Fatalf("refused: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if w := do(testKey, "/v1/completions", `{"model":"nosuch","prompt":"hi"}`); w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "model_not_found") {
		t.Fatalf("no such model: %d %s", w.Code, w.Body)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if want := []string{chat, "stream", cmpl, "whole"}; strings.Join(b.passed, "|") != strings.Join(want, "|") {
		t.Errorf("PassOn got %q, want %q", b.passed, want)
	}
	if want := "far far loading nosuch"; strings.Join(b.resolved, " ") != want {
		t.Errorf("Resolve was asked for %q, want %q (never for a model the key may not use)", b.resolved, want)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	var statuses []int
	for _, r := range obs.recs {
		statuses = append(statuses, r.Status)
	}
	if len(statuses) != 3 || statuses[0] != 404 || statuses[1] != 503 || statuses[2] != 404 {
		t.Errorf("the observer saw %v, want the three requests answered here (404 503 404)", statuses)
	}
}

// TestEmbeddingsOfClusterModels: /v1/embeddings naming a generative model
// another agent drives says it produces no embeddings (it said the model
// did not exist, on every agent but the driver); one answered elsewhere is
// passed on; an unknown one is still a 404.
func TestEmbeddingsOfClusterModels(t *testing.T) {
	b := &farBackend{}
	h := openai.NewHandler(b, openai.Options{Log: zap.NewNop(), CheckKey: checkTestKey})
	for _, c := range []struct {
		model string
		code  int
		body  string
	}{
		{"driven-elsewhere", http.StatusBadRequest, "is a generative model and does not produce embeddings"},
		{"far", http.StatusAccepted, "answered elsewhere"},
		{"nosuch", http.StatusNotFound, "model_not_found"},
	} {
		req := httptest.NewRequest("POST", "/v1/embeddings", strings.NewReader(`{"model":"`+c.model+`","input":"hi"}`))
		req.Header.Set("Authorization", "Bearer "+testKey)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.body) {
			t.Errorf("%s: %d %s, want %d with %q", c.model, w.Code, w.Body, c.code, c.body)
		}
	}
}
