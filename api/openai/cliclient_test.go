package openai_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"shoal/api/openai"
)

// TestCLIClient checks the small SSE client the CLI uses against the
// handler.
func TestCLIClient(t *testing.T) {
	e := authEnv(t, envOptions{})
	c := &openai.Client{BaseURL: strings.TrimPrefix(e.srv.URL, "http://"), APIKey: testKey, HTTP: e.srv.Client()}
	ctx := context.Background()
	models, err := c.Models(ctx)
	if err != nil || len(models) != 1 || models[0].ID != "tiny" {
		t.Fatalf("models %v %v", models, err)
	}
	zero := 0.0
	msgs := []openai.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	var deltas []string
	reply, err := c.StreamChat(ctx, openai.ChatParams{Model: "tiny", Messages: msgs, MaxTokens: 9, Temperature: &zero}, func(s string) { deltas = append(deltas, s) })
	if err != nil {
		t.Fatal(err)
	}
	if reply.FinishReason != "length" || reply.Usage == nil || reply.Usage.CompletionTokens != 9 || strings.Join(deltas, "") != reply.Content || len(deltas) < 2 {
		t.Fatalf("reply %+v usage %+v deltas %q", reply, reply.Usage, deltas)
	}
	resp := e.post(t, "/v1/chat/completions", map[string]any{"model": "tiny", "messages": msgs, "max_tokens": 9, "temperature": 0}, "Authorization", "Bearer "+testKey)
	if cc := decodeBody[openai.ChatCompletion](t, resp); *cc.Choices[0].Message.Content != reply.Content {
		t.Fatalf("streamed %q, non-streamed %q", reply.Content, *cc.Choices[0].Message.Content)
	}
	_, err = c.StreamChat(ctx, openai.ChatParams{Model: "nope", Messages: msgs}, nil)
	var ae *openai.APIError
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
	collect := func(d []byte) error {
		got = append(got, string(d))
		return nil
	}
	in := ": keep-alive\n\ndata: {\"a\":1}\n\ndata:{\"b\":\ndata: 2}\n\ndata: [DONE]\n\ndata: after\n\n"
	if err := openai.ReadSSE(strings.NewReader(in), collect); err != nil || len(got) != 2 || got[0] != `{"a":1}` || got[1] != "{\"b\":\n2}" {
		t.Fatalf("%q %v", got, err)
	}
	if err := openai.ReadSSE(strings.NewReader("data: {}\n\n"), collect); !errors.Is(err, openai.ErrNoDone) {
		t.Fatalf("truncated stream: %v", err)
	}
	if err := openai.ReadSSE(strings.NewReader("data: [DONE]"), collect); err != nil {
		t.Fatalf("[DONE] without a final blank line: %v", err)
	}
}

// TestCLIClientReasoning: the CLI's client hands a reasoning model's
// thinking to OnThought as it streams and keeps it out of the answer;
// streamed, it equals what the whole answer's reasoning_content says.
func TestCLIClientReasoning(t *testing.T) {
	e := authEnv(t, envOptions{template: thinkOpenTemplate})
	c := &openai.Client{BaseURL: strings.TrimPrefix(e.srv.URL, "http://"), APIKey: testKey, HTTP: e.srv.Client()}
	zero := 0.0
	msgs := []openai.Message{{Role: "user", Content: "Hi"}}
	var thoughts []string
	reply, err := c.StreamChat(context.Background(), openai.ChatParams{Model: "tiny", Messages: msgs, MaxTokens: 9, Temperature: &zero,
		OnThought: func(s string) { thoughts = append(thoughts, s) }}, func(s string) { t.Errorf("content %q streamed", s) })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(reply.Reasoning, "</think>") {
		t.Skip("the random model closed <think>")
	}
	if reply.Reasoning == "" || strings.Join(thoughts, "") != reply.Reasoning || reply.Content != "" {
		t.Fatalf("reply %+v, thoughts %q", reply, thoughts)
	}
	resp := e.post(t, "/v1/chat/completions", map[string]any{"model": "tiny", "messages": msgs, "max_tokens": 9, "temperature": 0}, "Authorization", "Bearer "+testKey)
	if cc := decodeBody[openai.ChatCompletion](t, resp); cc.Choices[0].Message.ReasoningContent == nil || *cc.Choices[0].Message.ReasoningContent != reply.Reasoning {
		t.Fatalf("streamed %q, not streamed %+v", reply.Reasoning, cc.Choices[0].Message)
	}
}
