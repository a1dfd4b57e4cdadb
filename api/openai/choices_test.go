package openai_test

import (
	"context"
	"testing"

	oa "github.com/openai/openai-go/v3"
)

// TestClientChoices: n = 3 through the official client answers three
// choices (indexes 0, 1, 2), each sampled with its own seed (the request's
// plus its index, so choice 0 is what n = 1 answers), the later ones
// reading the prompt from the prefix cache; streamed, every choice's
// deltas arrive under its index with its own finish reason and add up to
// the same texts.
func TestClientChoices(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	const maxTok = 12
	params := func(n int64) oa.ChatCompletionNewParams {
		// A prompt of several KV blocks, so that the others can share them.
		p := chatParams("Tell me a long story about the sea, the wind, the boats and the fish that swim below them all day long.", maxTok, 1)
		p.Seed = oa.Int(42)
		if n > 1 {
			p.N = oa.Int(n)
		}
		return p
	}
	one, err := c.Chat.Completions.New(ctx, params(1))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Chat.Completions.New(ctx, params(3))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 3 {
		t.Fatalf("%d choices, want 3", len(res.Choices))
	}
	texts := map[string]bool{}
	for i, ch := range res.Choices {
		if ch.Index != int64(i) || ch.FinishReason != "length" || ch.Message.Content == "" {
			t.Fatalf("choice %d: index %d, finish %q, text %q", i, ch.Index, ch.FinishReason, ch.Message.Content)
		}
		texts[ch.Message.Content] = true
	}
	if len(texts) != 3 {
		t.Fatalf("the choices are not all different: %v", texts)
	}
	if res.Choices[0].Message.Content != one.Choices[0].Message.Content {
		t.Errorf("choice 0 %q, n = 1 with the same seed %q", res.Choices[0].Message.Content, one.Choices[0].Message.Content)
	}
	if res.Usage.CompletionTokens != 3*maxTok || res.Usage.PromptTokens != one.Usage.PromptTokens {
		t.Errorf("usage %+v, want %d completion tokens and the prompt once (%d)", res.Usage, 3*maxTok, one.Usage.PromptTokens)
	}
	t.Logf("prompt %d tokens, %d read from the prefix cache", res.Usage.PromptTokens, res.Usage.PromptTokensDetails.CachedTokens)

	st := c.Chat.Completions.NewStreaming(ctx, params(3))
	got := make([]string, 3)
	finished := make([]string, 3)
	chunks := make([]int, 3)
	for st.Next() {
		ch := st.Current()
		for _, cc := range ch.Choices {
			if cc.Index < 0 || cc.Index > 2 {
				t.Fatalf("chunk for choice %d", cc.Index)
			}
			got[cc.Index] += cc.Delta.Content
			chunks[cc.Index]++
			if cc.FinishReason != "" {
				finished[cc.Index] = cc.FinishReason
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if finished[i] != "length" || got[i] != res.Choices[i].Message.Content {
			t.Errorf("streamed choice %d: %d chunks, finish %q, text %q; not streamed %q", i, chunks[i], finished[i], got[i], res.Choices[i].Message.Content)
		}
	}
}
