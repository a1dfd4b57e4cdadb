package openai

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestCLIClient checks the small SSE client the CLI uses against the
// handler.
func TestCLIClient(t *testing.T) {
	e := authEnv(t, envOptions{})
	c := &Client{BaseURL: strings.TrimPrefix(e.srv.URL, "http://"), APIKey: testKey, HTTP: e.srv.Client()}
	ctx := context.Background()
	models, err := c.Models(ctx)
	if err != nil || len(models) != 1 || models[0].ID != "tiny" {
		t.Fatalf("models %v %v", models, err)
	}
	zero := 0.0
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	var deltas []string
	reply, err := c.StreamChat(ctx, ChatParams{Model: "tiny", Messages: msgs, MaxTokens: 9, Temperature: &zero}, func(s string) { deltas = append(deltas, s) })
	if err != nil {
		t.Fatal(err)
	}
	if reply.FinishReason != "length" || reply.Usage == nil || reply.Usage.CompletionTokens != 9 || strings.Join(deltas, "") != reply.Content || len(deltas) < 2 {
		t.Fatalf("reply %+v usage %+v deltas %q", reply, reply.Usage, deltas)
	}
	resp := e.post(t, "/v1/chat/completions", map[string]any{"model": "tiny", "messages": msgs, "max_tokens": 9, "temperature": 0}, "Authorization", "Bearer "+testKey)
	if cc := decodeBody[ChatCompletion](t, resp); cc.Choices[0].Message.Content != reply.Content {
		t.Fatalf("streamed %q, non-streamed %q", reply.Content, cc.Choices[0].Message.Content)
	}
	_, err = c.StreamChat(ctx, ChatParams{Model: "nope", Messages: msgs}, nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code == nil || *ae.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
	c.APIKey = "wrong"
	if _, err := c.Models(ctx); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("wrong key: %v", err)
	}
}

func TestReadSSE(t *testing.T) {
	var got []string
	err := readSSE(strings.NewReader(": keep-alive\n\ndata: {\"a\":1}\n\ndata:{\"b\":\ndata: 2}\n\ndata: [DONE]\n\n"), func(d []byte) error {
		got = append(got, string(d))
		return nil
	})
	if err != nil || len(got) != 2 || got[0] != `{"a":1}` || got[1] != "{\"b\":\n2}" {
		t.Fatalf("%q %v", got, err)
	}
	if err := readSSE(strings.NewReader("data: {}\n\n"), func([]byte) error { return nil }); !errors.Is(err, errNoDone) {
		t.Fatalf("truncated stream: %v", err)
	}
}
