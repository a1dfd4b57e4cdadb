package openai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"strings"
	"testing"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"shoal/api/openai"
)

const weatherParams = `{"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 10},
  "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}`

const timeParams = `{"type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}}, "required": ["zone"], "additionalProperties": false}`

// hermesTemplate is a chat template that knows tools the way Hermes and
// Qwen 2.5 templates do: the tools listed in the system turn inside
// <tools></tools>, calls as <tool_call> blocks, results as
// <tool_response> blocks in a user turn.
const hermesTemplate = `{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each call return <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}{%- for message in messages %}{% if message.role == 'system' and tools %}{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

func weatherTools() []oa.ChatCompletionToolUnionParam {
	var wp, tp shared.FunctionParameters
	if err := json.Unmarshal([]byte(weatherParams), &wp); err != nil {
		panic(err)
	}
	if err := json.Unmarshal([]byte(timeParams), &tp); err != nil {
		panic(err)
	}
	return []oa.ChatCompletionToolUnionParam{
		oa.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Description: oa.String("The weather in a city"), Parameters: wp}),
		oa.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_time", Description: oa.String("The time"), Parameters: tp}),
	}
}

// toolParams asks for the weather in Paris with the weather tools.
func toolParams(choice oa.ChatCompletionToolChoiceOptionUnionParam, seed int64) oa.ChatCompletionNewParams {
	p := chatParams("What is the weather in Paris?", 200, 1)
	p.Tools = weatherTools()
	p.ToolChoice = choice
	p.Seed = oa.Int(seed)
	return p
}

// checkCall checks that a call names one of the tools with arguments valid
// against its parameters.
func checkCall(t *testing.T, name, args string) {
	t.Helper()
	schemas := map[string]string{"get_weather": weatherParams, "get_time": timeParams}
	s, ok := schemas[name]
	if !ok {
		t.Fatalf("a call of %q, not one of the tools", name)
	}
	if err := validDoc(referenceSchema(t, s), args); err != nil {
		t.Fatalf("%s arguments %s: %v", name, args, err)
	}
}

// TestClientTools runs tool calls through the official client on a model
// whose template knows no tools (the generic JSON format, the tools
// described in a system message) and on one with a Hermes-style template:
// required and named calls, auto (both a call and a text answer among
// seeds), a streamed call put together by the client's accumulator, and a
// tool-result round trip.
func TestClientTools(t *testing.T) {
	for _, tc := range []struct {
		name, template string
	}{{"generic", ""}, {"hermes", hermesTemplate}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{template: tc.template, cacheTokens: 4096})
			c := newClient(e)
			ctx := context.Background()
			params := toolParams
			required := oa.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oa.String("required")}
			res, err := c.Chat.Completions.New(ctx, params(required, 1))
			if err != nil {
				t.Fatal(err)
			}
			ch := res.Choices[0]
			if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) == 0 || ch.Message.Content != "" {
				t.Fatalf("required: finish %q, %d calls, content %q", ch.FinishReason, len(ch.Message.ToolCalls), ch.Message.Content)
			}
			for _, call := range ch.Message.ToolCalls {
				if !strings.HasPrefix(call.ID, "call_") || call.Type != "function" {
					t.Errorf("call id %q type %q", call.ID, call.Type)
				}
				checkCall(t, call.Function.Name, call.Function.Arguments)
			}
			t.Logf("required: %d call(s), first %s(%s)", len(ch.Message.ToolCalls), ch.Message.ToolCalls[0].Function.Name, ch.Message.ToolCalls[0].Function.Arguments)
			first := ch.Message

			named := oa.ToolChoiceOptionFunctionToolChoice(oa.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_time"})
			for seed := range int64(4) {
				res, err = c.Chat.Completions.New(ctx, params(named, seed))
				if err != nil {
					t.Fatal(err)
				}
				calls := res.Choices[0].Message.ToolCalls
				if len(calls) != 1 || calls[0].Function.Name != "get_time" {
					t.Fatalf("named get_time: %+v", res.Choices[0].Message)
				}
				checkCall(t, "get_time", calls[0].Function.Arguments)
			}

			// auto: the model decides; the same parsing serves both answers.
			auto := oa.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oa.String("auto")}
			var called, texted int
			const prompts = 32
			for seed := range int64(prompts) {
				// One call at most: a random model would chain calls
				// until max_tokens cuts them.
				// Prompts that differ: the context at the choice between a
				// call and a response is otherwise the same for every seed,
				// and so are the random model's odds there.
				p := params(auto, 100+seed)
				p.Messages = []oa.ChatCompletionMessageParamUnion{oa.UserMessage(fmt.Sprintf("Question %d: is it raining in city number %d?", seed, seed*7))}
				p.ParallelToolCalls = oa.Bool(false)
				p.Temperature = oa.Float(2) // flatter odds at the choice
				p.MaxTokens = oa.Int(120)
				res, err = c.Chat.Completions.New(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				m := res.Choices[0].Message
				if len(m.ToolCalls) > 0 {
					called++
					for _, call := range m.ToolCalls {
						checkCall(t, call.Function.Name, call.Function.Arguments)
					}
				} else {
					texted++
				}
			}
			t.Logf("auto over %d prompts: %d with calls, %d text", prompts, called, texted)
			if texted == 0 || (tc.name == "generic" && called == 0) {
				// The generic format's grammar lets the model pick a call or
				// a response at its first tokens; the Hermes one leaves the
				// model free until it writes <tool_call>, which a random
				// model does not.
				t.Errorf("auto: %d answers with calls, %d with text", called, texted)
			}

			// Streamed: the client's accumulator puts the call together.
			st := c.Chat.Completions.NewStreaming(ctx, params(required, 2))
			acc := oa.ChatCompletionAccumulator{}
			var toolChunks int
			for st.Next() {
				chunk := st.Current()
				acc.AddChunk(chunk)
				for _, cc := range chunk.Choices {
					toolChunks += len(cc.Delta.ToolCalls)
				}
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			sc := acc.Choices[0]
			if sc.FinishReason != "tool_calls" || len(sc.Message.ToolCalls) == 0 || toolChunks < 2 {
				t.Fatalf("streamed: finish %q, %d calls from %d tool-call deltas", sc.FinishReason, len(sc.Message.ToolCalls), toolChunks)
			}
			for _, call := range sc.Message.ToolCalls {
				checkCall(t, call.Function.Name, call.Function.Arguments)
			}

			// The round trip: the call, its result, and the next answer.
			p := params(auto, 5)
			p.Messages = append(p.Messages, first.ToParam(), oa.ToolMessage(`{"temperature": 21, "sky": "clear"}`, first.ToolCalls[0].ID))
			res, err = c.Chat.Completions.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := c.Chat.Completions.New(ctx, params(auto, 5))
			if res.Usage.PromptTokens <= before.Usage.PromptTokens {
				t.Errorf("the round trip's prompt has %d tokens, the first request's %d: the call and its result are not in it", res.Usage.PromptTokens, before.Usage.PromptTokens)
			}
			t.Logf("round trip: %d prompt tokens (first request %d), answer %q with %d calls", res.Usage.PromptTokens, before.Usage.PromptTokens,
				res.Choices[0].Message.Content, len(res.Choices[0].Message.ToolCalls))
		})
	}
}

// TestToolRequestErrors: malformed tools and tool choices are 400s naming
// the field.
func TestToolRequestErrors(t *testing.T) {
	e := newEnv(t, envOptions{})
	tool := map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}
	for _, bad := range []struct {
		name, param, msg string
		extra            map[string]any
	}{
		{"unknown choice", "tool_choice", "not one of", map[string]any{"tools": []any{tool}, "tool_choice": "always"}},
		{"named missing", "tool_choice", "not among the tools", map[string]any{"tools": []any{tool}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "g"}}}},
		{"choice without tools", "tool_choice", "needs tools", map[string]any{"tool_choice": "required"}},
		{"bad type", "tools[0].type", "only", map[string]any{"tools": []any{map[string]any{"type": "retrieval", "function": map[string]any{"name": "f"}}}}},
		{"duplicate", "tools[1].function.name", "two tools", map[string]any{"tools": []any{tool, tool}}},
		{"bad parameters", "tools[0].function.parameters", "JSON Schema object", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": "x"}}}}},
		{"unsupported schema", "tools", "not supported", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"not": map[string]any{}}}}}}}}},
		{"with response_format", "response_format", "tools", map[string]any{"tools": []any{tool}, "response_format": map[string]any{"type": "json_object"}}},
	} {
		t.Run(bad.name, func(t *testing.T) {
			checkError(t, e.post(t, "/v1/chat/completions", chatBody("x", bad.extra)), 400, bad.param, "", bad.msg)
		})
	}
	// A tool message needs the call it answers.
	body := chatBody("x", nil)
	body["messages"] = []any{map[string]any{"role": "user", "content": "x"}, map[string]any{"role": "tool", "content": "42"}}
	checkError(t, e.post(t, "/v1/chat/completions", body), 400, "messages[1].tool_call_id", "", "tool_call_id")
	// tool_choice none: the tools are ignored, the answer is text.
	resp := e.post(t, "/v1/chat/completions", chatBody("x", map[string]any{"tools": []any{tool}, "tool_choice": "none", "max_tokens": 4}))
	if resp.StatusCode != 200 {
		t.Fatalf("tool_choice none: %d", resp.StatusCode)
	}
	resp.Body.Close()
}

// TestLazyGrammar: a lazy grammar (tool_choice auto) leaves the answer
// free until the trigger appears, even split across tokens, then allows
// only what continues the grammar from the trigger on, and is done when
// the call is complete.
func TestLazyGrammar(t *testing.T) {
	e := newEnv(t, envOptions{})
	cons := e.model.Constrainer
	const gbnf = `root ::= "<tool_call>" [a-z]+ "</tool_call>"`
	lc := openai.NewLazyConstraint(e.model.Tokenizer, "<tool_call>", func(prefix []byte) (openai.Constraint, error) {
		return cons.Grammar(gbnf, prefix)
	})
	allowed := func() int {
		m := lc.Mask()
		if m == nil {
			return -1
		}
		n := 0
		for _, w := range m {
			n += bits.OnesCount64(w)
		}
		return n
	}
	feed := func(text string) {
		t.Helper()
		for _, id := range e.tok.Encode(text, false, false) {
			if err := lc.Accept(id); err != nil {
				t.Fatalf("accept %d (%q): %v", id, e.tok.Piece(id), err)
			}
		}
	}
	feed("Hello there, <tool")
	if n := allowed(); n != -1 {
		t.Fatalf("before the trigger the mask allows %d tokens, want no mask", n)
	}
	feed("_call>ab")
	n := allowed()
	if n <= 0 || n > 60 {
		t.Fatalf("after the trigger the mask allows %d tokens, want a few (letters, the closing tag's start)", n)
	}
	if id := e.tok.Encode("7", false, false)[0]; lc.Mask()[id/64]&(1<<(id%64)) != 0 {
		t.Fatal("a digit is allowed inside the call")
	}
	feed("c</tool_call>")
	if !lc.Done() {
		t.Fatal("the call is complete but the constraint is not done")
	}
}

// Templates of our own that mimic the native formats' markers (see
// tools_native_test.go for the formats): DeepSeek-V3.1's (tools not
// shown), GLM-4.5's, Kimi K2's and gpt-oss's.
const (
	deepSeekTemplate = `{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% elif m.role == 'user' %}<｜User｜>{{ m.content }}{% elif m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>{% for c in m.tool_calls %}<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments }}<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜><|im_end|>{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{% else %}<｜Assistant｜>{{ m.content }}<|im_end|>{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}`
	glmTemplate      = `[gMASK]<sop>{% if tools %}<|system|>{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for c in m.tool_calls %}
<tool_call>{{ c.function.name }}{% for k, v in c.function.arguments.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v }}</arg_value>{% endfor %}
</tool_call>{% endfor %}{% endfor %}<|assistant|>`
	kimiTemplate   = `{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}<|im_middle|>{{ m.content }}{% if m.tool_calls %}<|tool_calls_section_begin|>{% for c in m.tool_calls %}<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>{% endif %}<|im_end|>{% endfor %}<|im_start|>assistant<|im_middle|>`
	gptOSSTemplate = `{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|end|>{% endfor %}{% if tools %}<|start|>developer<|message|>namespace functions {{ '{' }}{% for t in tools %}type {{ t.function.name }};{% endfor %}}<|end|>{% endif %}<|start|>assistant`
)

// TestNativeToolCalls runs required and named calls through a small random
// model in DeepSeek-V3.1's, GLM-4.5's, Kimi K2's and gpt-oss's formats:
// each format's grammar compiles for the vocabulary (whose DeepSeek,
// Kimi and GLM markers are control tokens) and makes the model write a
// call that the answer reads back, in whole answers and streamed, with
// arguments valid against the tool's parameters (GLM's string values
// written as text). DeepSeek's template does not show the tools: the
// system message describes them.
func TestNativeToolCalls(t *testing.T) {
	for _, tc := range []struct {
		name, template, marker string
	}{{"deepseek-v3.1", deepSeekTemplate, "<｜tool▁calls▁begin｜>"}, {"glm-4.5", glmTemplate, "<tool_call>"},
		{"kimi-k2", kimiTemplate, "<|tool_calls_section_begin|>"}, {"gpt-oss", gptOSSTemplate, " to=functions."}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{template: tc.template, cacheTokens: 4096})
			c := newClient(e)
			ctx := context.Background()
			params := func(choice oa.ChatCompletionToolChoiceOptionUnionParam, seed int64) oa.ChatCompletionNewParams {
				p := toolParams(choice, seed)
				// One call: a random model would chain calls until
				// max_tokens cuts them.
				p.ParallelToolCalls = oa.Bool(false)
				return p
			}
			required := oa.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oa.String("required")}
			named := oa.ToolChoiceOptionFunctionToolChoice(oa.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"})
			for seed := range int64(3) {
				for _, choice := range []oa.ChatCompletionToolChoiceOptionUnionParam{required, named} {
					res, err := c.Chat.Completions.New(ctx, params(choice, seed))
					if err != nil {
						t.Fatal(err)
					}
					ch := res.Choices[0]
					if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) == 0 {
						t.Fatalf("seed %d: finish %q, content %q, %d calls", seed, ch.FinishReason, ch.Message.Content, len(ch.Message.ToolCalls))
					}
					for _, call := range ch.Message.ToolCalls {
						checkCall(t, call.Function.Name, call.Function.Arguments)
					}
					if choice.OfFunctionToolChoice != nil && ch.Message.ToolCalls[0].Function.Name != "get_weather" {
						t.Fatalf("named get_weather, called %s", ch.Message.ToolCalls[0].Function.Name)
					}
					if tc.name == "kimi-k2" && !strings.HasPrefix(ch.Message.ToolCalls[0].ID, "functions."+ch.Message.ToolCalls[0].Function.Name+":") {
						t.Errorf("Kimi's call id %q", ch.Message.ToolCalls[0].ID)
					}
					if seed == 0 {
						t.Logf("%s(%s), content %q", ch.Message.ToolCalls[0].Function.Name, ch.Message.ToolCalls[0].Function.Arguments, ch.Message.Content)
					}
				}
			}
			st := c.Chat.Completions.NewStreaming(ctx, params(required, 7))
			acc := oa.ChatCompletionAccumulator{}
			for st.Next() {
				acc.AddChunk(st.Current())
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			if sc := acc.Choices[0]; sc.FinishReason != "tool_calls" || len(sc.Message.ToolCalls) == 0 {
				t.Fatalf("streamed: finish %q, %d calls", sc.FinishReason, len(sc.Message.ToolCalls))
			}
			// tool_choice auto: the grammar waits for the format's
			// trigger; a random model's answers are text.
			res, err := c.Chat.Completions.New(ctx, params(oa.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oa.String("auto")}, 3))
			if err != nil {
				t.Fatal(err)
			}
			if m := res.Choices[0].Message; len(m.ToolCalls) == 0 && strings.Contains(m.Content, tc.marker) {
				t.Errorf("auto: the answer has the trigger but no call: %q", m.Content)
			}
		})
	}
}

// TestNativeToolGrammars: each native format's grammar (tool_choice
// required, parallel calls) takes two calls written as the model writes
// them and is then done, and refuses a call of a tool that is not offered.
func TestNativeToolGrammars(t *testing.T) {
	e := newEnv(t, envOptions{})
	tools := `[{"type": "function", "function": {"name": "get_time", "parameters": ` + timeParams + `}},
		{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "note": {"type": "string"}}, "required": ["a"]}}}]`
	for _, tc := range []struct{ format, calls, bad string }{
		{"deepseek-v3.1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"utc\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>sub<｜tool▁sep｜>"},
		{"deepseek-r1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"local\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>sub"},
		{"glm-4.5", "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>3</arg_value>\n<arg_key>note</arg_key>\n<arg_value>three \"3\"</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>utc</arg_value>\n</tool_call>",
			"<tool_call>add\n<arg_key>b</arg_key>"},
		{"kimi-k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{\"a\": 5, \"note\": \"x\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{\"zone\": \"utc\"}<|tool_call_end|><|tool_calls_section_end|>",
			"<|tool_calls_section_begin|><|tool_call_begin|>functions.sub:"},
		{"gpt-oss", "<|channel|>analysis<|message|>Use add.<|end|><|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 7}", "<|channel|>commentary to=functions.sub"},
	} {
		gbnf, err := openai.NativeToolGrammar(tc.format, []byte(tools), e.model.Constrainer)
		if err != nil {
			t.Fatalf("%s: %v", tc.format, err)
		}
		c, err := e.model.Constrainer.Grammar(gbnf, []byte(tc.calls))
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.format, err, gbnf)
		}
		// GLM's calls are separated by newlines: another may follow.
		if !c.Done() && tc.format != "glm-4.5" {
			t.Errorf("%s: the calls are complete but the grammar is not done", tc.format)
		}
		if _, err := e.model.Constrainer.Grammar(gbnf, []byte(tc.bad)); err == nil {
			t.Errorf("%s: the grammar takes %q", tc.format, tc.bad)
		}
	}
}
