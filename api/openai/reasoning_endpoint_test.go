package openai_test

import (
	"strings"
	"testing"
)

// thinkOpenTemplate opens <think> in the prompt, as DeepSeek-R1's does,
// and drops the reasoning of earlier answers.
const thinkOpenTemplate = `{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}{% endfor %}<|assistant|><think>
`

// TestReasoningThroughEndpoint: through the endpoint, a model whose
// template opens <think> answers (a random model never closes it) all in
// reasoning_content, and with reasoning_format "none" the same text in
// content; an unknown reasoning_format is a 400.
func TestReasoningThroughEndpoint(t *testing.T) {
	e := newEnv(t, envOptions{template: thinkOpenTemplate})
	type msg struct {
		Content          *string `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	}
	type resp struct {
		Choices []struct {
			Message msg `json:"message"`
		} `json:"choices"`
	}
	extra := map[string]any{"max_tokens": 12, "seed": 5, "temperature": 0}
	split := decodeBody[resp](t, e.post(t, "/v1/chat/completions", chatBody("hi", extra)))
	extra["reasoning_format"] = "none"
	raw := decodeBody[resp](t, e.post(t, "/v1/chat/completions", chatBody("hi", extra)))
	if len(split.Choices) != 1 || len(raw.Choices) != 1 {
		t.Fatalf("answers: %+v %+v", split, raw)
	}
	s, r := split.Choices[0].Message, raw.Choices[0].Message
	if s.ReasoningContent == nil || r.Content == nil || r.ReasoningContent != nil {
		t.Fatalf("split %+v, raw %+v", s, r)
	}
	want := strings.TrimLeft(*r.Content, " \t\r\n")
	if strings.Contains(want, "</think>") {
		t.Skip("the random model closed <think>")
	}
	if *s.ReasoningContent != want || s.Content == nil || *s.Content != "" {
		t.Errorf("reasoning %q content %v; the raw answer %q", *s.ReasoningContent, s.Content, *r.Content)
	}
	extra["reasoning_format"] = "thoughts"
	if res := e.post(t, "/v1/chat/completions", chatBody("hi", extra)); res.StatusCode != 400 {
		t.Errorf("reasoning_format thoughts: %d, want 400", res.StatusCode)
	}
}
