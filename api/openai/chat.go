package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

var chatRoles = map[string]string{"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

// chatPrompt renders messages through the model's chat template and
// tokenizes the result (special-token texts become their ids). BOS is added
// when the vocabulary asks for it and the rendered text does not already
// start with it, as llama.cpp does.
func (h *handler) chatPrompt(m *Model, msgs []TemplateMessage, tools []json.RawMessage) ([]int32, *apiError) {
	ids, _, e := h.chatPromptText(m, msgs, tools)
	return ids, e
}

// chatPromptText is chatPrompt that also returns the rendered text.
func (h *handler) chatPromptText(m *Model, msgs []TemplateMessage, tools []json.RawMessage) ([]int32, string, *apiError) {
	sp := m.Tokenizer.Specials()
	text, err := h.template(m).tpl.Render(TemplateInput{Messages: msgs, BOS: sp.BOS, EOS: sp.EOS, AddGenerationPrompt: true, Tools: tools})
	if err != nil {
		var te *TemplateError
		if errors.As(err, &te) {
			return nil, "", badRequest("messages", "%s", te.Message)
		}
		return nil, "", &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: err.Error()}
	}
	ids := m.Tokenizer.Encode(text, false)
	if sp.AddBOS && (sp.BOS == "" || !strings.HasPrefix(text, sp.BOS)) {
		ids = append([]int32{sp.BOSID}, ids...)
	}
	return ids, text, nil
}

func (h *handler) chat(x *exchange) *apiError { return h.generate(x, &ChatRequest{}) }

// check reads the messages, the logprobs and the token limit.
func (req *ChatRequest) check(r *genRequest) *apiError {
	r.param = "messages"
	var e *apiError
	if r.messages, e = templateMessages(req.Messages); e != nil {
		return e
	}
	if r.tools, e = readTools(req); e != nil {
		return e
	}
	if e = r.responseFormat(req.ResponseFormat); e != nil {
		return e
	}
	if r.tools != nil && r.grammar != "" {
		return badRequest("response_format", "response_format with tools is not supported; give tool_choice \"none\" or no response_format")
	}
	// max_completion_tokens, the newer name, wins.
	if r.gen.MaxTokens, e = maxTokens(0, namedInt{"max_tokens", req.MaxTokens}, namedInt{"max_completion_tokens", req.MaxCompletionTokens}); e != nil {
		return e
	}
	if r.gen.TopLogprobs, e = topLogprobs(namedInt{"top_logprobs", req.TopLogprobs}); e != nil {
		return e
	}
	if !req.Logprobs && r.gen.TopLogprobs > 0 {
		return badRequest("top_logprobs", "top_logprobs requires logprobs to be true")
	}
	r.gen.Logprobs = req.Logprobs
	switch req.ReasoningFormat {
	case "", "auto", "deepseek":
	case "none":
		r.noReason = true
	default:
		return badRequest("reasoning_format", "reasoning_format %q is not one of auto, deepseek, none", req.ReasoningFormat)
	}
	return nil
}

// templateMessages checks the messages and gives them the roles chat
// templates know.
func templateMessages(msgs []ChatMessage) ([]TemplateMessage, *apiError) {
	if len(msgs) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty array")
	}
	out := make([]TemplateMessage, len(msgs))
	for i, msg := range msgs {
		role, ok := chatRoles[msg.Role]
		if !ok {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, msg.Role)
		}
		if msg.Content == nil || msg.Content.Null {
			if role != "assistant" {
				return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content is required for role %q", i, msg.Role)
			}
		} else if msg.Content.NonText > 0 {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content has %d non-text parts; this model takes text only", i, msg.Content.NonText)
		}
		out[i] = TemplateMessage{Role: role, Name: msg.Name, ToolCallID: msg.ToolCallID}
		if msg.Content != nil {
			out[i].Content = msg.Content.Text
		}
		if len(msg.ToolCalls) > 0 {
			if role != "assistant" {
				return nil, badRequest(fmt.Sprintf("messages[%d].tool_calls", i), "messages[%d] has tool_calls; only assistant messages make calls", i)
			}
			for j, c := range msg.ToolCalls {
				if c.Function.Name == "" {
					return nil, badRequest(fmt.Sprintf("messages[%d].tool_calls[%d].function.name", i, j), "messages[%d].tool_calls[%d] has no function name", i, j)
				}
			}
			out[i].ToolCalls = msg.ToolCalls
		}
		if role == "tool" && msg.ToolCallID == "" {
			return nil, badRequest(fmt.Sprintf("messages[%d].tool_call_id", i), "messages[%d] (role tool) needs the tool_call_id it answers", i)
		}
	}
	return out, nil
}

// tokenize renders the messages through the chat template, with the
// tools in the model's format, and sets the grammar of its calls.
func (req *ChatRequest) tokenize(h *handler, r *genRequest) *apiError {
	msgs := r.messages
	var tools []json.RawMessage
	if p := r.tools; p != nil {
		mt := h.template(r.model)
		p.format = toolsGeneric
		if !mt.fallback {
			src := mt.tpl.Source()
			p.format = detectToolFormat(src)
			p.describe = p.format != toolsGeneric && !strings.Contains(src, "tools")
		}
		if p.format != toolsGeneric {
			tools = p.raw
		}
		msgs = p.prepare(msgs)
		if r.model.Constrainer != nil {
			gbnf, lazy, err := p.grammar(r.model.Constrainer)
			if err != nil {
				return badRequest("tools", "%v", err)
			}
			r.grammar, r.grammarParam = gbnf, "tools"
			if lazy {
				r.trigger = p.format.trigger()
			}
		} else if p.choice != "auto" {
			return badRequest("tool_choice", "model %q cannot constrain its output, so it cannot be made to call a tool (tool_choice %q)", r.model.Name, p.choice)
		}
	}
	var e *apiError
	var text string
	r.gen.Prompt, text, e = h.chatPromptText(r.model, msgs, tools)
	// An answer a grammar shapes from its first token has no reasoning
	// (and with <think> opened by the prompt, would all be taken for it).
	whole := r.grammar != "" && r.trigger == ""
	if mt := h.template(r.model); e == nil && !r.noReason && !mt.fallback && !whole {
		r.reasoning = detectReasoning(mt.tpl.Source())
		r.thinkOpen = r.reasoning == reasonThink && strings.HasSuffix(strings.TrimRight(text, " \t\r\n"), thinkOpen)
	}
	return e
}

func (req *ChatRequest) shapes(h *handler, r *genRequest) []shape {
	a := h.newAnswer(r, "chatcmpl-")
	out := make([]shape, r.n)
	for i := range out {
		c := &chatShape{answer: a, tok: r.model.Tokenizer, logprobs: r.gen.Logprobs, all: []TokenLogprob{}, tools: r.tools,
			reasoning: r.reasoning, thinkOpen: r.thinkOpen}
		// gpt-oss's calls are harmony messages too: with tools the whole
		// answer is read at its end (toolPlan.parse), reasoning included.
		if r.reasoning != reasonNone && (r.tools == nil || r.tools.format != toolsHarmony) {
			c.reason = newReasoner(r.reasoning, r.thinkOpen)
		}
		c.index = i
		out[i] = c
	}
	return out
}

// chatShape answers chat completions.
type chatShape struct {
	answer
	tok      Tokenizer
	logprobs bool
	text     strings.Builder // the answer that is not streamed
	all      []TokenLogprob  // and its logprobs
	// tools, when the answer may call them: streamed text is held back
	// from where a call may start (held), and the calls are parsed at
	// the end.
	tools   *toolPlan
	held    strings.Builder
	calling bool // the answer is in a call: nothing more streams as text
	sent    int  // bytes of text streamed
	// jsonText: a generic-format answer that is text, streamed from its
	// JSON string (sent counts the raw bytes decoded).
	jsonText bool
	// reasoning is how the answer marks its reasoning; reason splits it
	// off as it streams (nil: not split, or split at the end).
	reasoning reasoningFormat
	thinkOpen bool
	reason    *reasoner
	thought   strings.Builder // the reasoning of an answer that is not streamed
}

// tokens are the logprobs of generated tokens.
func (c *chatShape) tokens(toks []genToken) []TokenLogprob {
	out := []TokenLogprob{}
	for _, t := range toks {
		if t.id < 0 {
			continue
		}
		p := c.tok.Piece(t.id)
		tl := TokenLogprob{Token: string(p), Logprob: t.logprob, Bytes: tokenBytes(p), TopLogprobs: []TopLogprob{}}
		for _, alt := range t.top {
			ap := c.tok.Piece(alt.Token)
			tl.TopLogprobs = append(tl.TopLogprobs, TopLogprob{Token: string(ap), Logprob: alt.Logprob, Bytes: tokenBytes(ap)})
		}
		out = append(out, tl)
	}
	return out
}

func (c *chatShape) streamed(choice ChatChunkChoice) ChatChunk {
	choice.Index = c.index
	return oneChoice(c.answer, "chat.completion.chunk", choice)
}

func (c *chatShape) first() any {
	empty := ""
	return c.streamed(ChatChunkChoice{Delta: ChatDelta{Role: "assistant", Content: &empty}})
}

func (c *chatShape) chunk(text string, toks []genToken) any {
	var thought string
	if c.reason != nil {
		thought, text = c.reason.feed(text)
	}
	if c.tools != nil {
		c.text.WriteString(text)
		text = c.streamable()
	}
	if text == "" && thought == "" && (c.tools != nil || c.reason != nil) {
		return nil
	}
	var choice ChatChunkChoice
	if thought != "" {
		choice.Delta.ReasoningContent = &thought
	}
	if text != "" || thought == "" {
		choice.Delta.Content = &text
	}
	if c.logprobs {
		choice.Logprobs = &ChatLogprobs{Content: c.tokens(toks)}
	}
	return c.streamed(choice)
}

// streamable is the text of an answer that may call tools that can be
// streamed now: none when the whole answer is a call (a required call, the
// generic JSON format), and otherwise the text up to where a call starts,
// holding back an end that may be the start of the trigger.
func (c *chatShape) streamable() string {
	trigger := c.tools.format.trigger()
	if !c.calling && c.tools.format == toolsGeneric && c.tools.choice == "auto" {
		return c.streamResponse()
	}
	if c.calling || trigger == "" || c.tools.choice != "auto" || c.tools.format == toolsHarmony {
		// gpt-oss's answer is harmony messages: its text is known when
		// they are read, at the end.
		c.calling = true
		return ""
	}
	full := c.text.String()
	rest := full[c.sent:]
	if i := strings.Index(rest, trigger); i >= 0 {
		c.calling = true
		c.sent += i
		return rest[:i]
	}
	safe := len(rest) - heldPrefix(rest, trigger)
	c.sent += safe
	return rest[:safe]
}

// responseHead starts a generic-format answer that is text: the text is
// the JSON string that follows.
const responseHead = `{"response": "`

// streamResponse streams the text of a generic-format answer as its JSON
// string arrives, decoded, up to the last complete character or escape;
// an answer that turns out to be a call streams nothing.
func (c *chatShape) streamResponse() string {
	full := c.text.String()
	if !c.jsonText {
		if len(full) < len(responseHead) {
			if !strings.HasPrefix(responseHead, full) {
				c.calling = true
			}
			return ""
		}
		if !strings.HasPrefix(full, responseHead) {
			c.calling = true
			return ""
		}
		c.jsonText, c.sent = true, len(responseHead)
	}
	i := c.sent
scan:
	for i < len(full) {
		switch full[i] {
		case '"':
			break scan // the end of the text
		case '\\':
			n := 2
			if i+1 < len(full) && full[i+1] == 'u' {
				n = 6
				if i+n <= len(full) {
					if v, err := strconv.ParseUint(full[i+2:i+6], 16, 16); err == nil && v >= 0xD800 && v < 0xDC00 {
						n = 12 // a surrogate pair
					}
				}
			}
			if i+n > len(full) {
				break scan // the escape is not complete yet
			}
			i += n
		default:
			i++
		}
	}
	var text string
	if json.Unmarshal([]byte(`"`+full[c.sent:i]+`"`), &text) != nil {
		return ""
	}
	c.sent = i
	return text
}

func (c *chatShape) add(text string, toks []genToken) {
	if c.reason != nil {
		thought, content := c.reason.feed(text)
		c.thought.WriteString(thought)
		text = content
	}
	c.text.WriteString(text)
	if c.logprobs {
		c.all = append(c.all, c.tokens(toks)...)
	}
}

func (c *chatShape) last(finish string) []any {
	var out []any
	if c.reason != nil {
		thought, rest := c.reason.flush()
		if thought != "" {
			out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{ReasoningContent: &thought}}))
		}
		if c.tools != nil {
			c.text.WriteString(rest)
		} else if rest != "" {
			out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{Content: &rest}}))
		}
	}
	if c.tools != nil {
		full := c.text.String()
		content, calls := c.tools.parse(full)
		rest := full[c.sent:]
		if c.tools.format == toolsHarmony {
			rest = content // nothing was streamed
			if thought, _ := c.harmonyThought(full); thought != "" {
				out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{ReasoningContent: &thought}}))
			}
			if len(calls) > 0 && content != "" {
				out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{Content: &content}}))
			}
		}
		if len(calls) > 0 {
			deltas := make([]ToolCallDelta, 0, 2*len(calls))
			for i, call := range calls {
				deltas = append(deltas, ToolCallDelta{Index: i, ID: call.ID, Type: "function", Function: FunctionCallDelta{Name: call.Function.Name}})
			}
			out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{ToolCalls: deltas}}))
			for i, call := range calls {
				out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{ToolCalls: []ToolCallDelta{{Index: i, Function: FunctionCallDelta{Arguments: call.Function.Arguments}}}}}))
			}
			if finish == "stop" {
				finish = "tool_calls"
			}
		} else if rest != "" && !c.jsonText {
			out = append(out, c.streamed(ChatChunkChoice{Delta: ChatDelta{Content: &rest}}))
		}
	}
	return append(out, c.streamed(ChatChunkChoice{FinishReason: &finish}))
}

func (c *chatShape) usage(u Usage) any {
	return withUsage[ChatChunkChoice](c.answer, "chat.completion.chunk", u)
}

func (c *chatShape) whole(finish string, u Usage) any {
	var lp *ChatLogprobs
	if c.logprobs {
		lp = &ChatLogprobs{Content: c.all}
	}
	if c.reason != nil {
		thought, rest := c.reason.flush()
		c.thought.WriteString(thought)
		c.text.WriteString(rest)
	}
	text := c.text.String()
	msg := AssistantMessage{Role: "assistant", Content: &text}
	if thought, ok := c.harmonyThought(text); ok {
		c.thought.WriteString(thought)
	}
	if c.thought.Len() > 0 {
		thought := c.thought.String()
		msg.ReasoningContent = &thought
	}
	if c.tools != nil {
		content, calls := c.tools.parse(text)
		msg.Content, msg.ToolCalls = &content, calls
		if len(calls) > 0 {
			if content == "" {
				msg.Content = nil
			}
			if finish == "stop" {
				finish = "tool_calls"
			}
		}
	}
	return ChatCompletion{Envelope: c.as("chat.completion"), Usage: u,
		Choices: []ChatChoice{{Index: c.index, Message: msg, Logprobs: lp, FinishReason: finish}}}
}

// harmonyThought is the reasoning of a gpt-oss answer with tools, read
// whole at its end (ok false when the answer is not split that way).
func (c *chatShape) harmonyThought(full string) (string, bool) {
	if c.reasoning != reasonHarmony || c.reason != nil || c.tools == nil || c.tools.format != toolsHarmony {
		return "", false
	}
	thought, _ := splitAll(reasonHarmony, false, full)
	return thought, true
}
