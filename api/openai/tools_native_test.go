package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// Short templates of our own that write each native format's markers the
// way the real templates do (DeepSeek's never show the tools).
const (
	deepSeekV31Mimic = `{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}{% elif m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>{% for c in m.tool_calls %}<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments }}<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% else %}{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}`
	deepSeekR1Mimic  = `{% for m in messages %}{% if m.tool_calls %}<｜tool▁calls▁begin｜>{% for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}
` + "```json\n{{ c.function.arguments }}\n```" + `<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% else %}<｜User｜>{{ m.content }}{% endif %}{% endfor %}<｜Assistant｜>`
	glmMimic = `[gMASK]<sop>{% if tools %}<|system|>{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for c in m.tool_calls %}
<tool_call>{{ c.function.name }}{% for k, v in c.function.arguments.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v }}</arg_value>{% endfor %}
</tool_call>{% endfor %}{% endfor %}<|assistant|>`
	kimiMimic    = `{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{{ m.content }}{% if m.tool_calls %}<|tool_calls_section_begin|>{% for c in m.tool_calls %}<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>{% endif %}<|im_end|>{% endfor %}<|im_assistant|>assistant<|im_middle|>`
	harmonyMimic = `{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|end|>{% endfor %}{% if tools %}<|start|>developer<|message|>namespace functions {{ '{' }}{% for t in tools %}type {{ t.function.name }};{% endfor %}}<|end|>{% endif %}<|start|>assistant`
)

// TestDetectNativeToolFormats tells each format from its template's
// markers: GLM's <tool_call> is not Hermes', DeepSeek's templates are
// known though they never mention tools.
func TestDetectNativeToolFormats(t *testing.T) {
	for src, want := range map[string]toolFormat{
		deepSeekV31Mimic: toolsDeepSeekV31,
		deepSeekR1Mimic:  toolsDeepSeekR1,
		glmMimic:         toolsGLM,
		kimiMimic:        toolsKimi,
		// The first Kimi K2 template declares the tools but writes no calls.
		"{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}{% endif %}": toolsKimi,
		harmonyMimic: toolsHarmony,
		hermesMimic:  toolsHermes,
	} {
		if got := detectToolFormat(src); got != want {
			t.Errorf("format %s, want %s, for %.60q", got, want, src)
		}
	}
}

const hermesMimic = `{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}{{ m.content }}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endfor %}`

// nativeTools are f(a: integer), g(s: string, n: number) and h().
func nativeTools() []Tool {
	return []Tool{
		{Type: "function", Function: FunctionDef{Name: "f", Parameters: json.RawMessage(`{"type": "object", "properties": {"a": {"type": "integer"}}}`)}},
		{Type: "function", Function: FunctionDef{Name: "g", Parameters: json.RawMessage(`{"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}}}`)}},
		{Type: "function", Function: FunctionDef{Name: "h", Parameters: json.RawMessage(`{"type": "object", "properties": {}}`)}},
	}
}

// TestParseNativeToolCalls reads each native format's answers: several
// calls, text before them, a call of an unknown tool or with broken
// arguments left in the text, an answer without calls left as it is.
func TestParseNativeToolCalls(t *testing.T) {
	for _, tc := range []struct {
		format        toolFormat
		text, content string
		calls         []string // id? name(args)
	}{
		{toolsDeepSeekV31, "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"s\": \"x y\", \"n\": 2.5}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"Let me look.", []string{`f({"a":1})`, `g({"s":"x y","n":2.5})`}},
		{toolsDeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁call▁begin｜>h<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"<｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜>", []string{`h({})`}},
		{toolsDeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", nil},
		{toolsDeepSeekV31, "No tools needed.", "No tools needed.", nil},
		// R1's calls, as written by its template (and a distill's spelling
		// of the section's start), are read by either DeepSeek format.
		{toolsDeepSeekR1, "Sure.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{\"s\": \"q\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"Sure.", []string{`f({"a":3})`, `g({"s":"q"})`}},
		{toolsDeepSeekR1, "<｜tool_calls_begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 3}\n```<｜tool▁call▁end｜>", "", []string{`f({"a":3})`}},
		{toolsDeepSeekR1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", nil},
		// GLM: string values are text, others JSON.
		{toolsGLM, "<think></think>\nChecking.\n<tool_call>g\n<arg_key>s</arg_key>\n<arg_value>12 \"quoted\"</arg_value>\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n</tool_call>\n<tool_call>f<arg_key>a</arg_key>\n<arg_value>4</arg_value></tool_call>\n<tool_call>h\n</tool_call>",
			"<think></think>\nChecking.", []string{`g({"s":"12 \"quoted\"","n":7})`, `f({"a":4})`, `h({})`}},
		{toolsGLM, "<tool_call>nope\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
			"<tool_call>nope\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", nil},
		{toolsGLM, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1", nil},
		// Kimi: the call keeps the model's id.
		{toolsKimi, "Both.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 5}<|tool_call_end|><|tool_call_begin|>functions.g:1 <|tool_call_argument_begin|>{\"s\": \"b\"}<|tool_call_end|><|tool_calls_section_end|>",
			"Both.", []string{`functions.f:0 f({"a":5})`, `functions.g:1 g({"s":"b"})`}},
		{toolsKimi, "<|tool_calls_section_begin|><|tool_call_begin|>functions.nope:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
			"<|tool_calls_section_begin|><|tool_call_begin|>functions.nope:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>", nil},
		// gpt-oss: reasoning left out, the call's recipient in the
		// channel or in the header.
		{toolsHarmony, "<|channel|>analysis<|message|>Need f.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 6}",
			"", []string{`f({"a":6})`}},
		{toolsHarmony, " to=functions.g<|channel|>commentary json<|message|>{\"s\": \"c\"}", "", []string{`g({"s":"c"})`}},
		{toolsHarmony, "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.", "It is 4.", nil},
		{toolsHarmony, "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}", "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}", nil},
	} {
		p := &toolPlan{format: tc.format, tools: nativeTools()}
		content, calls := p.parse(tc.text)
		var got []string
		for _, c := range calls {
			s := c.Function.Name + "(" + c.Function.Arguments + ")"
			if !strings.HasPrefix(c.ID, "call_") {
				s = c.ID + " " + s
			}
			got = append(got, s)
		}
		if content != tc.content || strings.Join(got, " ") != strings.Join(tc.calls, " ") {
			t.Errorf("%s %q:\ncontent %q calls %v\nwant    %q %v", tc.format, tc.text, content, got, tc.content, tc.calls)
		}
	}
}

// TestNativeToolStreaming: an answer in DeepSeek's, Kimi's or GLM's format
// streams its text up to the section's marker, then ends with the calls;
// gpt-oss's streams its final message (no reasoning, no headers) at the
// end with its call.
func TestNativeToolStreaming(t *testing.T) {
	for _, tc := range []struct {
		format   toolFormat
		pieces   []string
		streamed string
		call     string
	}{
		{toolsDeepSeekV31, []string{"Let ", "me look.", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>", `{"a": 1}`, "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}, "Let me look.", `f({"a":1})`},
		{toolsKimi, []string{"Ok.<|tool_calls", "_section_begin|><|tool_call_begin|>functions.h:0<|tool_call_argument_begin|>{}<|tool_call_end|>"}, "Ok.", `h({})`},
		{toolsGLM, []string{"Hm <", "b> ", "<tool_", "call>f\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"}, "Hm <b> ", `f({"a":2})`},
		{toolsHarmony, []string{"<|channel|>analysis<|message|>think<|end|>", "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>", "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 9}"}, "Checking.", `f({"a":9})`},
		{toolsHarmony, []string{"<|channel|>analysis<|message|>think<|end|>", "<|start|>assistant<|channel|>final<|message|>Four."}, "Four.", ""},
	} {
		c := &chatShape{tools: &toolPlan{format: tc.format, choice: "auto", parallel: true, tools: nativeTools()}}
		var streamed strings.Builder
		var got []string
		for _, p := range tc.pieces {
			if ev := c.chunk(p, nil); ev != nil {
				streamed.WriteString(*ev.(ChatChunk).Choices[0].Delta.Content)
			}
		}
		var finish string
		for _, ev := range c.last("stop") {
			ch := ev.(ChatChunk).Choices[0]
			if ch.Delta.Content != nil {
				streamed.WriteString(*ch.Delta.Content)
			}
			for _, d := range ch.Delta.ToolCalls {
				if d.Function.Name != "" {
					got = append(got, d.Function.Name)
				} else {
					got[len(got)-1] += "(" + d.Function.Arguments + ")"
				}
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		wantFinish := "stop"
		if tc.call != "" {
			wantFinish = "tool_calls"
		}
		if streamed.String() != tc.streamed || strings.Join(got, " ") != tc.call || finish != wantFinish {
			t.Errorf("%s: streamed %q, calls %v, finish %s", tc.format, streamed.String(), got, finish)
		}
	}
}
