package openai_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"shoal/api/openai"
)

// Chat templates in the public formats of well-known model families,
// written in the Hugging Face tokenizer_config.json conventions (string
// literals with \n escapes, loop variables, raise_exception, bos_token).

const llama3Template = `{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`

const mistralTemplate = `{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}`

const llama2Template = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

// llama31Template is a multi-line template in the Llama 3.1 style:
// whitespace control, a default date from strftime_now, rebinding messages.
const llama31Template = `{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
`

// zephyrTemplate relies on trim_blocks and lstrip_blocks, which
// apply_chat_template turns on.
const zephyrTemplate = `{% for message in messages %}
    {% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
    {% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
    {% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
    {% endif %}
    {% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
    {% endif %}
{% endfor %}`

func msgs(pairs ...string) []openai.TemplateMessage {
	var out []openai.TemplateMessage
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, openai.TemplateMessage{Role: pairs[i], Content: pairs[i+1]})
	}
	return out
}

func TestChatTemplates(t *testing.T) {
	date := time.Date(2025, time.March, 7, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name, tpl, bos, eos string
		msgs                []openai.TemplateMessage
		want                string
	}{
		{"chatml default system", qwenChatML, "", "<|im_end|>", msgs("user", "Hi"),
			"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{"chatml own system", qwenChatML, "", "<|im_end|>", msgs("system", "Be terse.", "user", "Hi", "assistant", "Hello.", "user", "Bye"),
			"<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
		{"fallback chatml", openai.ChatMLTemplate, "", "", msgs("system", "S", "user", "U"),
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"},
		{"llama3", llama3Template, "<|begin_of_text|>", "<|eot_id|>", msgs("system", "You are terse.", "user", "  Hello  "),
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"mistral", mistralTemplate, "<s>", "</s>", msgs("user", "Hi", "assistant", "Hello!", "user", "Bye"),
			"<s>[INST] Hi [/INST]Hello!</s>[INST] Bye [/INST]"},
		{"llama2 with system", llama2Template, "<s>", "</s>", msgs("system", "Be brief.", "user", "Hi", "assistant", "Hello.", "user", "Bye"),
			"<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]"},
		{"llama2 without system", llama2Template, "<s>", "</s>", msgs("user", " Hi "),
			"<s>[INST] Hi [/INST]"},
		{"llama3.1 multi-line", llama31Template, "<|begin_of_text|>", "<|eot_id|>", msgs("system", " Be kind. ", "user", "Hi"),
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: 07 Mar 2025\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"zephyr trim/lstrip blocks", zephyrTemplate, "<s>", "</s>", msgs("system", "S", "user", "U"),
			"<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n"},
		{"tojson like python", `{{ messages | tojson }}|{{ {'k': [1, 2.5, none, true], 'é': 'a"b\n'} | tojson }}|{{ messages[0] | tojson(indent=2) }}`, "", "",
			msgs("user", `say "hi"`),
			"[{\"role\": \"user\", \"content\": \"say \\\"hi\\\"\"}]|{\"k\": [1, 2.5, null, true], \"é\": \"a\\\"b\\n\"}|{\n  \"role\": \"user\",\n  \"content\": \"say \\\"hi\\\"\"\n}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tpl, err := openai.ParseChatTemplate(c.tpl)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tpl.Render(openai.TemplateInput{Messages: c.msgs, BOS: c.bos, EOS: c.eos, AddGenerationPrompt: true, Now: date})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("rendered\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func TestChatTemplateRaiseException(t *testing.T) {
	for _, c := range []struct {
		tpl  string
		msgs []openai.TemplateMessage
		want string
	}{
		{mistralTemplate, msgs("user", "a", "user", "b"), "Conversation roles must alternate user/assistant/user/assistant/..."},
		{mistralTemplate, msgs("assistant", "a"), "Conversation roles must alternate user/assistant/user/assistant/..."},
		{llama2Template, msgs("system", "s", "assistant", "a"), "Conversation roles must alternate user/assistant/user/assistant/..."},
	} {
		tpl, err := openai.ParseChatTemplate(c.tpl)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tpl.Render(openai.TemplateInput{Messages: c.msgs, BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true})
		var te *openai.TemplateError
		if !errors.As(err, &te) || te.Message != c.want {
			t.Fatalf("got %v, want TemplateError %q", err, c.want)
		}
	}
	// Over HTTP the exception is a 400 with its message, and the server
	// goes on serving.
	e := newEnv(t, envOptions{template: mistralTemplate, neverEOG: true})
	resp := e.post(t, "/v1/chat/completions", map[string]any{"model": "tiny", "messages": []map[string]any{
		{"role": "user", "content": "a"}, {"role": "user", "content": "b"}}})
	body := decodeBody[openai.ErrorBody](t, resp)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body.Error.Message, "roles must alternate") || body.Error.Type != "invalid_request_error" {
		t.Fatalf("status %d, body %+v", resp.StatusCode, body)
	}
	resp = e.post(t, "/v1/chat/completions", chatBody("hello", map[string]any{"max_tokens": 3}))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("good request after the template error: %d", resp.StatusCode)
	}
	resp.Body.Close()
}

// TestChatPromptTokens checks the tokenization of the rendered prompt:
// special-token texts become their ids, BOS is added when the vocabulary
// asks for it unless the template already starts with it.
func TestChatPromptTokens(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	ids, err := openai.ChatPrompt(e.model, msgs("user", "Hi"))
	if err != nil {
		t.Fatal(err)
	}
	rendered := "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	want := append([]int32{e.tok.BOS()}, e.tok.Encode(rendered, false, true)...)
	if !slices.Equal(ids, want) {
		t.Fatalf("ids %v\nwant %v", ids, want)
	}
	if ids[1] != imStart || !slices.Contains(ids, imEnd) {
		t.Fatalf("control tokens were not parsed: %v", ids)
	}
	// Over HTTP the usage reports the same count; content given as parts
	// and the "developer" role are accepted.
	resp := e.post(t, "/v1/chat/completions", map[string]any{"model": "tiny", "max_tokens": 1, "messages": []map[string]any{
		{"role": "developer", "content": "Be terse."},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}}}}})
	cc := decodeBody[openai.ChatCompletion](t, resp)
	want2 := append([]int32{e.tok.BOS()}, e.tok.Encode("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n", false, true)...)
	if resp.StatusCode != http.StatusOK || cc.Usage.PromptTokens != len(want2) {
		t.Fatalf("status %d usage %+v, want %d prompt tokens", resp.StatusCode, cc.Usage, len(want2))
	}

	// A template that writes bos_token itself gets no second BOS.
	e3 := newEnv(t, envOptions{template: llama3Template, neverEOG: true})
	ids, err = openai.ChatPrompt(e3.model, msgs("user", "Hi"))
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != e3.tok.BOS() || ids[1] == e3.tok.BOS() {
		t.Fatalf("BOS handling: %v", ids[:4])
	}
	if want := e3.tok.Encode("<|bos|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", false, true); !slices.Equal(ids, want) {
		t.Fatalf("ids %v\nwant %v", ids, want)
	}
}

// TestChatTemplateJinja checks Jinja features the chat templates of newer
// models use, each with a short template and what Python's Jinja2 renders
// for it (with trim_blocks and lstrip_blocks, as apply_chat_template).
func TestChatTemplateJinja(t *testing.T) {
	date := time.Date(2026, time.December, 6, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name, tpl string
		msgs      []openai.TemplateMessage
		want      string
		tools     []json.RawMessage
	}{
		{"conditional expressions anywhere", `{%- set x = messages[0].content %}{% set y = messages | length > 5 %}
{%- macro f(a, k='d') %}[{{ a }},{{ k }}]{% endmacro %}
{{- 'a' + (x if x else 'none') + '|' }}{{ f(1 if y else 2, k=('p' if y)) }}{{ [1 if y else 2, 3] | join(',') }}{{ '|' ~ (y if not y else 'q' if x else 'r') }}{% set z = (1 if y else 2) + 1 %}{{ z }}{{ 'x' if y else 'w' if x else 'v' }}{{ {'k': 'a' if y else 'b'}['k'] }}{% if ('t' if x else '') %}T{% endif %}{{ (x if y else none) is none }}`,
			msgs("user", "X"), "aX|[2,]2,3|False3wbTTrue", nil},
		{"dictionaries keep their order", `{%- set p = tools[0].function.parameters.properties -%}
{% for k in p %}{{ k }},{% endfor %}|{% for k, v in p.items() %}{{ k }}={{ v.type }}{{ v | tojson }};{% endfor %}|{{ p.keys() | list | join(',') }}|{% for v in p.values() %}{{ v.type }},{% endfor %}|{{ p | list | join(',') }}|{{ p | tojson }}|{% for k, v in p | dictsort %}{{ k }},{% endfor %}|{{ p | length }}`,
			msgs("user", "X"), `zeta,alpha,mid,|zeta=string{"type": "string", "x": {"b": 1, "a": 2}};alpha=integer{"type": "integer"};mid=boolean{"type": "boolean"};|zeta,alpha,mid|string,integer,boolean,|zeta,alpha,mid|{"zeta": {"type": "string", "x": {"b": 1, "a": 2}}, "alpha": {"type": "integer"}, "mid": {"type": "boolean"}}|alpha,mid,zeta,|3`,
			[]json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"string","x":{"b":1,"a":2}},"alpha":{"type":"integer"},"mid":{"type":"boolean"}}}}}`)}},
		// lstrip_blocks strips the whitespace before a block or comment tag
		// only from the start of its line.
		{"lstrip_blocks only at the start of a line", "{% for m in messages %}{{ m.role }} {% endfor %}|{% for m in messages %}{{ m.role }}\t{# c #}{% endfor %}|{% if true %}  {% endif %}|\n  {% if true %}x{% endif %}\n{% if true %}  y  {%- endif %}|{{ 1 }} {%+ if true %}z{% endif %}|{{ 1 }}  {%- if true %}w{% endif %}",
			msgs("user", "You are terse.\nBe kind.", "assistant", "Hi there"), "user assistant |user\tassistant\t|  |\nx  y|1 z|1w", nil},
		{"methods of parenthesized expressions", `{{ (messages[0].content | trim).strip("Y").split("\n")[0] }}|{{ ("a" + "b").upper() }}|{{ ("x" if true else "y").upper() }}|{{ (messages | last).content.upper() }}`,
			msgs("system", "You are terse.\nBe kind.", "user", "Hi there"), "ou are terse.|AB|X|HI THERE", nil},
		{"string methods: split and rsplit", `{{ "a b  c".split() }}|{{ "a,b,,c".split(",") }}|{{ "a,b,c".split(",", 1) }}|{{ "a,b,c".rsplit(",", 1) }}|{{ " a b ".rsplit() }}|{{ "a b c".split(none, 1) }}|{{ " a  b c ".rsplit(none, 1) }}|{{ "a\tb\nc".split() }}|{{ "".split() }}|{{ "".split(",") }}`,
			msgs("user", "X"), `['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b,c']|['a,b', 'c']|['a', 'b']|['a', 'b c']|[' a  b', 'c']|['a', 'b', 'c']|[]|['']`, nil},
		{"string methods: strip, lstrip and rstrip", `{{ "  xx  ".strip() }}|{{ "xxhixx".strip("x") }}|{{ "\n\nhi\n".lstrip("\n") }}|{{ "hi\n\n".rstrip() }}|{{ " hi ".lstrip() }}|{{ "abcba".strip("ab") }}|{{ " x ".strip(none) }}`,
			msgs("user", "X"), "xx|hi|hi\n|hi|hi |c|x", nil},
		{"string methods: startswith and endswith", `{{ "hello".startswith("he") }}|{{ "hello".endswith(("lo", "x")) }}|{{ "hello".startswith(("x", "h")) }}|{{ "hello".startswith("l", 2) }}|{{ "hello".endswith("l", 0, 4) }}|{{ "héllo".startswith("é", 1) }}`,
			msgs("user", "X"), `True|True|True|True|True|True`, nil},
		{"string methods: replace and join", `{{ "hello".replace("l", "L") }}|{{ "hello".replace("l", "L", 1) }}|{{ "hello".replace("", "-") }}|{{ ", ".join(["a", "b"]) }}|{{ "-".join("abc") }}`,
			msgs("user", "X"), `heLLo|heLlo|-h-e-l-l-o-|a, b|a-b-c`, nil},
		{"string methods: count and padding", `{{ "hello".count("l") }}|{{ "aaaa".count("aa") }}|{{ "hello".count("l", 3) }}|{{ "ab".center(6) }}|{{ "ab".center(5, "*") }}|{{ "ab".ljust(4) }}|{{ "ab".rjust(4, "0") }}|{{ "abc".ljust(2) }}`,
			msgs("user", "X"), `2|2|1|  ab  |**ab*|ab  |00ab|abc`, nil},
		{"tojson arguments", `{{ {"b": 1, "a": {"d": 1, "c": 2}} | tojson(sort_keys=true) }}|{{ {"a": [1, {"b": 2}]} | tojson(separators=(",", ":")) }}|{{ {"a": [1]} | tojson(indent=1, separators=(",", ": ")) }}|{{ "é😀\x7f" | tojson(ensure_ascii=true) }}|{{ "é" | tojson(ensure_ascii=false) }}`,
			msgs("user", "X"), "{\"a\": {\"c\": 2, \"d\": 1}, \"b\": 1}|{\"a\":[1,{\"b\":2}]}|{\n \"a\": [\n  1\n ]\n}|\"\\u00e9\\ud83d\\ude00\\u007f\"|\"é\"", nil},
		{"negative indices", `{% set p = "ab".split("x") %}[{{ p[-1] }}][{{ ["a"][-1] }}][{{ [1, 2][-2] }}][{{ messages[-1].content.split("</think>")[-1].strip() }}][{{ messages[-1].content.split("<think>")[-1].upper() }}][{{ "héé"[-1] }}][{{ (messages | map(attribute="role") | list)[-1] }}][{{ messages[-1]["role"] }}][{{ messages[-1].role }}][{{ "x" ~ p[-1] ~ "y" }}][{{ not p[-1] }}]`,
			msgs("user", "X </think> Y"), "[ab][a][1][Y][X </THINK> Y][é][user][user][user][xaby][False]", nil},
		// llama.cpp defines date_string as Llama 3.1's template wants it.
		{"date_string", `{% if not date_string is defined %}{% set date_string = "26 Jul 2024" %}{% endif %}{{ date_string }}`,
			msgs("user", "X"), "06 Dec 2026", nil},
		// A template that does not show a system message gets it at the
		// start of the next message, as llama.cpp gives it (Gemma 2's
		// refuses a system role); one in the middle stays.
		{"system message in a template without a system role", `{% for m in messages %}{% if m.role == 'system' %}(system){% else %}<{{ m.role }}:{{ m.content }}>{% endif %}{% endfor %}`,
			msgs("system", "Be terse.", "user", "Hi", "assistant", "Hello", "system", "Mid", "user", "Bye"), "<user:Be terse.\nHi><assistant:Hello>(system)<user:Bye>", nil},
		{"system message before an assistant one", `{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for m in messages %}<{{ m.role }}:{{ m.content }}>{% endfor %}`,
			msgs("system", "S", "assistant", "A", "user", "U"), "<assistant:S\nA><user:U>", nil},
		// A template that concatenates a call's arguments with text gets
		// them as the request's JSON text; one that reads them as an
		// object gets the object (what llama.cpp decides from a probe).
		{"tool call arguments as text", `{% for m in messages %}{% for tc in m.tool_calls or [] %}<{{ tc.function.name + ' ' + tc.function.arguments }}>{% endfor %}{% endfor %}`,
			toolCallMsgs(`{"city":"Paris", "days": 2}`), `<get_weather {"city":"Paris", "days": 2}>`, nil},
		{"tool call arguments as an object", `{% for m in messages %}{% for tc in m.tool_calls or [] %}<{{ tc.function.name }} {{ tc.function.arguments | tojson }}|{% for k, v in tc.function.arguments.items() %}{{ k }}={{ v }};{% endfor %}|{{ tc | tojson }}>{% endfor %}{% endfor %}`,
			toolCallMsgs(`{"city":"Paris", "days": 2}`), `<get_weather {"city": "Paris", "days": 2}|city=Paris;days=2;|{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, "id": "call_1"}>`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tpl, err := openai.ParseChatTemplate(c.tpl)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tpl.Render(openai.TemplateInput{Messages: c.msgs, BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true, Now: date, Tools: c.tools})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("rendered\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

// toolCallMsgs is a conversation with one call of get_weather with the
// arguments and its result.
func toolCallMsgs(args string) []openai.TemplateMessage {
	return []openai.TemplateMessage{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "call_1", Type: "function", Function: openai.FunctionCall{Name: "get_weather", Arguments: args}}}},
		{Role: "tool", Content: "sunny", ToolCallID: "call_1"},
	}
}
