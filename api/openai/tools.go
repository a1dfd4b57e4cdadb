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
)

func (f toolFormat) String() string {
	return [...]string{"generic", "hermes", "mistral", "llama3"}[f]
}

// trigger is the text that starts a call in the format (none for generic,
// whose answer is always JSON).
func (f toolFormat) trigger() string {
	switch f {
	case toolsHermes:
		return "<tool_call>"
	case toolsMistral:
		return "[TOOL_CALLS]"
	case toolsLlama3:
		return `{"name"`
	}
	return ""
}

// detectToolFormat reads the format from the chat template's text.
func detectToolFormat(src string) toolFormat {
	switch {
	case !strings.Contains(src, "tools"):
		return toolsGeneric
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

// prepare fits the messages to the format: the generic one describes the
// tools in the system message and shows earlier calls in its JSON shape.
func (p *toolPlan) prepare(msgs []TemplateMessage) []TemplateMessage {
	if p.format != toolsGeneric {
		return msgs
	}
	var desc strings.Builder
	desc.WriteString("You can call these tools (JSON Schema of each tool's arguments):\n")
	for _, t := range p.tools {
		if p.named != "" && t.Function.Name != p.named {
			continue
		}
		b, _ := json.Marshal(map[string]any{"name": t.Function.Name, "description": t.Function.Description, "parameters": t.Function.Parameters})
		desc.Write(b)
		desc.WriteByte('\n')
	}
	desc.WriteString("\nTo call tools, answer with a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <its arguments>}]}")
	if p.choice == "auto" {
		desc.WriteString("; to answer without a tool, answer {\"response\": <your answer>}")
	}
	desc.WriteString(".")
	out := make([]TemplateMessage, 0, len(msgs)+1)
	if len(msgs) > 0 && msgs[0].Role == "system" {
		first := msgs[0]
		first.Content += "\n\n" + desc.String()
		out = append(out, first)
		msgs = msgs[1:]
	} else {
		out = append(out, TemplateMessage{Role: "system", Content: desc.String()})
	}
	for _, m := range msgs {
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
		}
		out = append(out, m)
	}
	return out
}

// grammar is the GBNF of the calls the answer may make, and whether it
// applies only from the format's trigger on (lazy: the model may answer
// in text first).
func (p *toolPlan) grammar(cons Constrainer) (gbnf string, lazy bool, err error) {
	var rules strings.Builder
	var calls []string
	argsKey := "arguments"
	if p.format == toolsLlama3 {
		argsKey = "parameters"
	}
	for i, t := range p.tools {
		if p.named != "" && t.Function.Name != p.named {
			continue
		}
		r, root, err := cons.SchemaRules(t.Function.Parameters, fmt.Sprintf("tool%d-", i))
		if err != nil {
			return "", false, fmt.Errorf("tools[%d].function.parameters: %w", i, err)
		}
		rules.WriteString(r)
		rules.WriteByte('\n')
		name, _ := json.Marshal(t.Function.Name)
		calls = append(calls, fmt.Sprintf("%s %s", gbnfLiteral(`{"name": `+string(name)+`, "`+argsKey+`": `), root)+` "}"`)
	}
	rules.WriteString("call ::= " + strings.Join(calls, " | ") + "\n")
	many := p.parallel && p.named == ""
	var root string
	switch p.format {
	case toolsHermes:
		one := `"<tool_call>\n" call "\n</tool_call>"`
		root = one
		if many {
			root += ` ("\n" ` + one + `)*`
		}
	case toolsMistral:
		root = `"[TOOL_CALLS][" call`
		if many {
			root += ` (", " call)*`
		}
		root += ` "]"`
	case toolsLlama3:
		root = "call"
	default:
		root = `"{\"tool_calls\": [" call`
		if many {
			root += ` (", " call)*`
		}
		root += ` "]}"`
		if p.choice == "auto" {
			sr, sroot, err := cons.SchemaRules([]byte(`{"type": "string"}`), "response-")
			if err != nil {
				return "", false, err
			}
			rules.WriteString(sr + "\n")
			root = "(" + root + `) | "{\"response\": " ` + sroot + ` "}"`
		}
	}
	lazy = p.choice == "auto" && p.format != toolsGeneric
	return "root ::= " + root + "\n" + rules.String(), lazy, nil
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

// parse splits an answer into its text and its calls (of known tools
// only: anything else stays text).
func (p *toolPlan) parse(text string) (content string, calls []ToolCall) {
	known := func(name string) bool {
		for _, t := range p.tools {
			if t.Function.Name == name {
				return true
			}
		}
		return false
	}
	add := func(raw []byte) bool {
		var c struct {
			Name       string          `json:"name"`
			Arguments  json.RawMessage `json:"arguments"`
			Parameters json.RawMessage `json:"parameters"`
		}
		if json.Unmarshal(raw, &c) != nil || !known(c.Name) {
			return false
		}
		args := c.Arguments
		if len(args) == 0 {
			args = c.Parameters
		}
		var s string
		if json.Unmarshal(args, &s) == nil { // arguments given as a string of JSON
			args = json.RawMessage(s)
		}
		var compact bytes.Buffer
		if len(args) == 0 {
			compact.WriteString("{}")
		} else if json.Compact(&compact, args) != nil {
			return false
		}
		calls = append(calls, ToolCall{ID: newCallID(), Type: "function", Function: FunctionCall{Name: c.Name, Arguments: compact.String()}})
		return true
	}
	switch p.format {
	case toolsHermes:
		rest := text
		var kept strings.Builder
		for {
			i := strings.Index(rest, "<tool_call>")
			if i < 0 {
				break
			}
			j := strings.Index(rest[i:], "</tool_call>")
			if j < 0 {
				break
			}
			body := rest[i+len("<tool_call>") : i+j]
			if add([]byte(strings.TrimSpace(body))) {
				kept.WriteString(rest[:i])
			} else {
				kept.WriteString(rest[:i+j+len("</tool_call>")])
			}
			rest = rest[i+j+len("</tool_call>"):]
		}
		kept.WriteString(rest)
		return strings.TrimSpace(kept.String()), calls
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
			add(raw)
		}
		if len(calls) == 0 {
			return text, nil
		}
		return strings.TrimSpace(text[:i]), calls
	case toolsLlama3:
		t := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
		if strings.HasPrefix(t, "{") && add([]byte(t)) {
			return "", calls
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
		add(raw)
	}
	if g.Response != nil {
		return *g.Response, calls
	}
	if len(calls) == 0 {
		return text, nil
	}
	return "", calls
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
