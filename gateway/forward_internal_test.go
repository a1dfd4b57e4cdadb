package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/transport"
)

// endpointPair is a front agent's endpoint and a driver's; a front with a
// short frontIdle (0: the default) notices a silent driver quickly.
func endpointPair(t *testing.T, frontIdle time.Duration) (front, driver *transport.Endpoint) {
	t.Helper()
	ca, err := transport.DeriveCA("forward-test-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	listen := func(id string, idle time.Duration) *transport.Endpoint {
		ident, err := transport.SelfIssue(ca, id, transport.RoleServer)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident, HandshakeTimeout: 500 * time.Millisecond, IdleTimeout: idle})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		return ep
	}
	return listen("front", frontIdle), listen("driver", 0)
}

// streamed is whether a test's request body asks for a stream (the
// endpoint's decoding says it in the agent).
func streamed(body []byte) bool { return strings.Contains(string(body), `"stream":true`) }

// TestForwardStreamsEvents: a request passed over the transport reaches
// the driver's routes marked as forwarded with its model, headers and raw
// body, but not the user's API key or cookies, which stay at the front
// agent; each event the driver flushes reaches the client before the
// next is written; an answer cut mid-stream ends with an error event; a
// driver that cannot be reached gives an OpenAI error; and a peer may
// forward nothing but completions and cluster runs.
func TestForwardStreamsEvents(t *testing.T) {
	frontEP, driverEP := endpointPair(t, 0)
	step := make(chan struct{})
	const reqBody = `{"model":"m","stream":true}`
	const userKey = "sk-user-key-0123456789" // stays at the front agent
	NewForwarder(ForwarderConfig{Endpoint: driverEP, Log: zap.NewNop()}).ServeForwarded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if fr, ok := forwardedOf(r); !ok || fr.model != "m" || fr.from != "front" || r.Header.Get("Authorization") != "Bearer "+ForwardGrant || strings.Contains(fmt.Sprint(r.Header), userKey) || string(b) != reqBody {
			http.Error(w, fmt.Sprintf("forwarded %+v %v %q %q", fr, ok, r.Header, b), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			_ = rc.Flush()
			<-step
			if i == 1 && r.URL.Path == "/v1/completions" {
				panic("the driver fails mid-answer")
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	f := NewForwarder(ForwarderConfig{Self: "front", Endpoint: frontEP, Log: zap.NewNop()})
	addr := driverEP.Addr().String()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.send(w, r, forwardTarget{model: "m", name: "driver", addr: r.Header.Get("X-To")}, b, streamed(b), openAIFail)
	}))
	defer front.Close()
	do := func(path, to string) *http.Response {
		req, _ := http.NewRequest("POST", front.URL+path, strings.NewReader(reqBody))
		req.Header.Set("Authorization", "Bearer "+userKey)
		req.Header.Set("Cookie", "session="+userKey)
		req.Header.Set("X-To", to)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := do("/v1/chat/completions", addr)
	rd := bufio.NewReader(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(rd)
		t.Fatalf("forwarded: %d %s", resp.StatusCode, b)
	}
	for i := 0; i < 3; i++ {
		line, err := rd.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		rd.ReadString('\n')
		step <- struct{}{} // the driver writes the next event only now
	}
	if rest, _ := io.ReadAll(rd); string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("after the last event: %q", rest)
	}
	resp.Body.Close()

	resp = do("/v1/completions", addr)
	rd = bufio.NewReader(resp.Body)
	for i := 0; i < 2; i++ {
		rd.ReadString('\n')
		rd.ReadString('\n')
		step <- struct{}{}
	}
	rest, _ := io.ReadAll(rd)
	resp.Body.Close()
	if !strings.HasPrefix(string(rest), `data: {"error":`) || !strings.Contains(string(rest), "stopped answering") {
		t.Fatalf("cut answer ends with %q, want an error event", rest)
	}

	gone, _ := endpointPair(t, 0)
	goneAddr := gone.Addr().String()
	gone.Close()
	resp = do("/v1/chat/completions", goneAddr)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if (resp.StatusCode != 502 && resp.StatusCode != 504) || !strings.Contains(string(b), `"type":"server_error"`) || !strings.Contains(string(b), "(driver) did not answer") {
		t.Fatalf("unreachable driver: %d %s", resp.StatusCode, b)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply, rb, err := transport.Forward(ctx, frontEP, addr, transport.ForwardHead{Method: "DELETE", Path: "/v1/tokens/abc"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rb.Close()
	if reply.Status != http.StatusNotFound {
		t.Fatalf("a forwarded admin call: %d, want 404", reply.Status)
	}
}

func TestModelOf(t *testing.T) {
	for _, c := range []struct {
		body, model string
		ok          bool
	}{
		{`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, "tiny", true},
		{`{"messages":[{"role":"user","content":"{\"model\":\"x\"}"}],"stream":true,"Model":"late"}`, "late", true},
		{`{"model":"tiny", "messages": [unparsed`, "tiny", true}, // the rest is the serving handler's to refuse
		{`{"prompt":"hi"}`, "", true},
		{`{"model":7}`, "", false},
		{`["model","tiny"]`, "", false},
		{`{"prompt":`, "", false},
	} {
		if m, ok := modelOf([]byte(c.body)); m != c.model || ok != c.ok {
			t.Errorf("modelOf(%s) = %q %v, want %q %v", c.body, m, ok, c.model, c.ok)
		}
	}
}
