package openai

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

var chatRoles = map[string]string{"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

// chatPrompt renders messages through the model's chat template and
// tokenizes the result (special-token texts become their ids). BOS is added
// when the vocabulary asks for it and the rendered text does not already
// start with it, as llama.cpp does.
func (h *handler) chatPrompt(m *Model, msgs []TemplateMessage) ([]int32, *apiError) {
	sp := m.Tokenizer.Specials()
	text, err := h.template(m).tpl.Render(TemplateInput{Messages: msgs, BOS: sp.BOS, EOS: sp.EOS, AddGenerationPrompt: true})
	if err != nil {
		var te *TemplateError
		if errors.As(err, &te) {
			return nil, badRequest("messages", "%s", te.Message)
		}
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: err.Error()}
	}
	ids := m.Tokenizer.Encode(text, false)
	if sp.AddBOS && (sp.BOS == "" || !strings.HasPrefix(text, sp.BOS)) {
		ids = append([]int32{sp.BOSID}, ids...)
	}
	return ids, nil
}

func (h *handler) chat(x *exchange) *apiError { return h.generate(x, &ChatRequest{}) }

// check reads the messages, the logprobs and the token limit.
func (req *ChatRequest) check(r *genRequest) *apiError {
	r.param = "messages"
	var e *apiError
	if r.messages, e = templateMessages(req.Messages); e != nil {
		return e
	}
	if len(req.Tools) > 0 {
		return badRequest("tools", "tools are not supported yet")
	}
	if rf := req.ResponseFormat; rf != nil && rf.Type != "" && rf.Type != "text" {
		return badRequest("response_format", "response_format %q is not supported yet; only \"text\"", rf.Type)
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
		out[i] = TemplateMessage{Role: role, Name: msg.Name}
		if msg.Content != nil {
			out[i].Content = msg.Content.Text
		}
	}
	return out, nil
}

// tokenize renders the messages through the chat template.
func (req *ChatRequest) tokenize(h *handler, r *genRequest) *apiError {
	var e *apiError
	r.gen.Prompt, e = h.chatPrompt(r.model, r.messages)
	return e
}

func (req *ChatRequest) shapes(h *handler, r *genRequest) []shape {
	a := h.newAnswer(r, "chatcmpl-")
	out := make([]shape, r.n)
	for i := range out {
		c := &chatShape{answer: a, tok: r.model.Tokenizer, logprobs: r.gen.Logprobs, all: []TokenLogprob{}}
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
	choice := ChatChunkChoice{Delta: ChatDelta{Content: &text}}
	if c.logprobs {
		choice.Logprobs = &ChatLogprobs{Content: c.tokens(toks)}
	}
	return c.streamed(choice)
}

func (c *chatShape) add(text string, toks []genToken) {
	c.text.WriteString(text)
	if c.logprobs {
		c.all = append(c.all, c.tokens(toks)...)
	}
}

func (c *chatShape) last(finish string) any {
	return c.streamed(ChatChunkChoice{FinishReason: &finish})
}

func (c *chatShape) usage(u Usage) any {
	return withUsage[ChatChunkChoice](c.answer, "chat.completion.chunk", u)
}

func (c *chatShape) whole(finish string, u Usage) any {
	var lp *ChatLogprobs
	if c.logprobs {
		lp = &ChatLogprobs{Content: c.all}
	}
	return ChatCompletion{Envelope: c.as("chat.completion"), Usage: u,
		Choices: []ChatChoice{{Index: c.index, Message: AssistantMessage{Role: "assistant", Content: c.text.String()}, Logprobs: lp, FinishReason: finish}}}
}
