package openai_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/zap"

	"shoal/api/openai"
)

// stallingSubmitter runs a model whose stream pauses for stall before its
// first event (as during a replay or a long prefill); fail, when set,
// ends the stream with it instead of the first event.
type stallingSubmitter struct {
	openai.Submitter
	stall time.Duration
	fail  error
}

func (s stallingSubmitter) Submit(ctx context.Context, req openai.Request) (openai.Stream, error) {
	st, err := s.Submitter.Submit(ctx, req)
	if err != nil {
		return nil, err
	}
	return &stallingStream{Stream: st, stall: s.stall, fail: s.fail}, nil
}

type stallingStream struct {
	openai.Stream
	stall   time.Duration
	fail    error
	stalled bool
}

func (s *stallingStream) Next() (openai.Event, error) {
	if !s.stalled {
		s.stalled = true
		time.Sleep(s.stall)
		if s.fail != nil {
			return openai.Event{}, s.fail
		}
	}
	return s.Stream.Next()
}

// stallingServer serves e's model behind a stall, with keepalives every
// interval.
func stallingServer(t *testing.T, e *testEnv, sub stallingSubmitter, interval time.Duration) *httptest.Server {
	m := *e.model
	sub.Submitter = e.model.Submitter
	m.Submitter = sub
	srv := httptest.NewServer(openai.NewHandler(openai.NewStaticBackend(&m), openai.Options{StreamKeepAlive: interval, Log: zap.NewNop()}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// TestStreamKeepAlive: a stream whose engine stalls for about twice the
// keepalive interval gets keepalive comments while it waits, then its
// tokens and [DONE]; the official client parses such a stream.
func TestStreamKeepAlive(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	// Longer than a token of the tiny model takes on a loaded host (at
	// 150 ms, keepalives came between tokens there: CI run 2 of session 17).
	const interval = 500 * time.Millisecond
	srv := stallingServer(t, e, stallingSubmitter{stall: 2*interval + 100*time.Millisecond}, interval)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tiny","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	keepalives, tokens, firstToken := 0, 0, -1
	for i, l := range lines {
		switch {
		case l == ": keepalive":
			keepalives++
			if firstToken >= 0 {
				t.Errorf("keepalive after the tokens started: %q", lines)
			}
		case strings.HasPrefix(l, "data: {") && strings.Contains(l, `"content":"`) && !strings.Contains(l, `"role"`):
			tokens++
			if firstToken < 0 {
				firstToken = i
			}
		}
	}
	if keepalives < 2 || tokens == 0 || lines[len(lines)-1] != "data: [DONE]" {
		t.Fatalf("%d keepalives, %d token events, lines %q", keepalives, tokens, lines)
	}

	c := oa.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0), option.WithHTTPClient(srv.Client()))
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams("hi", 5, 0))
	var text strings.Builder
	finish := ""
	for s.Next() {
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil || finish != "length" || text.Len() == 0 {
		t.Fatalf("client: %q, finish %q, err %v", text.String(), finish, err)
	}
}

// TestStreamEndsWithErrorWhenEngineCancels: a generation the engine
// cancels (it stopped) while the client still reads ends the stream with
// an error event, not a silent end.
func TestStreamEndsWithErrorWhenEngineCancels(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	srv := stallingServer(t, e, stallingSubmitter{fail: errors.Join(errors.New("the driver stopped"), context.Canceled)}, time.Second)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"tiny","stream":true,"max_tokens":5,"prompt":"hi"}`))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var last string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() != "" {
			last = sc.Text()
		}
	}
	if !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "the driver stopped") {
		t.Fatalf("last line %q", last)
	}
}
