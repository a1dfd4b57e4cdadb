package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ChatMLTemplate is the template used for models whose GGUF file carries no
// tokenizer.chat_template (the same fallback llama.cpp uses).
const ChatMLTemplate = `{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}`

// templateKey identifies a compiled template: a Backend may hand out new
// *Model values for the same model.
type templateKey struct{ model, src string }

// modelTemplate is a model's compiled chat template.
type modelTemplate struct {
	tpl      *ChatTemplate
	fallback bool   // ChatML because the model has none (or it does not parse)
	reason   string // why the fallback was taken
}

// template returns the model's compiled chat template, compiling it (or
// falling back to ChatML, with one warning) on first use.
func (h *handler) template(m *Model) *modelTemplate {
	src := m.Tokenizer.ChatTemplate()
	key := templateKey{m.Name, src}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.templates[key]; ok {
		return t
	}
	mt := &modelTemplate{}
	if src != "" {
		tpl, err := ParseChatTemplate(src)
		if err == nil {
			mt.tpl = tpl
		} else {
			mt.reason = "the model's chat template does not parse: " + err.Error()
		}
	} else {
		mt.reason = "the model has no tokenizer.chat_template"
	}
	if mt.tpl == nil {
		tpl, err := ParseChatTemplate(ChatMLTemplate)
		if err != nil {
			panic(err) // a constant
		}
		mt.tpl, mt.fallback = tpl, true
		h.log.Sugar().Warnf("model %q: %s; chat requests use ChatML", m.Name, mt.reason)
	}
	h.templates[key] = mt
	return mt
}

// templateState is what /v1/models says about a model's chat template.
func (h *handler) templateState(m *Model) string {
	if h.template(m).fallback {
		return "fallback-chatml"
	}
	return "model"
}

// ChatTemplate is a compiled Jinja chat template in the Hugging Face
// convention: it is rendered with messages (role, content), bos_token,
// eos_token, add_generation_prompt and date_string (as llama.cpp), tools
// when there are some, with raise_exception, strftime_now and a
// Python-compatible tojson available, trim_blocks and lstrip_blocks on, as
// transformers' apply_chat_template does.
type ChatTemplate struct {
	src string
	tpl *exec.Template
	// objectArgs: the template reads tool calls' arguments as an object
	// (tojson, items(), a member); otherwise it gets them as the request's
	// JSON text, as llama.cpp decides from the same kind of probe.
	objectArgs bool
	// systemRole: the template shows a system message; otherwise a first
	// system message goes to the start of the next one, as llama.cpp
	// does.
	systemRole bool
}

// TemplateError is a template's raise_exception call: the request is at
// fault (for example roles that do not alternate), so it maps to 400.
type TemplateError struct{ Message string }

func (e *TemplateError) Error() string { return e.Message }

// env is the gonja environment chat templates run in: gonja's Python
// built-ins with tojson replaced by one that prints like Python's
// json.dumps (", " and ": " separators, keys in insertion order, non-ASCII
// kept), as transformers' tojson does, and dictionaries that keep their
// order (template_builtins.go).
var env = func() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	for name, f := range map[string]exec.FilterFunction{"tojson": filterToJSON, "items": filterItems, "dictsort": filterDictSort} {
		if err := filters.Replace(name, f); err != nil {
			panic(err)
		}
	}
	methods := builtins.Methods
	methods.Dict = dictMethods()
	methods.Str = strMethods()
	return &exec.Environment{
		Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           methods,
	}
}()

const templateID = "/chat_template"

// ParseChatTemplate compiles a chat template.
func ParseChatTemplate(src string) (_ *ChatTemplate, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("chat template: parser panic: %v", r)
		}
	}()
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	// Only the template itself can be loaded: {% include %} of anything
	// else fails instead of reading the file system.
	loader, err := loaders.NewMemoryLoader(map[string]string{templateID: adaptSource(src, cfg)})
	if err != nil {
		return nil, err
	}
	tpl, err := exec.NewTemplate(templateID, cfg, loader, env)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	t := &ChatTemplate{src: src, tpl: tpl, systemRole: true}
	t.objectArgs = t.readsObjectArguments()
	t.systemRole = t.showsSystem()
	return t, nil
}

// showsSystem renders a system and a user message and reports whether
// the system message's text came out (Gemma 2's template refuses it).
func (t *ChatTemplate) showsSystem() bool {
	const probe = "shoal-probe-system"
	out, err := t.render(TemplateInput{Messages: []TemplateMessage{{Role: "system", Content: probe}, {Role: "user", Content: "User message"}}, AddGenerationPrompt: true}, t.objectArgs)
	return err == nil && strings.Contains(out, probe)
}

// argsProbeKey and argsProbeValue are the arguments of the probe's call.
const argsProbeKey, argsProbeValue = "shoal_probe_arg", "shoal-probe-value"

// readsObjectArguments renders a conversation with a tool call whose
// arguments are an object and reports whether the template printed the
// argument's value from it (not the dictionary's Python text, which is
// what concatenating the object with a string gives: such a template
// wants the arguments as JSON text).
func (t *ChatTemplate) readsObjectArguments() bool {
	call := ToolCall{ID: "call00001", Type: "function", Function: FunctionCall{Name: "tool1", Arguments: `{"` + argsProbeKey + `": "` + argsProbeValue + `"}`}}
	out, err := t.render(TemplateInput{
		Messages: []TemplateMessage{
			{Role: "user", Content: "User message"},
			{Role: "assistant", ToolCalls: []ToolCall{call}},
			{Role: "tool", Content: "Tool response", ToolCallID: call.ID},
			{Role: "assistant", Content: "The tool response was 'tool response'"},
			{Role: "user", Content: "User message"},
		},
		AddGenerationPrompt: true,
		Tools:               []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "tool1", "description": "Tool description", "parameters": {"type": "object", "properties": {"` + argsProbeKey + `": {"type": "string", "description": "Arg description"}}, "required": ["` + argsProbeKey + `"]}}}`)},
	}, true)
	return err == nil && strings.Contains(out, argsProbeValue) && !strings.Contains(out, "{'"+argsProbeKey+"'")
}

// Source returns the template text.
func (t *ChatTemplate) Source() string { return t.src }

// TemplateMessage is one chat message as the template sees it.
type TemplateMessage struct {
	Role    string
	Content string
	Name    string
	// ToolCalls are an assistant message's calls (their arguments an
	// object when they are one and the template reads them as one, their
	// JSON text otherwise);
	// ToolCallID is the call a tool message answers.
	ToolCalls  []ToolCall
	ToolCallID string
}

// TemplateInput holds the variables a chat template is rendered with.
type TemplateInput struct {
	Messages            []TemplateMessage
	BOS, EOS            string // token texts ("" when the vocabulary has none)
	AddGenerationPrompt bool
	Now                 time.Time // for strftime_now; zero means time.Now()
	// Tools are the request's tools, each a JSON object in the OpenAI
	// shape ({"type": "function", "function": {...}}), passed to the
	// template as "tools" when there are any.
	Tools []json.RawMessage
}

// Render renders the template. A raise_exception call in the template
// returns a *TemplateError with its message.
func (t *ChatTemplate) Render(in TemplateInput) (string, error) {
	return t.render(in, t.objectArgs)
}

// render renders the template, with tool calls' arguments that are a JSON
// object given as an object (objectArgs) or as their text.
func (t *ChatTemplate) render(in TemplateInput, objectArgs bool) (out string, err error) {
	var raised *TemplateError
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat template: panic while rendering: %v", r)
		}
	}()
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	messages := in.Messages
	if !t.systemRole && len(messages) > 1 && messages[0].Role == "system" {
		next := messages[1]
		next.Content = messages[0].Content + "\n" + next.Content
		messages = append([]TemplateMessage{next}, messages[2:]...)
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		d := exec.NewDict()
		d.Pairs = append(d.Pairs,
			&exec.Pair{Key: exec.AsValue("role"), Value: exec.AsValue(m.Role)},
			&exec.Pair{Key: exec.AsValue("content"), Value: exec.AsValue(m.Content)})
		if m.Name != "" {
			d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue("name"), Value: exec.AsValue(m.Name)})
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]any, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				var args any = c.Function.Arguments
				if v, err := templateValue([]byte(c.Function.Arguments)); err == nil && objectArgs {
					if _, isDict := v.(*exec.Dict); isDict {
						args = v
					}
				}
				// llama.cpp's order of the keys (tojson prints it).
				call := dict("type", "function", "function", dict("name", c.Function.Name, "arguments", args))
				if c.ID != "" {
					call.Pairs = append(call.Pairs, &exec.Pair{Key: exec.AsValue("id"), Value: exec.AsValue(c.ID)})
				}
				calls[j] = call
			}
			d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue("tool_calls"), Value: exec.AsValue(calls)})
		}
		if m.ToolCallID != "" {
			d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue("tool_call_id"), Value: exec.AsValue(m.ToolCallID)})
		}
		msgs[i] = d
	}
	vars := map[string]any{}
	if len(in.Tools) > 0 {
		tools := make([]any, len(in.Tools))
		for i, raw := range in.Tools {
			v, err := templateValue(raw)
			if err != nil {
				return "", fmt.Errorf("chat template: tools[%d]: %w", i, err)
			}
			tools[i] = v
		}
		vars["tools"] = tools
	}
	data := exec.NewContext(map[string]any{
		"messages":              msgs,
		"bos_token":             in.BOS,
		"eos_token":             in.EOS,
		"add_generation_prompt": in.AddGenerationPrompt,
		// As llama.cpp defines it (Llama 3.1's template reads it).
		"date_string": strftime(now, "%d %b %Y"),
		"raise_exception": func(_ *exec.Evaluator, p *exec.VarArgs) (*exec.Value, error) {
			msg := "the chat template raised an exception"
			if len(p.Args) > 0 {
				msg = p.Args[0].String()
			}
			if raised == nil {
				raised = &TemplateError{Message: msg}
			}
			return nil, raised
		},
		"strftime_now": func(_ *exec.Evaluator, p *exec.VarArgs) (*exec.Value, error) {
			if len(p.Args) != 1 || !p.Args[0].IsString() {
				return nil, errors.New("strftime_now takes one format string")
			}
			return exec.AsValue(strftime(now, p.Args[0].String())), nil
		},
	})
	data.Update(exec.NewContext(vars))
	out, err = t.tpl.ExecuteToString(data)
	if raised != nil {
		return "", raised
	}
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// dict is an ordered template dictionary of key, value pairs.
func dict(kv ...any) *exec.Dict {
	d := exec.NewDict()
	for i := 0; i+1 < len(kv); i += 2 {
		d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(kv[i]), Value: exec.AsValue(kv[i+1])})
	}
	return d
}

// templateValue decodes JSON into template values, objects keeping their
// keys' order (tojson prints them back in it, as Python does).
func templateValue(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeTemplateValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

func decodeTemplateValue(dec *json.Decoder, depth int) (any, error) {
	if depth > 64 {
		return nil, errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := exec.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeTemplateValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(v)})
			}
			_, err := dec.Token()
			return d, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeTemplateValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return int(i), nil
		}
		f, err := t.Float64()
		return f, err
	}
	return tok, nil
}

// strftimeLayouts are the strftime directives that are a Go time layout.
var strftimeLayouts = map[byte]string{
	'a': "Mon", 'A': "Monday", 'b': "Jan", 'h': "Jan", 'B': "January", 'd': "02", 'm': "01", 'y': "06", 'Y': "2006",
	'H': "15", 'I': "03", 'M': "04", 'S': "05", 'p': "PM", 'Z': "MST", 'z': "-0700", 'F': "2006-01-02", 'T': "15:04:05",
}

// strftime formats t with the C/Python strftime directives templates use.
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '%' || i+1 == len(f) {
			b.WriteByte(c)
			continue
		}
		i++
		if layout, ok := strftimeLayouts[f[i]]; ok {
			b.WriteString(t.Format(layout))
			continue
		}
		switch f[i] {
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

// filterToJSON prints a value like Python's json.dumps(x,
// ensure_ascii=False) with its indent, separators, sort_keys and
// ensure_ascii arguments, which is what transformers' tojson does.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	o := pyJSON{indent: -1}
	if v, ok := params.KwArgs["indent"]; ok && v.IsInteger() {
		o.indent = v.Integer()
	} else if len(params.Args) > 0 && params.Args[0].IsInteger() {
		o.indent = params.Args[0].Integer()
	}
	o.itemSep, o.keySep = ", ", ": "
	if o.indent >= 0 {
		o.itemSep = ","
	}
	if v, ok := params.KwArgs["separators"]; ok && v.IsList() && v.Len() == 2 {
		o.itemSep, o.keySep = v.Index(0).String(), v.Index(1).String()
	}
	if v, ok := params.KwArgs["sort_keys"]; ok {
		o.sortKeys = v.IsTrue()
	}
	if v, ok := params.KwArgs["ensure_ascii"]; ok {
		o.ascii = v.IsTrue()
	}
	var b strings.Builder
	if err := o.write(&b, in, 0); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(b.String())
}

// pyJSON is how json.dumps was asked to print.
type pyJSON struct {
	indent          int // < 0: on one line
	itemSep, keySep string
	sortKeys, ascii bool
}

func (o *pyJSON) write(b *strings.Builder, v *exec.Value, depth int) error {
	if depth > 64 {
		return errors.New("tojson: value nested too deeply")
	}
	newline := func(d int) {
		if o.indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", o.indent*d))
		}
	}
	switch {
	case v == nil || v.IsNil():
		b.WriteString("null")
	case v.IsBool():
		if v.Bool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInteger():
		b.WriteString(strconv.Itoa(v.Integer()))
	case v.IsFloat():
		f := v.Float()
		switch {
		case math.IsNaN(f):
			b.WriteString("NaN")
		case math.IsInf(f, 1):
			b.WriteString("Infinity")
		case math.IsInf(f, -1):
			b.WriteString("-Infinity")
		default:
			s := strconv.FormatFloat(f, 'g', -1, 64)
			if !strings.ContainsAny(s, ".eEn") {
				s += ".0"
			}
			b.WriteString(s)
		}
	case v.IsString():
		writePyString(b, v.String(), o.ascii)
	case v.IsDict():
		pairs := dictPairs(v)
		if len(pairs) == 0 {
			b.WriteString("{}")
			return nil
		}
		if o.sortKeys {
			pairs = append([]*exec.Pair(nil), pairs...)
			sort.SliceStable(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
		}
		b.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			writePyString(b, p.Key.String(), o.ascii)
			b.WriteString(o.keySep)
			if err := o.write(b, p.Value, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
	case v.IsList():
		n := v.Len()
		if n == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			if err := o.write(b, v.Index(i), depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
	default:
		writePyString(b, v.String(), o.ascii)
	}
	return nil
}

// dictPairs returns a dict's entries: in insertion order for gonja dicts,
// sorted by key for Go maps (which have no order).
func dictPairs(v *exec.Value) []*exec.Pair {
	if d, ok := v.Interface().(*exec.Dict); ok {
		return d.Pairs
	}
	if d, ok := v.Interface().(exec.Dict); ok {
		return d.Pairs
	}
	pairs := v.Items()
	sort.Slice(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
	return pairs
}

// writePyString prints a JSON string as Python does: control characters
// escaped, and with ascii everything past ASCII as \u escapes (UTF-16).
func writePyString(b *strings.Builder, s string, ascii bool) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch r {
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
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (ascii && r > 0x7e && r < 0x10000):
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r >= 0x10000:
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04x\u%04x`, hi, lo)
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
