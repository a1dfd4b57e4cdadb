package openai

import (
	"strings"
	"testing"
)

// TestReasoningSplit: each format's answers split into reasoning and
// content, the same whether the text comes whole or a byte at a time (a
// marker cut anywhere is held back, never shown half).
func TestReasoningSplit(t *testing.T) {
	for _, tc := range []struct {
		name             string
		f                reasoningFormat
		open             bool
		text             string
		reasoning, reply string
	}{
		{"think", reasonThink, false, "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.", "Let me see: 2+2.\n", "It is 4."},
		{"think after whitespace", reasonThink, false, "\n <think>a<b</think>c", "a<b", "c"},
		{"no think", reasonThink, false, "Just <thinking> aloud", "", "Just <thinking> aloud"},
		{"opened by the prompt", reasonThink, true, "\nhmm</think>\n\nyes", "hmm", "yes"},
		{"ended while thinking", reasonThink, false, "<think>still going", "still going", ""},
		{"a tag's start at the end", reasonThink, false, "<thi", "", "<thi"},
		{"harmony", reasonHarmony, false, "<|channel|>analysis<|message|>User asks 2+2.<|start|>assistant<|channel|>final<|message|>4.", "User asks 2+2.", "4."},
		{"harmony with end markers", reasonHarmony, false, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y<|return|>", "x", "y"},
		{"harmony final only", reasonHarmony, false, "<|channel|>final<|message|>Hi <|there", "", "Hi <|there"},
		{"not harmony", reasonHarmony, false, "plain text", "", "plain text"},
	} {
		r, c := splitAll(tc.f, tc.open, tc.text)
		if r != tc.reasoning || c != tc.reply {
			t.Errorf("%s: reasoning %q content %q, want %q %q", tc.name, r, c, tc.reasoning, tc.reply)
			continue
		}
		rs := newReasoner(tc.f, tc.open)
		var gr, gc strings.Builder
		for i := 0; i < len(tc.text); i++ {
			a, b := rs.feed(tc.text[i : i+1])
			if strings.Contains(a+b, "<|message|>") || strings.Contains(a+b, "</think>") {
				t.Errorf("%s: a marker streamed: %q %q", tc.name, a, b)
			}
			gr.WriteString(a)
			gc.WriteString(b)
		}
		a, b := rs.flush()
		gr.WriteString(a)
		gc.WriteString(b)
		if gr.String() != tc.reasoning || gc.String() != tc.reply {
			t.Errorf("%s byte by byte: reasoning %q content %q", tc.name, gr.String(), gc.String())
		}
	}
}

// TestReasoningChunks: a streamed chat answer of a reasoning model gives
// its thinking as delta.reasoning_content and the rest as delta.content;
// the whole answer gives message.reasoning_content; with gpt-oss's tools
// the reasoning comes at the end beside the calls.
func TestReasoningChunks(t *testing.T) {
	stream := func(c *chatShape, pieces ...string) (reasoning, content string) {
		var r, s strings.Builder
		add := func(ev any) {
			if ev == nil {
				return
			}
			d := ev.(ChatChunk).Choices[0].Delta
			if d.ReasoningContent != nil {
				r.WriteString(*d.ReasoningContent)
			}
			if d.Content != nil {
				s.WriteString(*d.Content)
			}
		}
		for _, p := range pieces {
			add(c.chunk(p, nil))
		}
		for _, ev := range c.last("stop") {
			add(ev)
		}
		return r.String(), s.String()
	}
	c := &chatShape{reasoning: reasonThink, reason: newReasoner(reasonThink, false)}
	if r, s := stream(c, "<thi", "nk>Two", " and two.</th", "ink>\n", "Four."); r != "Two and two." || s != "Four." {
		t.Errorf("think: %q %q", r, s)
	}
	c = &chatShape{reasoning: reasonHarmony, reason: newReasoner(reasonHarmony, false)}
	if r, s := stream(c, "<|channel|>analysis<|mess", "age|>Think.", "<|start|>assistant<|channel|>final<|message|>Done."); r != "Think." || s != "Done." {
		t.Errorf("harmony: %q %q", r, s)
	}
	// gpt-oss with tools: nothing streams, the end has it all.
	c = &chatShape{reasoning: reasonHarmony, tools: &toolPlan{format: toolsHarmony, choice: "auto", parallel: true, tools: nativeTools()}}
	if r, s := stream(c, "<|channel|>analysis<|message|>Need f.", "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}"); r != "Need f." || s != "" {
		t.Errorf("harmony with tools: %q %q", r, s)
	}
	// Not streamed.
	c = &chatShape{reasoning: reasonThink, reason: newReasoner(reasonThink, true)}
	c.add("Hmm.</think>", nil)
	c.add("Yes.", nil)
	msg := c.whole("stop", Usage{}).(ChatCompletion).Choices[0].Message
	if msg.ReasoningContent == nil || *msg.ReasoningContent != "Hmm." || *msg.Content != "Yes." {
		t.Errorf("whole: %+v", msg)
	}
}
