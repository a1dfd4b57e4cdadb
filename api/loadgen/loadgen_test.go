package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {50, 5.5}, {90, 9.1}, {99, 9.91}, {100, 10}} {
		if got := Percentile(v, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Errorf("p99 of one value = %v", got)
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
}

func TestParseLevels(t *testing.T) {
	got, err := ParseLevels(" 1, 4,16,")
	if err != nil || fmt.Sprint(got) != "[1 4 16]" {
		t.Fatalf("ParseLevels = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "1,x", "-2", ","} {
		if _, err := ParseLevels(bad); err == nil {
			t.Errorf("ParseLevels(%q) accepted", bad)
		}
	}
}

func TestNewChecksOptions(t *testing.T) {
	for _, o := range []Options{
		{},
		{Endpoint: "x", API: "embeddings"},
		{Endpoint: "x", Concurrency: []int{1, 0}},
		{Endpoint: "x", MaxTokens: -1},
		{Endpoint: "x", Requests: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	b, err := New(Options{Endpoint: "127.0.0.1:1/v1/"})
	if err != nil {
		t.Fatal(err)
	}
	if b.o.MaxTokens != 64 || fmt.Sprint(b.o.Concurrency) != "[1 4 16]" || b.o.API != APIChat || b.o.Prompt != DefaultPrompt {
		t.Errorf("defaults: %+v", b.o)
	}
	if u := b.url("/v1/models"); u != "http://127.0.0.1:1/v1/models" {
		t.Errorf("url %q", u)
	}
}

func TestSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	ok := func(startMs, ttftMs, endMs int, tokens int, gaps ...int) sample {
		s := sample{start: t0.Add(time.Duration(startMs) * ms), end: t0.Add(time.Duration(endMs) * ms), ttft: time.Duration(ttftMs) * ms,
			tokens: tokens, chunks: len(gaps) + 1, usage: true, finish: "length"}
		for _, g := range gaps {
			s.gaps = append(s.gaps, time.Duration(g)*ms)
		}
		return s
	}
	samples := []sample{
		ok(0, 10, 40, 4, 10, 10, 10),
		ok(0, 20, 80, 4, 20, 20, 20),
		{start: t0, end: t0.Add(5 * ms), err: &HTTPError{Status: 429, Message: "busy"}},
		{start: t0, end: t0.Add(100 * ms), err: fmt.Errorf("x: %w", context.DeadlineExceeded)},
	}
	l := summarize(2, t0, samples)
	if l.Requests != 2 || l.Errors != 2 || l.ErrorKinds["HTTP 429"] != 1 || l.ErrorKinds["timeout"] != 1 || l.FirstError != "HTTP 429: busy" {
		t.Errorf("counts %+v", l)
	}
	if l.GeneratedTokens != 8 || l.WallSeconds != 0.1 || l.TokensPerSecond != 80 {
		t.Errorf("tokens %d wall %v tok/s %v, want 8, 0.1, 80", l.GeneratedTokens, l.WallSeconds, l.TokensPerSecond)
	}
	if l.TTFT.N != 2 || l.TTFT.P50 != 15 || l.TTFT.Max != 20 {
		t.Errorf("ttft %+v", l.TTFT)
	}
	if l.InterToken.N != 6 || l.InterToken.P50 != 15 || l.InterToken.P99 != 20 || l.InterToken.Mean != 15 {
		t.Errorf("inter-token %+v", l.InterToken)
	}
	if l.TPOT.N != 2 || l.TPOT.Mean != 15 || l.PerStreamTokensPerSecond != 66.67 {
		t.Errorf("tpot %+v per stream %v", l.TPOT, l.PerStreamTokensPerSecond)
	}
	if l.Finish["length"] != 2 {
		t.Errorf("finish %v", l.Finish)
	}
}

// fakeServer streams n text chunks (at most max_tokens) gap apart; every failEvery-th request
// (if > 0) is answered 429.
type fakeServer struct {
	chunks    int
	gap       time.Duration
	failEvery int64
	calls     atomic.Int64
	inFlight  atomic.Int64
	maxFlight atomic.Int64
	lastBody  atomic.Value
	mu        sync.Mutex
	bodies    []string
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer k" {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"message":"bad key","type":"invalid_request_error"}}`)
		return
	}
	if r.URL.Path == "/v1/models" {
		io.WriteString(w, `{"object":"list","data":[{"id":"fake-1","object":"model"},{"id":"fake-2","object":"model"}]}`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.lastBody.Store(string(body))
	f.mu.Lock()
	f.bodies = append(f.bodies, string(body))
	f.mu.Unlock()
	n := f.calls.Add(1)
	if f.failEvery > 0 && n%f.failEvery == 0 {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"The server is at capacity","type":"server_busy"}}`)
		return
	}
	cur := f.inFlight.Add(1)
	for {
		m := f.maxFlight.Load()
		if cur <= m || f.maxFlight.CompareAndSwap(m, cur) {
			break
		}
	}
	chunks := f.chunks
	var rb reqBody
	if json.Unmarshal(body, &rb) == nil && rb.MaxTokens > 0 {
		chunks = min(chunks, rb.MaxTokens)
	}
	chat := r.URL.Path == "/v1/chat/completions"
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(v string) { fmt.Fprintf(w, "data: %s\n\n", v); fl.Flush() }
	if chat {
		send(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`)
	}
	for i := 0; i < chunks; i++ {
		time.Sleep(f.gap)
		if chat {
			send(fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":"t%d"},"finish_reason":null}],"usage":null}`, i))
		} else {
			send(fmt.Sprintf(`{"choices":[{"index":0,"text":"t%d","finish_reason":null}]}`, i))
		}
	}
	if chat {
		send(`{"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}`)
	} else {
		send(`{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`)
	}
	send(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`, chunks, chunks+5))
	// Out of flight before the client can see the end and start another.
	f.inFlight.Add(-1)
	send("[DONE]")
}

func TestAgainstFakeServer(t *testing.T) {
	f := &fakeServer{chunks: 5, gap: 4 * time.Millisecond, failEvery: 4}
	srv := httptest.NewServer(f)
	defer srv.Close()
	var seen []int
	b, err := New(Options{Endpoint: srv.URL, APIKey: "k", API: APICompletions, MaxTokens: 5, Concurrency: []int{1, 3},
		Requests: 8, Warmup: -1, OnLevel: func(l Level) { seen = append(seen, l.Concurrency) }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != "fake-1" || fmt.Sprint(seen) != "[1 3]" || len(res.Levels) != 2 {
		t.Fatalf("model %q, levels seen %v, %d levels", res.Model, seen, len(res.Levels))
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(f.lastBody.Load().(string)), &body); err != nil {
		t.Fatal(err)
	}
	if body["model"] != "fake-1" || body["prompt"] != DefaultPrompt || body["stream"] != true || body["max_tokens"] != 5.0 || body["ignore_eos"] != nil {
		t.Errorf("request body %v", body)
	}
	if f.calls.Load() != 16 {
		t.Errorf("server saw %d requests, want 16", f.calls.Load())
	}
	if f.maxFlight.Load() != 3 {
		t.Errorf("at most %d streams in flight, want 3", f.maxFlight.Load())
	}
	for _, l := range res.Levels {
		if l.Requests+l.Errors != 8 || l.Errors != 2 || l.ErrorKinds["HTTP 429"] != 2 || !strings.Contains(l.FirstError, "at capacity") {
			t.Errorf("c=%d: %d ok, %d errors %v (%s); want 6 and 2×429", l.Concurrency, l.Requests, l.Errors, l.ErrorKinds, l.FirstError)
		}
		if l.GeneratedTokens != 5*l.Requests || l.PromptTokens != 5*l.Requests {
			t.Errorf("c=%d: %d generated, %d prompt tokens for %d requests", l.Concurrency, l.GeneratedTokens, l.PromptTokens, l.Requests)
		}
		if l.TTFT.N != l.Requests || l.InterToken.N != 4*l.Requests || l.TTFT.P50 < 4 || l.InterToken.P50 < 3 {
			t.Errorf("c=%d: ttft %+v inter-token %+v", l.Concurrency, l.TTFT, l.InterToken)
		}
		if l.TokensPerSecond <= 0 || l.Finish["length"] != l.Requests {
			t.Errorf("c=%d: tok/s %v finish %v", l.Concurrency, l.TokensPerSecond, l.Finish)
		}
	}
	var out strings.Builder
	if err := WriteTable(&out, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "tok/s") || !strings.Contains(out.String(), "c=3 errors: HTTP 429 ×2") {
		t.Errorf("table:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())

	// A wrong key fails the run with the server's message.
	b, _ = New(Options{Endpoint: srv.URL, APIKey: "wrong", Concurrency: []int{1}})
	if _, err := b.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "bad key") {
		t.Errorf("wrong key: %v", err)
	}
}

func TestDurationBound(t *testing.T) {
	f := &fakeServer{chunks: 3, gap: 5 * time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	b, err := New(Options{Endpoint: srv.URL, APIKey: "k", Model: "fake-2", Concurrency: []int{2}, Duration: 150 * time.Millisecond, Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l := res.Levels[0]
	// Each request takes ≥ 15 ms, so two streams fit at most 2×150/15 = 20
	// starts (plus the two in flight at the deadline).
	if l.Requests < 2 || l.Requests > 22 || l.Errors != 0 || l.WallSeconds < 0.15 {
		t.Errorf("duration-bound level: %d requests, %d errors, wall %v s", l.Requests, l.Errors, l.WallSeconds)
	}
	if int(f.calls.Load()) != l.Requests {
		t.Errorf("server saw %d requests, level counted %d", f.calls.Load(), l.Requests)
	}
}

func TestStreamErrorEvent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		io.WriteString(w, "data: {\"error\":{\"message\":\"the generation failed\",\"type\":\"server_error\"}}\n\n")
	}))
	defer srv.Close()
	b, _ := New(Options{Endpoint: srv.URL, Model: "m", Concurrency: []int{1}, Requests: 2, Warmup: -1})
	res, err := b.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "the generation failed") {
		t.Fatalf("a level whose requests all failed: %v", err)
	}
	if l := res.Levels[0]; l.Errors != 2 || l.ErrorKinds["stream error"] != 2 {
		t.Errorf("level %+v", l)
	}
}

// reqBody is what the tests read of a request body.
type reqBody struct {
	Prompt    json.RawMessage `json:"prompt"`
	MaxTokens int             `json:"max_tokens"`
}

func TestRandomTokenPrompts(t *testing.T) {
	f := &fakeServer{chunks: 2}
	srv := httptest.NewServer(f)
	defer srv.Close()
	b, err := New(Options{Endpoint: srv.URL, APIKey: "k", Model: "m", API: APICompletions, PromptTokens: 50, Vocab: 300,
		Concurrency: []int{2}, Requests: 4, Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.PromptTokens != 50 || res.Prompt != "" || res.Levels[0].Requests != 4 {
		t.Errorf("result %+v", res)
	}
	seen := map[string]bool{}
	for _, raw := range f.bodies {
		var rb reqBody
		var ids []int32
		if err := json.Unmarshal([]byte(raw), &rb); err != nil || json.Unmarshal(rb.Prompt, &ids) != nil {
			t.Fatalf("body %s: %v", raw, err)
		}
		if len(ids) != 50 {
			t.Errorf("%d prompt ids, want 50", len(ids))
		}
		for _, id := range ids {
			if id < 100 || id >= 300 {
				t.Errorf("token id %d outside [100, 300)", id)
			}
		}
		seen[string(rb.Prompt)] = true
	}
	if len(f.bodies) != 4 || len(seen) != 4 {
		t.Errorf("%d requests with %d distinct prompts, want 4 and 4", len(f.bodies), len(seen))
	}
	// Another run draws other prompts: a server's prefix cache must not
	// serve the next run's requests either.
	f.bodies = nil
	b, _ = New(Options{Endpoint: srv.URL, APIKey: "k", Model: "m", API: APICompletions, PromptTokens: 50, Vocab: 300,
		Concurrency: []int{1}, Requests: 1, Warmup: -1})
	if _, err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rb reqBody
	if len(f.bodies) != 1 || json.Unmarshal([]byte(f.bodies[0]), &rb) != nil || seen[string(rb.Prompt)] {
		t.Errorf("a second run sent a prompt of the first: %v", f.bodies)
	}
	for _, o := range []Options{
		{Endpoint: "x", PromptTokens: 8}, // chat takes text
		{Endpoint: "x", API: APICompletions, PromptTokens: -1},
		{Endpoint: "x", Steady: true},                            // no duration
		{Endpoint: "x", Periodic: &Periodic{Every: time.Second}}, // no duration
		{Endpoint: "x", Duration: time.Second, Periodic: &Periodic{}},
		{Endpoint: "x", Duration: time.Second, Periodic: &Periodic{Every: time.Second, PromptTokens: 8}}, // chat
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestSteadyWithPeriodic: two long streams run for the whole level while a
// request with a random prompt arrives every 100 ms; the level waits for
// the periodic requests, then cuts the streams and counts what they sent.
func TestSteadyWithPeriodic(t *testing.T) {
	f := &fakeServer{chunks: 60, gap: 10 * time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	var trace bytes.Buffer
	b, err := New(Options{Endpoint: srv.URL, APIKey: "k", Model: "m", API: APICompletions, MaxTokens: 60, Concurrency: []int{2},
		Duration: 300 * time.Millisecond, Steady: true, Periodic: &Periodic{Every: 100 * time.Millisecond, PromptTokens: 7, MaxTokens: 20},
		Warmup: -1, Trace: &trace})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := b.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	l := res.Levels[0]
	p := l.Periodic
	if p == nil || p.Requests != 2 || p.Errors != 0 || p.TTFT.N != 2 || p.GeneratedTokens != 40 {
		t.Fatalf("periodic group %+v", p)
	}
	// The periodic requests leave at 100 and 200 ms and stream for ≥ 200
	// ms: the cut comes after them (≥ 400 ms), before the streams' own end
	// (≥ 600 ms).
	if took < 400*time.Millisecond || l.WallSeconds < 0.4 {
		t.Errorf("level ended after %v (wall %v s), before its periodic requests", took, l.WallSeconds)
	}
	if l.Errors != 0 || l.Cut != 2 || l.Requests != 0 || l.TTFT.N != 2 || l.InterToken.N < 2*25 || l.GeneratedTokens < 2*26 {
		t.Errorf("steady streams: %d ok, %d errors (%s), %d cut, ttft %+v, %d gaps, %d tokens", l.Requests, l.Errors, l.FirstError,
			l.Cut, l.TTFT, l.InterToken.N, l.GeneratedTokens)
	}
	var short, long int
	for _, raw := range f.bodies {
		var rb reqBody
		if err := json.Unmarshal([]byte(raw), &rb); err != nil {
			t.Fatal(err)
		}
		var ids []int32
		switch {
		case json.Unmarshal(rb.Prompt, &ids) == nil && len(ids) == 7 && rb.MaxTokens == 20:
			long++
		case string(rb.Prompt) == fmt.Sprintf("%q", DefaultPrompt) && rb.MaxTokens == 60:
			short++
		default:
			t.Errorf("unexpected body %s", raw)
		}
	}
	// The trace has every request: the two cut streams, then the two
	// periodic ones, each with its gaps (tokens - 1 of them).
	var recs []TraceRecord
	dec := json.NewDecoder(&trace)
	for dec.More() {
		var r TraceRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 4 {
		t.Fatalf("trace: %d records, want 4: %+v", len(recs), recs)
	}
	for i, r := range recs {
		per := i >= 2
		if r.Periodic != per || r.Cut == per || r.Concurrency != 2 || r.TTFTMs <= 0 || len(r.GapsMs) != r.Tokens-1 ||
			(per && (r.Tokens != 20 || r.StartMs < 90)) {
			t.Errorf("trace record %d: %+v", i, r)
		}
	}
	if long != 2 || short != 2 {
		t.Errorf("%d periodic and %d stream requests, want 2 and 2", long, short)
	}
	var out strings.Builder
	if err := WriteTable(&out, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "every 100ms") || !strings.Contains(out.String(), "2 requests cut") {
		t.Errorf("table:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}

// TestBodyJSONSchema: a JSON schema goes out as response_format
// json_schema (strict) in chat requests.
func TestBodyJSONSchema(t *testing.T) {
	o := &Options{Model: "m", API: APIChat, JSONSchema: json.RawMessage(`{"type":"object"}`)}
	b, err := o.body("hi", 8)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		ResponseFormat struct {
			Type       string `json:"type"`
			JSONSchema struct {
				Strict bool            `json:"strict"`
				Schema json.RawMessage `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	if rf := body.ResponseFormat; rf.Type != "json_schema" || !rf.JSONSchema.Strict || string(rf.JSONSchema.Schema) != `{"type":"object"}` {
		t.Fatalf("body %s", b)
	}
}
