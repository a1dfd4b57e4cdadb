package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Tool calling: the request's tools are rendered through the model's chat
// template (or described in a system message when the template does not
// know tools), the answer is parsed for calls in the model's own format,
// and a grammar makes the calls well formed: from the first token when a
// call is required (tool_choice "required" or a named function), from
// the format's trigger on ("<tool_call>", "[TOOL_CALLS]") when the model
// may answer in text (tool_choice "auto").

// toolFormat is how a model writes tool calls.
type toolFormat int

const (
	// toolsGeneric is for templates that do not render tools: the tools
	// are described in a system message and the whole answer is a JSON
	// object, {"tool_calls": [{"name": ..., "arguments": {...}}]} or
	// {"response": "..."} (llama.cpp's generic format).
	toolsGeneric toolFormat = iota
	// toolsHermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
	// (Hermes, Qwen 2.5 and 3).
	toolsHermes
	// toolsMistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}]
	toolsMistral
	// toolsLlama3: {"name": ..., "parameters": {...}} (Llama 3.1-3.3).
	toolsLlama3
	// toolsDeepSeekR1: DeepSeek-R1 and V3(-0324), each call
	// <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
	// inside <｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>.
	toolsDeepSeekR1
	// toolsDeepSeekV31: DeepSeek-V3.1, each call
	// <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> inside
	// <｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>.
	toolsDeepSeekV31
	// toolsGLM: GLM-4.5 and 4.6, each call <tool_call>NAME\n then
	// <arg_key>K</arg_key>\n<arg_value>V</arg_value>\n per argument (V as
	// text for string parameters, JSON otherwise) and </tool_call>.
	toolsGLM
	// toolsKimi: Kimi K2, each call
	// <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>
	// inside <|tool_calls_section_begin|>...<|tool_calls_section_end|>;
	// the call's id is the model's functions.NAME:IDX.
	toolsKimi
	// toolsHarmony: gpt-oss, messages in the harmony format: a call is
	// [<|channel|>commentary] to=functions.NAME[<|channel|>commentary]
	// [ [<|constrain|>]json]<|message|>ARGS (ended by <|call|>), the answer
	// the final channel's message, the analysis channel the reasoning.
	toolsHarmony
)

func (f toolFormat) String() string {
	return [...]string{"generic", "hermes", "mistral", "llama3", "deepseek-r1", "deepseek-v3.1", "glm-4.5", "kimi-k2", "gpt-oss"}[f]
}

// DeepSeek's, Kimi K2's and GLM-4.5's markers (control tokens in their
// vocabularies).
const (
	dsCallsBegin = "<｜tool▁calls▁begin｜>"
	dsCallsEnd   = "<｜tool▁calls▁end｜>"
	dsCallBegin  = "<｜tool▁call▁begin｜>"
	dsCallEnd    = "<｜tool▁call▁end｜>"
	dsSep        = "<｜tool▁sep｜>"

	kimiSectionBegin = "<|tool_calls_section_begin|>"
	kimiSectionEnd   = "<|tool_calls_section_end|>"
	kimiCallBegin    = "<|tool_call_begin|>"
	kimiArgsBegin    = "<|tool_call_argument_begin|>"
	kimiCallEnd      = "<|tool_call_end|>"

	glmKey, glmKeyEnd     = "<arg_key>", "</arg_key>"
	glmValue, glmValueEnd = "<arg_value>", "</arg_value>"

	harmonyTo = " to=functions."
)

// dsCallsBegins are the spellings of DeepSeek's <｜tool▁calls▁begin｜>
// that its distilled models write (llama.cpp accepts the same).
var dsCallsBegins = []string{dsCallsBegin, "<｜tool_calls_begin｜>", "<｜tool calls begin｜>", "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>"}

// ToolCallMarkers are the texts of the tokens that mark tool calls in the
// formats above. Real vocabularies make most of them control tokens,
// whose text a decoder drops; a model's vocabulary as the endpoint sees it
// renders these as their text (in the answer, to the lazy grammar's
// trigger and to grammars), or the calls could not be read or
// constrained. (gpt-oss's header tokens are rendered by the tokenizer
// itself.)
func ToolCallMarkers() []string {
	return []string{"<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>",
		dsCallsBegin, dsCallsEnd, dsCallBegin, dsCallEnd, dsSep,
		kimiSectionBegin, kimiSectionEnd, kimiCallBegin, kimiArgsBegin, kimiCallEnd,
		glmKey, glmKeyEnd, glmValue, glmValueEnd}
}

// trigger is the text that starts a call in the format (none for generic,
// whose answer is always JSON).
func (f toolFormat) trigger() string {
	switch f {
	case toolsHermes, toolsGLM:
		return "<tool_call>"
	case toolsMistral:
		return "[TOOL_CALLS]"
	case toolsLlama3:
		return `{"name"`
	case toolsDeepSeekR1, toolsDeepSeekV31:
		return dsCallsBegin
	case toolsKimi:
		return kimiSectionBegin
	case toolsHarmony:
		return harmonyTo
	}
	return ""
}

// example is how the format writes a call, for the tools' description
// when the template does not show the tools (DeepSeek's templates leave
// them to the system message).
func (f toolFormat) example() string {
	switch f {
	case toolsDeepSeekR1:
		return dsCallsBegin + dsCallBegin + "function" + dsSep + "TOOL_NAME\n```json\nARGUMENTS\n```" + dsCallEnd + dsCallsEnd
	case toolsDeepSeekV31:
		return dsCallsBegin + dsCallBegin + "TOOL_NAME" + dsSep + "ARGUMENTS" + dsCallEnd + dsCallsEnd
	case toolsKimi:
		return kimiSectionBegin + kimiCallBegin + "functions.TOOL_NAME:0" + kimiArgsBegin + "ARGUMENTS" + kimiCallEnd + kimiSectionEnd
	case toolsGLM:
		return "<tool_call>TOOL_NAME\n<arg_key>ARGUMENT_NAME</arg_key>\n<arg_value>ARGUMENT_VALUE</arg_value>\n</tool_call>"
	case toolsHermes:
		return "<tool_call>\n{\"name\": TOOL_NAME, \"arguments\": ARGUMENTS}\n</tool_call>"
	case toolsMistral:
		return "[TOOL_CALLS][{\"name\": TOOL_NAME, \"arguments\": ARGUMENTS}]"
	case toolsLlama3:
		return "{\"name\": TOOL_NAME, \"parameters\": ARGUMENTS}"
	case toolsHarmony:
		return "<|channel|>commentary to=functions.TOOL_NAME <|constrain|>json<|message|>ARGUMENTS"
	}
	return ""
}

// detectToolFormat reads the format from the chat template's text, by the
// markers each format's templates write (DeepSeek's before the check for
// tools: their templates do not show them).
func detectToolFormat(src string) toolFormat {
	switch {
	case strings.Contains(src, dsCallsBegin) && strings.Contains(src, "```json"):
		return toolsDeepSeekR1
	case strings.Contains(src, dsCallsBegin):
		return toolsDeepSeekV31
	case !strings.Contains(src, "tools"):
		return toolsGeneric
	case strings.Contains(src, "<arg_key>") && strings.Contains(src, "<arg_value>"):
		return toolsGLM // before Hermes: GLM's calls open with <tool_call> too
	case strings.Contains(src, "tool_declare") || strings.Contains(src, kimiSectionBegin):
		return toolsKimi
	case strings.Contains(src, "<|channel|>"):
		return toolsHarmony
	case strings.Contains(src, "<tool_call>"):
		return toolsHermes
	case strings.Contains(src, "[TOOL_CALLS]"):
		return toolsMistral
	case strings.Contains(src, "<|python_tag|>") || strings.Contains(src, "ipython"):
		return toolsLlama3
	}
	return toolsGeneric
}

// toolPlan is a chat request's tools as the answer uses them.
type toolPlan struct {
	format   toolFormat
	tools    []Tool
	raw      []json.RawMessage // the tools as the template receives them
	choice   string            // "auto", "required" or "function"
	named    string            // the function tool_choice names
	parallel bool
	// describe: the template does not show the tools, so the system
	// message describes them (with the format's syntax).
	describe bool
}

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// maxTools bounds a request's tools.
const maxTools = 128

// readTools checks tools, tool_choice and parallel_tool_calls; nil when the
// answer uses no tools (none given, or tool_choice "none").
func readTools(req *ChatRequest) (*toolPlan, *apiError) {
	choice, named := "", ""
	if c := bytes.TrimSpace(req.ToolChoice); len(c) > 0 && !bytes.Equal(c, []byte("null")) {
		var s string
		var obj struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		switch {
		case json.Unmarshal(c, &s) == nil:
			if s != "none" && s != "auto" && s != "required" {
				return nil, badRequest("tool_choice", "tool_choice %q is not one of none, auto, required (or {\"type\": \"function\", \"function\": {\"name\": ...}})", s)
			}
			choice = s
		case json.Unmarshal(c, &obj) == nil && obj.Type == "function" && obj.Function.Name != "":
			choice, named = "function", obj.Function.Name
		default:
			return nil, badRequest("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
		}
	}
	if len(req.Tools) == 0 {
		if choice != "" && choice != "none" {
			return nil, badRequest("tool_choice", "tool_choice %q needs tools", choice)
		}
		return nil, nil
	}
	if len(req.Tools) > maxTools {
		return nil, badRequest("tools", "%d tools were given; at most %d are allowed", len(req.Tools), maxTools)
	}
	p := &toolPlan{choice: choice, named: named, parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls}
	if p.choice == "" {
		p.choice = "auto"
	}
	seen := map[string]bool{}
	for i, t := range req.Tools {
		param := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return nil, badRequest(param+".type", "%s.type %q is not supported (only \"function\")", param, t.Type)
		}
		if !toolName.MatchString(t.Function.Name) {
			return nil, badRequest(param+".function.name", "%s.function.name %q must be 1 to 64 letters, digits, _ or -", param, t.Function.Name)
		}
		if seen[t.Function.Name] {
			return nil, badRequest(param+".function.name", "two tools are named %q", t.Function.Name)
		}
		seen[t.Function.Name] = true
		params := bytes.TrimSpace(t.Function.Parameters)
		if len(params) == 0 || bytes.Equal(params, []byte("null")) {
			params = []byte("{}")
			t.Function.Parameters = json.RawMessage(`{"type": "object", "properties": {}}`)
		} else if params[0] != '{' || !json.Valid(params) {
			return nil, badRequest(param+".function.parameters", "%s.function.parameters must be a JSON Schema object", param)
		}
		p.tools = append(p.tools, t)
		p.raw = append(p.raw, templateTool(t.Function.Name, t.Function.Description, params))
	}
	if named != "" && !seen[named] {
		return nil, badRequest("tool_choice", "tool_choice names function %q, which is not among the tools", named)
	}
	if p.choice == "none" {
		return nil, nil
	}
	return p, nil
}

// templateTool is a tool as llama.cpp gives it to chat templates: type,
// then the function's name, description ("" when none) and parameters
// ({} when none), nothing else, whatever the request's order.
func templateTool(name, description string, params json.RawMessage) json.RawMessage {
	type function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	raw, _ := json.Marshal(struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}{"function", function{name, description, params}})
	return raw
}

// offered are the tools the answer may call: all of them, or the one
// tool_choice names.
func (p *toolPlan) offered() (idx []int) {
	for i, t := range p.tools {
		if p.named == "" || t.Function.Name == p.named {
			idx = append(idx, i)
		}
	}
	return idx
}

// tool is the tool named name (nil when none is).
func (p *toolPlan) tool(name string) *Tool {
	for i := range p.tools {
		if p.tools[i].Function.Name == name {
			return &p.tools[i]
		}
	}
	return nil
}

// prepare fits the messages to the format: the generic one describes the
// tools in the system message and shows earlier calls in its JSON shape; a
// native format whose template does not show the tools (describe:
// DeepSeek's) describes them in the system message with its own syntax.
func (p *toolPlan) prepare(msgs []TemplateMessage) []TemplateMessage {
	switch {
	case p.format == toolsGeneric:
	case p.describe:
		return withSystem(msgs, p.describeNative())
	default:
		return msgs
	}
	var desc strings.Builder
	desc.WriteString("You can call these tools (JSON Schema of each tool's arguments):\n")
	for _, i := range p.offered() {
		t := p.tools[i]
		b, _ := json.Marshal(map[string]any{"name": t.Function.Name, "description": t.Function.Description, "parameters": t.Function.Parameters})
		desc.Write(b)
		desc.WriteByte('\n')
	}
	desc.WriteString("\nTo call tools, answer with a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <its arguments>}]}")
	if p.choice == "auto" {
		desc.WriteString("; to answer without a tool, answer {\"response\": <your answer>}")
	}
	desc.WriteString(".")
	out := withSystem(msgs, desc.String())
	for i, m := range out {
		if len(m.ToolCalls) > 0 {
			calls := make([]string, len(m.ToolCalls))
			for i, c := range m.ToolCalls {
				args := c.Function.Arguments
				if !json.Valid([]byte(args)) {
					b, _ := json.Marshal(args)
					args = string(b)
				}
				name, _ := json.Marshal(c.Function.Name)
				calls[i] = `{"name": ` + string(name) + `, "arguments": ` + args + `}`
			}
			m.Content = `{"tool_calls": [` + strings.Join(calls, ", ") + `]}`
			m.ToolCalls = nil
			out[i] = m
		}
	}
	return out
}

// withSystem adds text to the first message when it is a system message,
// and otherwise starts the messages with a system message of text.
func withSystem(msgs []TemplateMessage, text string) []TemplateMessage {
	out := make([]TemplateMessage, 0, len(msgs)+1)
	if len(msgs) > 0 && msgs[0].Role == "system" {
		first := msgs[0]
		first.Content += "\n\n" + text
		return append(append(out, first), msgs[1:]...)
	}
	return append(append(out, TemplateMessage{Role: "system", Content: text}), msgs...)
}

// describeNative describes the tools to a model that calls them in its own
// format but whose template leaves the tools to the system message (the
// layout DeepSeek documents for its models' tool prompts).
func (p *toolPlan) describeNative() string {
	var b strings.Builder
	b.WriteString("## Tools\nYou can use these tools:\n")
	for _, i := range p.offered() {
		t := p.tools[i]
		var params bytes.Buffer
		if json.Compact(&params, t.Function.Parameters) != nil {
			params.Write(t.Function.Parameters)
		}
		fmt.Fprintf(&b, "\n### %s\nDescription: %s\n\nParameters: %s\n", t.Function.Name, t.Function.Description, params.String())
	}
	b.WriteString("\nTo use tools, write exactly this, and nothing between the calls when there are several:\n" + p.format.example() +
		"\nwhere TOOL_NAME is one of the tools above and ARGUMENTS is a JSON object valid against its Parameters.")
	return b.String()
}

// grammar is the GBNF of the calls the answer may make, and whether it
// applies only from the format's trigger on (lazy: the model may answer
// in text first).
func (p *toolPlan) grammar(cons Constrainer) (gbnf string, lazy bool, err error) {
	var rules strings.Builder
	var calls []string
	for _, i := range p.offered() {
		t := p.tools[i]
		prefix := fmt.Sprintf("tool%d-", i)
		var r, call string
		if p.format == toolsGLM {
			var args string
			if r, args, err = glmArgs(cons, t.Function.Parameters, prefix); err == nil {
				call = gbnfLiteral("<tool_call>"+t.Function.Name+"\n") + " " + args + ` "</tool_call>"`
			}
		} else {
			var root string
			if r, root, err = cons.SchemaRules(t.Function.Parameters, prefix); err == nil {
				call = p.format.callRule(t.Function.Name, root)
			}
		}
		if err != nil {
			return "", false, fmt.Errorf("tools[%d].function.parameters: %w", i, err)
		}
		rules.WriteString(r)
		rules.WriteByte('\n')
		calls = append(calls, call)
	}
	rules.WriteString("call ::= " + strings.Join(calls, " | ") + "\n")
	lazy = p.choice == "auto" && p.format != toolsGeneric
	many := p.parallel && p.named == ""
	// calls is the root of open, one call or more (separated by sep), close.
	seq := func(open, sep, close string) string {
		root := strings.TrimSpace(open + " call")
		if many {
			root += " (" + strings.TrimSpace(sep+" call") + ")*"
		}
		return strings.TrimSpace(root + " " + close)
	}
	var root string
	switch p.format {
	case toolsHermes:
		root = seq(`"<tool_call>\n"`, `"\n</tool_call>\n<tool_call>\n"`, `"\n</tool_call>"`)
	case toolsMistral:
		root = seq(`"[TOOL_CALLS]["`, `", "`, `"]"`)
	case toolsLlama3:
		root = "call"
	case toolsDeepSeekR1, toolsDeepSeekV31:
		root = seq(gbnfLiteral(dsCallsBegin), `"\n"?`, gbnfLiteral(dsCallsEnd))
	case toolsKimi:
		root = seq(gbnfLiteral(kimiSectionBegin), "", gbnfLiteral(kimiSectionEnd))
	case toolsGLM:
		root = seq("", `"\n"`, "")
	case toolsHarmony:
		// One call: <|call|> ends the answer.
		root = gbnfLiteral(harmonyTo) + " call"
		if !lazy {
			// From the start: reasoning first if the model likes, then
			// the call, its recipient in the header or in the channel.
			rules.WriteString(`harmony-analysis ::= "<|channel|>analysis<|message|>" harmony-text "<|end|><|start|>assistant"` + "\n")
			rules.WriteString(`harmony-text ::= ([^<] | "<" [^|] | "<|" [^e] | "<|e" [^n] | "<|en" [^d] | "<|end" [^|] | "<|end|" [^>])*` + "\n")
			root = `harmony-analysis? "<|channel|>commentary"? ` + root
		}
	default:
		root = seq(`"{\"tool_calls\": ["`, `", "`, `"]}"`)
		if p.choice == "auto" {
			sr, sroot, err := cons.SchemaRules([]byte(`{"type": "string"}`), "response-")
			if err != nil {
				return "", false, err
			}
			rules.WriteString(sr + "\n")
			root = "(" + root + `) | "{\"response\": " ` + sroot + ` "}"`
		}
	}
	return "root ::= " + root + "\n" + rules.String(), lazy, nil
}

// callRule is the GBNF of one call of the tool name whose arguments
// follow the rule args.
func (f toolFormat) callRule(name, args string) string {
	switch f {
	case toolsDeepSeekR1:
		return gbnfLiteral(dsCallBegin+"function"+dsSep+name+"\n```json\n") + " " + args + " " + gbnfLiteral("\n```"+dsCallEnd)
	case toolsDeepSeekV31:
		return gbnfLiteral(dsCallBegin+name+dsSep) + " " + args + " " + gbnfLiteral(dsCallEnd)
	case toolsKimi:
		return gbnfLiteral(kimiCallBegin+"functions."+name+":") + " [0-9]{1,3} " + gbnfLiteral(kimiArgsBegin) + " " + args + " " + gbnfLiteral(kimiCallEnd)
	case toolsHarmony:
		return gbnfLiteral(name) + ` ("<|channel|>commentary")? (" " "<|constrain|>"? "json")? "<|message|>" ` + args
	}
	argsKey := "arguments"
	if f == toolsLlama3 {
		argsKey = "parameters"
	}
	n, _ := json.Marshal(name)
	return gbnfLiteral(`{"name": `+string(n)+`, "`+argsKey+`": `) + " " + args + ` "}"`
}

// schemaProp is a property of an object schema.
type schemaProp struct {
	name   string
	schema json.RawMessage
}

// objectProps are the properties of an object schema in the schema's
// order, and the names it requires.
func objectProps(schema json.RawMessage) (props []schemaProp, required map[string]bool) {
	var s struct {
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if json.Unmarshal(schema, &s) != nil || len(s.Properties) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(s.Properties))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			break
		}
		var sub json.RawMessage
		if dec.Decode(&sub) != nil {
			break
		}
		props = append(props, schemaProp{t.(string), sub})
	}
	required = map[string]bool{}
	for _, r := range s.Required {
		required[r] = true
	}
	return props, required
}

// stringSchema reads a property schema that GLM writes as text rather
// than JSON (type string): the GBNF of that text ("" when it is not one).
// An enum or const becomes its values; minLength and maxLength bound the
// text (pattern and format are not enforced on text values).
func stringSchema(schema json.RawMessage) (gbnf string, ok bool) {
	var s struct {
		Type      any    `json:"type"`
		Enum      []any  `json:"enum"`
		Const     any    `json:"const"`
		MinLength *int64 `json:"minLength"`
		MaxLength *int64 `json:"maxLength"`
	}
	if json.Unmarshal(schema, &s) != nil || s.Type != "string" {
		return "", false
	}
	if c, ok := s.Const.(string); ok {
		return gbnfLiteral(c), true
	}
	if len(s.Enum) > 0 {
		var alts []string
		for _, v := range s.Enum {
			if v, ok := v.(string); ok {
				alts = append(alts, gbnfLiteral(v))
			}
		}
		if len(alts) > 0 {
			return "(" + strings.Join(alts, " | ") + ")", true
		}
	}
	lo, hi := int64(0), int64(-1)
	if s.MinLength != nil {
		lo = max(*s.MinLength, 0)
	}
	if s.MaxLength != nil {
		hi = *s.MaxLength
	}
	switch {
	case lo == 0 && hi < 0:
		return "[^<]*", true
	case hi < 0:
		return fmt.Sprintf("[^<]{%d,}", lo), true
	default:
		return fmt.Sprintf("[^<]{%d,%d}", lo, max(lo, hi)), true
	}
}

// glmArgs is the GBNF of a GLM call's arguments for a tool's parameters:
// the properties in the schema's order (a required one always, another at
// most once), a string's value as text, any other as JSON; a schema
// without properties takes any names with text values.
func glmArgs(cons Constrainer, params json.RawMessage, prefix string) (rules, root string, err error) {
	const valueEnd = glmValueEnd + "\n"
	props, required := objectProps(params)
	root = prefix + "args"
	if len(props) == 0 {
		return root + " ::= (" + gbnfLiteral(glmKey) + " [^<]+ " + gbnfLiteral(glmKeyEnd+"\n"+glmValue) + " [^<]* " + gbnfLiteral(valueEnd) + ")*\n", root, nil
	}
	var b strings.Builder
	var args []string
	for j, pr := range props {
		value, ok := stringSchema(pr.schema)
		if !ok {
			r, vroot, err := cons.SchemaRules(pr.schema, fmt.Sprintf("%sp%d-", prefix, j))
			if err != nil {
				return "", "", err
			}
			b.WriteString(r + "\n")
			value = vroot
		}
		arg := gbnfLiteral(glmKey+pr.name+glmKeyEnd+"\n"+glmValue) + " " + value + " " + gbnfLiteral(valueEnd)
		if !required[pr.name] {
			arg = "(" + arg + ")?"
		}
		args = append(args, arg)
	}
	b.WriteString(root + " ::= " + strings.Join(args, " ") + "\n")
	return b.String(), root, nil
}

// gbnfLiteral quotes s as a GBNF string literal.
func gbnfLiteral(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range []byte(s) {
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				fmt.Fprintf(&b, `\x%02X`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// parsedCalls collects the calls read from an answer.
type parsedCalls struct {
	p     *toolPlan
	calls []ToolCall
}

// add takes a call of name with args (JSON text); id "" gets a new one.
// A call of a tool that is not among the request's, or with arguments
// that are not JSON, is refused.
func (c *parsedCalls) add(name string, args []byte, id string) bool {
	if c.p.tool(name) == nil {
		return false
	}
	var compact bytes.Buffer
	if args = bytes.TrimSpace(args); len(args) == 0 {
		compact.WriteString("{}")
	} else if json.Compact(&compact, args) != nil {
		return false
	}
	if id == "" {
		id = newCallID()
	}
	c.calls = append(c.calls, ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: compact.String()}})
	return true
}

// addJSON takes a call written as a JSON object with name and arguments
// (or parameters, Llama 3's), the arguments an object or a string of one.
func (c *parsedCalls) addJSON(raw []byte) bool {
	var call struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal(raw, &call) != nil {
		return false
	}
	args := call.Arguments
	if len(args) == 0 {
		args = call.Parameters
	}
	var s string
	if json.Unmarshal(args, &s) == nil { // arguments given as a string of JSON
		args = json.RawMessage(s)
	}
	return c.add(call.Name, args, "")
}

// blocks reads the calls in text between each open and close (a call
// that fails stays in the text, and so does an open without its close),
// each body read by read; the text around them is returned trimmed.
func blocks(text, open, close string, read func(body string) bool) string {
	var kept strings.Builder
	rest := text
	for {
		i := strings.Index(rest, open)
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], close)
		if j < 0 {
			break
		}
		if read(rest[i+len(open) : i+j]) {
			kept.WriteString(rest[:i])
		} else {
			kept.WriteString(rest[:i+j+len(close)])
		}
		rest = rest[i+j+len(close):]
	}
	kept.WriteString(rest)
	return strings.TrimSpace(kept.String())
}

// section reads an answer whose calls are in a section: from the first of
// begins to end (or the answer's end), each call between open and close
// read by read. The text is what is around the section and the calls that
// failed; an answer with no call read stays text as it is.
func (c *parsedCalls) section(text string, begins []string, end, open, close string, read func(body string) bool) (string, []ToolCall) {
	i, begin := -1, ""
	for _, b := range begins {
		if j := strings.Index(text, b); j >= 0 && (i < 0 || j < i) {
			i, begin = j, b
		}
	}
	if i < 0 {
		return text, nil
	}
	body, after := text[i+len(begin):], ""
	if j := strings.Index(body, end); j >= 0 {
		body, after = body[:j], body[j+len(end):]
	}
	kept := blocks(body, open, close, read)
	if len(c.calls) == 0 {
		return text, nil
	}
	return joinParts(text[:i], kept, after), c.calls
}

// parse splits an answer into its text and its calls (of known tools
// only: anything else stays text).
func (p *toolPlan) parse(text string) (content string, calls []ToolCall) {
	c := &parsedCalls{p: p}
	switch p.format {
	case toolsHermes:
		content = blocks(text, "<tool_call>", "</tool_call>", func(body string) bool { return c.addJSON([]byte(strings.TrimSpace(body))) })
		return content, c.calls
	case toolsGLM:
		content = blocks(text, "<tool_call>", "</tool_call>", c.addGLM)
		return content, c.calls
	case toolsDeepSeekR1, toolsDeepSeekV31:
		return c.section(text, dsCallsBegins, dsCallsEnd, dsCallBegin, dsCallEnd, c.addDeepSeek)
	case toolsKimi:
		return c.section(text, []string{kimiSectionBegin}, kimiSectionEnd, kimiCallBegin, kimiCallEnd, c.addKimi)
	case toolsHarmony:
		return c.harmony(text)
	case toolsMistral:
		i := strings.Index(text, "[TOOL_CALLS]")
		if i < 0 {
			return text, nil
		}
		var list []json.RawMessage
		if json.Unmarshal([]byte(strings.TrimSpace(text[i+len("[TOOL_CALLS]"):])), &list) != nil {
			return text, nil
		}
		for _, raw := range list {
			c.addJSON(raw)
		}
		if len(c.calls) == 0 {
			return text, nil
		}
		return strings.TrimSpace(text[:i]), c.calls
	case toolsLlama3:
		t := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
		if strings.HasPrefix(t, "{") && c.addJSON([]byte(t)) {
			return "", c.calls
		}
		return text, nil
	}
	var g struct {
		ToolCalls []json.RawMessage `json:"tool_calls"`
		Response  *string           `json:"response"`
	}
	if json.Unmarshal([]byte(text), &g) != nil {
		return text, nil
	}
	for _, raw := range g.ToolCalls {
		c.addJSON(raw)
	}
	if g.Response != nil {
		return *g.Response, c.calls
	}
	if len(c.calls) == 0 {
		return text, nil
	}
	return "", c.calls
}

// joinParts joins the non-empty trimmed parts of an answer's text with
// newlines.
func joinParts(parts ...string) string {
	var out []string
	for _, s := range parts {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, "\n")
}

// addDeepSeek reads a DeepSeek call's body: NAME<｜tool▁sep｜>ARGS
// (V3.1) or function<｜tool▁sep｜>NAME\n```json\nARGS\n``` (R1).
func (c *parsedCalls) addDeepSeek(body string) bool {
	head, rest, ok := strings.Cut(body, dsSep)
	if !ok {
		return false
	}
	name, args := strings.TrimSpace(head), strings.TrimSpace(rest)
	if !strings.HasPrefix(args, "{") {
		var found bool
		if name, args, found = strings.Cut(args, "\n"); !found {
			return false
		}
		name = strings.TrimSpace(name)
		args = strings.TrimSpace(args)
		args = strings.TrimPrefix(args, "```json")
		args = strings.TrimSuffix(strings.TrimSpace(args), "```")
	}
	return c.add(name, []byte(args), "")
}

// addKimi reads a Kimi K2 call's body: functions.NAME:IDX, then
// <|tool_call_argument_begin|> and the arguments. The call keeps the
// model's id, which its template writes back in later turns.
func (c *parsedCalls) addKimi(body string) bool {
	id, args, ok := strings.Cut(body, kimiArgsBegin)
	if !ok {
		return false
	}
	id = strings.TrimSpace(id)
	name := strings.TrimPrefix(id, "functions.")
	if i := strings.LastIndexByte(name, ':'); i >= 0 {
		name = name[:i]
	} else {
		id = ""
	}
	return c.add(name, []byte(args), id)
}

// addGLM reads a GLM call's body: the name, then <arg_key>K</arg_key>
// <arg_value>V</arg_value> pairs; V is the text of a string parameter's
// value and JSON for others (text when it is not JSON).
func (c *parsedCalls) addGLM(body string) bool {
	name, rest, _ := strings.Cut(body, glmKey)
	name = strings.TrimSpace(name)
	t := c.p.tool(name)
	if t == nil {
		return false
	}
	props, _ := objectProps(t.Function.Parameters)
	isString := map[string]bool{}
	for _, pr := range props {
		_, isString[pr.name] = stringSchema(pr.schema)
	}
	var args bytes.Buffer
	args.WriteByte('{')
	for n := 0; rest != "" || n == 0; n++ {
		if n > 0 {
			var ok bool
			if _, rest, ok = strings.Cut(rest, glmKey); !ok {
				break
			}
		}
		key, after, ok := strings.Cut(rest, glmKeyEnd)
		if !ok {
			if n == 0 && strings.TrimSpace(rest) == "" {
				break // no arguments
			}
			return false
		}
		_, after, ok = strings.Cut(after, glmValue)
		if !ok {
			return false
		}
		value, after, ok := strings.Cut(after, glmValueEnd)
		if !ok {
			return false
		}
		rest = after
		if args.Len() > 1 {
			args.WriteByte(',')
		}
		k, _ := json.Marshal(strings.TrimSpace(key))
		args.Write(k)
		args.WriteByte(':')
		if v := strings.TrimSpace(value); !isString[strings.TrimSpace(key)] && json.Valid([]byte(v)) {
			args.WriteString(v)
		} else {
			s, _ := json.Marshal(value)
			args.Write(s)
		}
	}
	args.WriteByte('}')
	return c.add(name, args.Bytes(), "")
}

// harmony reads a gpt-oss answer: messages that start with
// <|start|>assistant (the first is already started by the prompt), each a
// header, <|message|> and the text to <|end|>. A header naming
// to=functions.NAME is a call; the analysis channel is reasoning, left
// out of the text; the final and commentary channels are the text. A
// message that cannot be read (a call of an unknown tool, broken JSON)
// stays in the text as it is.
func (c *parsedCalls) harmony(text string) (string, []ToolCall) {
	var content []string
	for _, msg := range strings.Split(text, "<|start|>assistant") {
		if msg == "" {
			continue
		}
		header, body, ok := strings.Cut(msg, "<|message|>")
		if !ok {
			content = append(content, msg)
			continue
		}
		body, _, _ = strings.Cut(body, "<|end|>")
		if _, to, ok := strings.Cut(header, "to=functions."); ok {
			name := to
			if i := strings.IndexAny(to, " <"); i >= 0 {
				name = to[:i]
			}
			if !c.add(name, []byte(body), "") {
				content = append(content, msg)
			}
			continue
		}
		if strings.Contains(header, "<|channel|>analysis") {
			continue
		}
		content = append(content, body)
	}
	return joinParts(content...), c.calls
}

// newCallID is a tool call's id.
func newCallID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "call_" + string(b)
}
