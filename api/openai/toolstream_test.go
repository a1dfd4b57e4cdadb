package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestToolCallStreaming: an answer that may call tools (Hermes format,
// tool_choice auto) streams its text up to the call, holding back what may
// be the start of <tool_call> (and letting it go when it is not), then
// ends with the call's deltas: the id, type and name, then the arguments,
// and finish_reason tool_calls.
func TestToolCallStreaming(t *testing.T) {
	plan := &toolPlan{format: toolsHermes, choice: "auto", parallel: true,
		tools: []Tool{{Type: "function", Function: FunctionDef{Name: "get_time", Parameters: json.RawMessage(`{"type": "object"}`)}}}}
	pieces := []string{"Let me ", "check <", "b>the <tool", "_call", ">\n{\"name\": \"get_time\", ", "\"arguments\": {\"zone\": \"utc\"}}\n</tool_call>"}
	c := &chatShape{tools: plan}
	var streamed strings.Builder
	var deltas []ToolCallDelta
	for _, p := range pieces {
		if ev := c.chunk(p, nil); ev != nil {
			ch := ev.(ChatChunk).Choices[0]
			streamed.WriteString(*ch.Delta.Content)
		}
	}
	var finish string
	for _, ev := range c.last("stop") {
		ch := ev.(ChatChunk).Choices[0]
		deltas = append(deltas, ch.Delta.ToolCalls...)
		if ch.Delta.Content != nil {
			streamed.WriteString(*ch.Delta.Content)
		}
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	}
	if got := streamed.String(); got != "Let me check <b>the " {
		t.Errorf("streamed text %q", got)
	}
	if len(deltas) != 2 || deltas[0].Function.Name != "get_time" || !strings.HasPrefix(deltas[0].ID, "call_") || deltas[0].Type != "function" ||
		deltas[1].Function.Arguments != `{"zone":"utc"}` || finish != "tool_calls" {
		t.Fatalf("deltas %+v, finish %q", deltas, finish)
	}

	// A required call streams no text; a text answer streams all of it.
	c = &chatShape{tools: &toolPlan{format: toolsHermes, choice: "required", tools: plan.tools}}
	if ev := c.chunk("<tool_call>", nil); ev != nil {
		t.Errorf("a required call streamed %v", ev)
	}
	c = &chatShape{tools: plan}
	var all strings.Builder
	for _, p := range []string{"No tools <", "needed."} {
		if ev := c.chunk(p, nil); ev != nil {
			all.WriteString(*ev.(ChatChunk).Choices[0].Delta.Content)
		}
	}
	for _, ev := range c.last("stop") {
		if ch := ev.(ChatChunk).Choices[0]; ch.Delta.Content != nil {
			all.WriteString(*ch.Delta.Content)
		} else if *ch.FinishReason != "stop" {
			t.Errorf("finish %q", *ch.FinishReason)
		}
	}
	if all.String() != "No tools <needed." {
		t.Errorf("text answer streamed as %q", all.String())
	}
}

// TestParseToolCalls reads each format's calls, keeping unknown tools and
// broken JSON as text.
func TestParseToolCalls(t *testing.T) {
	tools := []Tool{{Type: "function", Function: FunctionDef{Name: "f"}}, {Type: "function", Function: FunctionDef{Name: "g"}}}
	for _, tc := range []struct {
		format        toolFormat
		text, content string
		calls         []string // name(args)
	}{
		{toolsHermes, "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", "ok", []string{`f({"a":1})`, `g({})`}},
		{toolsHermes, "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", nil},
		{toolsHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\":", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\":", nil},
		{toolsMistral, "[TOOL_CALLS][{\"name\": \"g\", \"arguments\": {\"x\": \"y\"}}]", "", []string{`g({"x":"y"})`}},
		{toolsLlama3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": [1, 2]}}", "", []string{`f({"q":[1,2]})`}},
		{toolsLlama3, "The answer is 4.", "The answer is 4.", nil},
		{toolsGeneric, `{"tool_calls": [{"name": "f", "arguments": "{\"a\": 2}"}]}`, "", []string{`f({"a":2})`}},
		{toolsGeneric, `{"response": "hello"}`, "hello", nil},
		{toolsGeneric, `{"response": "cut`, `{"response": "cut`, nil},
	} {
		p := &toolPlan{format: tc.format, tools: tools}
		content, calls := p.parse(tc.text)
		var got []string
		for _, c := range calls {
			got = append(got, c.Function.Name+"("+c.Function.Arguments+")")
		}
		if content != tc.content || strings.Join(got, " ") != strings.Join(tc.calls, " ") {
			t.Errorf("%s %q: content %q calls %v, want %q %v", tc.format, tc.text, content, got, tc.content, tc.calls)
		}
	}
	for src, want := range map[string]toolFormat{
		"{% if tools %}<tool_call>{% endif %}":          toolsHermes,
		"{% if tools %}[TOOL_CALLS]{% endif %}":         toolsMistral,
		"{% if tools %}<|python_tag|>{% endif %}":       toolsLlama3,
		"{{ messages }}":                                toolsGeneric,
		"{% if tools %}{{ tools | tojson }}{% endif %}": toolsGeneric,
	} {
		if got := detectToolFormat(src); got != want {
			t.Errorf("template %q: format %s, want %s", src, got, want)
		}
	}
}

// TestGenericResponseStreaming: a generic-format answer (a template that
// knows no tools, tool_choice auto) that is text streams the text of its
// JSON string as it arrives, escapes decoded and held back until complete
// (a surrogate pair too), nothing of the JSON around it; one that is a
// call streams nothing and ends with the call.
func TestGenericResponseStreaming(t *testing.T) {
	plan := &toolPlan{format: toolsGeneric, choice: "auto",
		tools: []Tool{{Type: "function", Function: FunctionDef{Name: "f", Parameters: json.RawMessage(`{"type": "object"}`)}}}}
	c := &chatShape{tools: plan}
	var streamed []string
	for _, p := range []string{`{"resp`, `onse": "Hel`, `lo \`, `"wor`, `ld\" \ud83d`, `\ude00 \u00e9\n`, `!"}`} {
		if ev := c.chunk(p, nil); ev != nil {
			streamed = append(streamed, *ev.(ChatChunk).Choices[0].Delta.Content)
		}
	}
	for _, ev := range c.last("stop") {
		if ch := ev.(ChatChunk).Choices[0]; ch.Delta.Content != nil {
			streamed = append(streamed, *ch.Delta.Content)
		}
	}
	if got := strings.Join(streamed, ""); got != "Hello \"world\" 😀 é\n!" || len(streamed) < 4 {
		t.Fatalf("streamed %q", streamed)
	}
	c = &chatShape{tools: plan}
	for _, p := range []string{`{"tool`, `_calls": [{"name": "f", "arguments": {}}]}`} {
		if ev := c.chunk(p, nil); ev != nil {
			t.Fatalf("a call streamed text: %v", ev)
		}
	}
	evs := c.last("stop")
	if ch := evs[0].(ChatChunk).Choices[0]; len(ch.Delta.ToolCalls) != 1 || ch.Delta.ToolCalls[0].Function.Name != "f" {
		t.Fatalf("call deltas %+v", evs)
	}
}
