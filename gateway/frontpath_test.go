package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/api/openai"
	"shoal/gateway"
	"shoal/transport"
)

// routes is a fixed RouteSource.
type routes map[string]gateway.Route

func (rs routes) Route(model string) (gateway.Route, bool) {
	rt, ok := rs[model]
	return rt, ok
}

func (rs routes) Routes() []gateway.Route {
	var out []gateway.Route
	for _, rt := range rs {
		out = append(out, rt)
	}
	return out
}

// clientBody is a request body as the HTTP server hands it over; the
// endpoint must get this very reader, unread.
type clientBody struct {
	io.ReadCloser
	read atomic.Int64 // bytes read from it
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	return n, err
}

// frontAgent is an agent that drives nothing: its OpenAI endpoint behind
// the Forwarder's wrapper, the token path started. Every completion must
// reach the endpoint with the client's body unread (nothing scanned it
// first); bodies counts the completions the endpoint got.
type frontAgent struct {
	h      http.Handler
	local  *openai.StaticBackend
	bodies atomic.Int64
}

func newFrontAgent(t *testing.T, ca *transport.CA, rs routes, peers map[string]*transport.Endpoint) *frontAgent {
	t.Helper()
	fa := &frontAgent{local: openai.NewStaticBackend()}
	keyModels := func(_ context.Context, key string, _ bool) ([]string, error) {
		switch key {
		case "all":
			return nil, nil
		case "limited":
			return []string{"other"}, nil
		}
		return nil, errors.New("no such key")
	}
	f := gateway.NewForwarder(gateway.ForwarderConfig{Self: "front", Endpoint: endpoint(t, ca, "front"), Log: zap.NewNop(), Routes: rs,
		KeyModels: keyModels,
		Authorize: func(ctx context.Context, key string, _ api.Scope, model string) error {
			models, err := keyModels(ctx, key, false)
			if err == nil && len(models) > 0 && !slices.Contains(models, model) {
				err = errors.New("not for this model")
			}
			return err
		},
		PeerAddr: func(id string) string {
			if ep := peers[id]; ep != nil {
				return ep.Addr().String()
			}
			return ""
		},
		Local: func(model string) bool { _, ok := fa.local.Model(model); return ok },
		Unserved: func(model string) (string, bool) {
			switch model {
			case "big":
				return "unservable: needs 40 GiB, the cluster offers 24 GiB", true
			case "new":
				return "planning", true
			}
			return "", false
		},
	})
	f.StartTokenPath()
	oai := openai.NewHandler(f.Backend(fa.local), openai.Options{Log: zap.NewNop(), CheckKey: keyModels})
	fa.h = f.OpenAI(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "completions") {
			fa.bodies.Add(1)
			if b, ok := r.Body.(*clientBody); !ok || b.read.Load() != 0 {
				t.Errorf("%s reached the endpoint with its body read before (%T)", r.URL.Path, r.Body)
			}
		}
		oai.ServeHTTP(w, r)
	}))
	return fa
}

// post sends body to path with key, as an HTTP server hands it over.
func (fa *frontAgent) post(key, path, body string) (int, string, string) {
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Body = &clientBody{ReadCloser: req.Body}
	req.Header.Set("Authorization", "Bearer "+key)
	w := httptest.NewRecorder()
	fa.h.ServeHTTP(w, req)
	return w.Code, w.Header().Get("Retry-After"), w.Body.String()
}

// TestFrontReadsCompletionOnce: at an agent that does not drive the
// model, a completion goes to the OpenAI endpoint with the body as the
// client sent it (no scan for the model name before), whose Backend
// resolves the model: on the token path to a driver that takes it (the
// events written here), passed on as HTTP with the bytes the endpoint
// read to one that does not (an agent of an older version), a 503 with
// Retry-After for a model planned but not ready, and this agent's own
// model once its driver starts. A key limited to other models is refused
// before anything leaves.
func TestFrontReadsCompletionOnce(t *testing.T) {
	ca, err := transport.DeriveCA(secret)
	if err != nil {
		t.Fatal(err)
	}
	a, atA := driver(t, ca, "driver-a", writeModel(t))
	old := endpoint(t, ca, "old-driver")
	var oldMu sync.Mutex
	var oldGot []string // the bodies the older agent was passed
	gateway.NewForwarder(gateway.ForwarderConfig{Endpoint: old, Log: zap.NewNop()}).ServeForwarded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		model, forwarded := gateway.ForwardedModel(r.Context())
		oldMu.Lock()
		oldGot = append(oldGot, string(b))
		oldMu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"served_by": "old-driver", "model": model, "forwarded": forwarded, "key": r.Header.Get("Authorization")})
	}))
	rs := routes{
		"x":    {Model: "x", Node: "driver-a", NodeName: "driver-a", Ready: true, Status: "ready"},
		"y":    {Model: "y", Node: "old-driver", NodeName: "old-driver", Ready: true, Status: "ready"},
		"z":    {Model: "z", Node: "driver-a", NodeName: "gpu-2", Ready: false, Status: "loading"},
		"mine": {Model: "mine", Node: "front", NodeName: "front", Ready: true, Status: "ready"},
	}
	fa := newFrontAgent(t, ca, rs, map[string]*transport.Endpoint{"driver-a": a, "old-driver": old})

	t.Run("token path", func(t *testing.T) {
		// The model comes last, as the OpenAI Python client sends it.
		code, _, body := fa.post("all", "/v1/completions", `{"prompt":"hello","max_tokens":4,"temperature":0,"model":"x"}`)
		var ans struct {
			Object string
			Usage  struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if code != 200 || json.Unmarshal([]byte(body), &ans) != nil || ans.Object != "text_completion" || ans.Usage.CompletionTokens != 4 {
			t.Fatalf("completion on the token path: %d %s", code, body)
		}
		select {
		case <-atA:
		default:
			t.Fatal("the driver ran no generation: the completion did not take the token path")
		}
		code, _, body = fa.post("all", "/v1/completions", `{"prompt":"hello","max_tokens":3,"stream":true,"model":"x"}`)
		if code != 200 || strings.Count(body, "data: {") < 2 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("streamed on the token path: %d %s", code, body)
		}
	})

	t.Run("passed on", func(t *testing.T) {
		const sent = `{"messages": [{"role":"user","content":"hi"}],  "model": "y"}` // as sent, spaces and all
		code, _, body := fa.post("all", "/v1/chat/completions", sent)
		oldMu.Lock()
		got := append([]string(nil), oldGot...)
		oldMu.Unlock()
		if code != 200 || !strings.Contains(body, `"served_by":"old-driver"`) || !strings.Contains(body, `"model":"y"`) ||
			!strings.Contains(body, `"forwarded":true`) || !strings.Contains(body, gateway.ForwardGrant) {
			t.Fatalf("passed on to the older agent: %d %s", code, body)
		}
		if len(got) != 1 || got[0] != sent {
			t.Fatalf("the older agent got %q, want the body as sent", got)
		}
	})

	t.Run("limited key", func(t *testing.T) {
		for _, m := range []string{"x", "y"} {
			code, _, body := fa.post("limited", "/v1/chat/completions", `{"model":"`+m+`","messages":[{"role":"user","content":"hi"}]}`)
			if code != 404 || !strings.Contains(body, "model_not_found") {
				t.Errorf("a key limited to other models, model %s: %d %s", m, code, body)
			}
		}
		if code, _, body := fa.post("nokey", "/v1/completions", `{"model":"y","prompt":"hi"}`); code != 401 {
			t.Errorf("a wrong key: %d %s", code, body)
		}
		oldMu.Lock()
		defer oldMu.Unlock()
		if len(oldGot) != 1 {
			t.Errorf("the older agent got %d requests, want only the one passed on before", len(oldGot))
		}
	})

	t.Run("not ready", func(t *testing.T) {
		code, retry, body := fa.post("all", "/v1/completions", `{"model":"z","prompt":"hi"}`)
		if code != 503 || retry != "2" || !strings.Contains(body, `"code":"model_not_ready"`) || !strings.Contains(body, "loading") || !strings.Contains(body, "gpu-2") {
			t.Fatalf("a model planned but not ready: %d Retry-After %q %s", code, retry, body)
		}
	})

	t.Run("not servable", func(t *testing.T) {
		// A model the cluster knows without a plan is refused with its
		// status and reason, not called unknown; a model the cluster does
		// not know is.
		code, retry, body := fa.post("all", "/v1/chat/completions", `{"model":"big","messages":[{"role":"user","content":"hi"}]}`)
		if code != 503 || retry != "30" || !strings.Contains(body, `"code":"model_not_ready"`) || !strings.Contains(body, "model big is not served: unservable: needs 40 GiB") {
			t.Errorf("an unservable model: %d Retry-After %q %s", code, retry, body)
		}
		code, retry, body = fa.post("all", "/v1/completions", `{"model":"new","prompt":"hi"}`)
		if code != 503 || retry != "2" || !strings.Contains(body, "model new is not served: planning") {
			t.Errorf("a model being planned: %d Retry-After %q %s", code, retry, body)
		}
		if code, _, body := fa.post("all", "/v1/completions", `{"model":"nobody","prompt":"hi"}`); code != 404 || !strings.Contains(body, "model_not_found") {
			t.Errorf("a model nobody has: %d %s", code, body)
		}
	})

	t.Run("own driver starting", func(t *testing.T) {
		// This agent is to drive "mine": its driver comes up after the
		// request arrived (a model that runs as x on driver-a stands in).
		x, err := front(t, ca, &route{to: gateway.Target{Addr: a.Addr().String(), Node: "driver-a"}}).Model(context.Background(), "x")
		if err != nil {
			t.Fatal(err)
		}
		mine := *x
		mine.Name = "mine"
		go func() {
			time.Sleep(200 * time.Millisecond)
			fa.local.Set(&mine)
		}()
		code, _, body := fa.post("all", "/v1/completions", `{"model":"mine","prompt":"hi","max_tokens":2}`)
		if code != 200 || !strings.Contains(body, `"completion_tokens":2`) {
			t.Fatalf("a model whose driver here was starting: %d %s", code, body)
		}
	})

	if n := fa.bodies.Load(); n != 11 {
		t.Errorf("the endpoint got %d completions, want 11", n)
	}
}
