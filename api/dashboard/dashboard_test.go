package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"shoal/api/openai"
)

func TestRecentKeepsTheLastNewestFirst(t *testing.T) {
	r := NewRecent(3)
	base := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	i := 0
	r.now = func() time.Time { i++; return base.Add(time.Duration(i) * time.Second) }
	if got := r.Records(); len(got) != 0 {
		t.Fatalf("empty ring returned %d records", len(got))
	}
	for n := 1; n <= 5; n++ {
		r.RequestDone(openai.Record{Endpoint: "completions", Model: "m", Status: 200, GeneratedTokens: n})
		r.RequestDone(openai.Record{Endpoint: "models", Status: 200}) // not kept
	}
	got := r.Records()
	if len(got) != 3 {
		t.Fatalf("kept %d records, want 3", len(got))
	}
	for k, want := range []int{5, 4, 3} {
		if got[k].GeneratedTokens != want || got[k].Seq != uint64(want) {
			t.Errorf("record %d: generated %d seq %d, want %d", k, got[k].GeneratedTokens, got[k].Seq, want)
		}
	}
	if !got[0].Time.After(got[1].Time) {
		t.Errorf("times not newest first: %v then %v", got[0].Time, got[1].Time)
	}
}

func TestRecentDerivedFigures(t *testing.T) {
	r := NewRecent(0)
	if len(r.buf) != DefaultRecent {
		t.Fatalf("default capacity %d, want %d", len(r.buf), DefaultRecent)
	}
	r.RequestDone(openai.Record{
		Endpoint: "chat.completions", Model: "tiny", Status: 200, Stream: true, FinishReason: "length",
		PromptTokens: 7, GeneratedTokens: 5, TTFT: 120 * time.Millisecond, Duration: 200 * time.Millisecond,
		InterToken: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond},
	})
	rec := r.Records()[0]
	if rec.TTFTMs != 120 || rec.DurationMs != 200 || rec.MeanInterTokenMs != 20 {
		t.Errorf("ttft %v duration %v mean gap %v, want 120, 200, 20", rec.TTFTMs, rec.DurationMs, rec.MeanInterTokenMs)
	}
	if rec.TokensPerSecond < 49.99 || rec.TokensPerSecond > 50.01 {
		t.Errorf("tokens/s %v, want 50 (4 gaps in 80 ms)", rec.TokensPerSecond)
	}
	if rec.Endpoint != "chat.completions" || !rec.Stream || rec.FinishReason != "length" || rec.PromptTokens != 7 {
		t.Errorf("record fields lost: %+v", rec)
	}
}

type countObserver struct{ n int }

func (c *countObserver) RequestDone(openai.Record) { c.n++ }

func TestMultiObserverFansOut(t *testing.T) {
	a, b := &countObserver{}, &countObserver{}
	var o openai.Observer = MultiObserver{a, nil, b}
	o.RequestDone(openai.Record{})
	o.RequestDone(openai.Record{})
	if a.n != 2 || b.n != 2 {
		t.Fatalf("observers saw %d and %d records, want 2 each", a.n, b.n)
	}
}

type unavailable struct{}

func (unavailable) Error() string   { return "key store unreachable" }
func (unavailable) HTTPStatus() int { return http.StatusServiceUnavailable }

func get(t *testing.T, h http.Handler, path, key string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHandlerServesPageAndAssets(t *testing.T) {
	h := Handler(Options{})
	for _, path := range []string{"/", "/dashboard/"} {
		r := get(t, h, path, "")
		b := body(t, r)
		if r.StatusCode != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s: %d %s", path, r.StatusCode, r.Header.Get("Content-Type"))
		}
		if !strings.Contains(b, `src="/dashboard/app.js"`) || !strings.Contains(b, `id="requests"`) {
			t.Errorf("GET %s: not the dashboard page", path)
		}
		if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
		if strings.Contains(b, "http://") || strings.Contains(b, "https://") {
			t.Errorf("GET %s: the page refers to another origin", path)
		}
	}
	// The chat page: the same headers, its own script.
	r := get(t, h, "/dashboard/chat", "")
	b := body(t, r)
	if r.StatusCode != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(b, `src="/dashboard/chat.js"`) || !strings.Contains(b, `src="/dashboard/login.js"`) || !strings.Contains(b, `id="prompt"`) {
		t.Errorf("GET /dashboard/chat: %d %s, not the chat page", r.StatusCode, r.Header.Get("Content-Type"))
	}
	if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("GET /dashboard/chat: CSP %q", csp)
	}
	if strings.Contains(b, "http://") || strings.Contains(b, "https://") {
		t.Errorf("GET /dashboard/chat: the page refers to another origin")
	}
	if r := get(t, h, "/dashboard/chat.html", ""); r.StatusCode != http.StatusMovedPermanently || r.Header.Get("Location") != "/dashboard/chat" {
		t.Errorf("GET /dashboard/chat.html: %d to %q, want a redirect to /dashboard/chat", r.StatusCode, r.Header.Get("Location"))
	}
	for path, ctype := range map[string]string{"/dashboard/app.js": "javascript", "/dashboard/style.css": "text/css",
		"/dashboard/chat.js": "javascript", "/dashboard/login.js": "javascript"} {
		r := get(t, h, path, "")
		b := body(t, r)
		if r.StatusCode != 200 || !strings.Contains(r.Header.Get("Content-Type"), ctype) || len(b) < 500 {
			t.Errorf("GET %s: %d %q, %d bytes", path, r.StatusCode, r.Header.Get("Content-Type"), len(b))
		}
		if strings.Contains(b, "https://") {
			t.Errorf("GET %s loads from another origin", path)
		}
	}
	if r := get(t, h, "/dashboard/nope.js", ""); r.StatusCode != 404 {
		t.Errorf("missing asset: %d, want 404", r.StatusCode)
	}
	if r := get(t, h, "/dashboard/api/nope", ""); r.StatusCode != 404 {
		t.Errorf("unknown api: %d, want 404", r.StatusCode)
	}
	req := httptest.NewRequest(http.MethodPost, "/dashboard/app.js", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST asset: %d, want 405", w.Code)
	}
}

func TestRequestsEndpointChecksTheKey(t *testing.T) {
	rec := NewRecent(10)
	rec.RequestDone(openai.Record{Endpoint: "completions", Model: "tiny", Status: 200, GeneratedTokens: 9})
	h := Handler(Options{Recent: rec, CheckKey: func(ctx context.Context, key string) error {
		switch key {
		case "good":
			return nil
		case "down":
			return unavailable{}
		}
		return errors.New("unknown key")
	}})
	for key, want := range map[string]int{"": 401, "bad": 401, "down": 503, "good": 200} {
		r := get(t, h, "/dashboard/api/requests", key)
		b := body(t, r)
		if r.StatusCode != want {
			t.Errorf("key %q: %d, want %d (%s)", key, r.StatusCode, want, b)
			continue
		}
		if want != 200 {
			var e struct{ Error string }
			if json.Unmarshal([]byte(b), &e) != nil || e.Error == "" {
				t.Errorf("key %q: error body %q", key, b)
			}
			continue
		}
		var out struct {
			Capacity int             `json:"capacity"`
			Requests []RequestRecord `json:"requests"`
		}
		if err := json.Unmarshal([]byte(b), &out); err != nil {
			t.Fatal(err)
		}
		if out.Capacity != 10 || len(out.Requests) != 1 || out.Requests[0].Model != "tiny" || out.Requests[0].GeneratedTokens != 9 {
			t.Errorf("requests answer %+v", out)
		}
	}
	// Without a ring the list is empty, not null.
	if b := body(t, get(t, Handler(Options{}), "/dashboard/api/requests", "")); !strings.Contains(b, `"requests":[]`) {
		t.Errorf("no ring: %s", b)
	}
}

// TestTrafficSum: each request counts once into its model's traffic, and
// Sum adds the agents' traffic by model.
func TestTrafficSum(t *testing.T) {
	a, b := NewRecent(2), NewRecent(2)
	for i := range 5 { // more than the ring holds: the totals keep every one
		a.RequestDone(openai.Record{Endpoint: "chat.completions", Model: "m", Status: 200, PromptTokens: 3, GeneratedTokens: 4,
			TTFT: 10 * time.Millisecond, InterToken: []time.Duration{2 * time.Millisecond, 4 * time.Millisecond, 6 * time.Millisecond}})
		if i == 0 {
			b.RequestDone(openai.Record{Endpoint: "chat.completions", Model: "m", Status: 503})
			b.RequestDone(openai.Record{Endpoint: "completions", Model: "n", Status: 200, GeneratedTokens: 1, TTFT: 30 * time.Millisecond})
		}
	}
	ct := Sum([]NodeTraffic{{Node: "b", Models: b.Traffic()}, {Node: "a", Models: a.Traffic()}})
	if len(ct.Models) != 2 || strings.Join(ct.Answered, ",") != "a,b" {
		t.Fatalf("sum: %+v", ct)
	}
	m, n := ct.Models[0], ct.Models[1]
	if m.Model != "m" || m.Requests != 6 || m.Errors != 1 || m.PromptTokens != 15 || m.GeneratedTokens != 20 ||
		m.TTFTCount != 5 || m.TTFTMsSum != 50 || m.InterTokenCount != 15 || math.Abs(m.InterTokenMsSum-60) > 1e-9 {
		t.Errorf("model m: %+v", m)
	}
	if n.Model != "n" || n.Requests != 1 || n.GeneratedTokens != 1 || n.TTFTMsSum != 30 {
		t.Errorf("model n: %+v", n)
	}
}
