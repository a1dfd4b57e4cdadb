package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"shoal/engine/tokenizer"
	"shoal/serve"
)

const maxTopLogprobs = 20

// template returns the model's compiled chat template, compiling it (or
// falling back to ChatML, with one warning) on first use.
func (h *handler) template(m *Model) *modelTemplate {
	key := templateKey{m.Name, m.ChatTemplate}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.templates[key]; ok {
		return t
	}
	mt := &modelTemplate{}
	if m.ChatTemplate != "" {
		tpl, err := ParseChatTemplate(m.ChatTemplate)
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

var chatRoles = map[string]string{"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

// ChatPrompt renders messages through the model's chat template and
// tokenizes the result (special-token texts become their ids). BOS is added
// when the vocabulary asks for it and the rendered text does not already
// start with it, as llama.cpp does.
func (h *handler) chatPrompt(m *Model, msgs []TemplateMessage) ([]int32, *apiError) {
	mt := h.template(m)
	tok := m.Tok
	var bos, eos string
	if tok.BOS() != tokenizer.NoToken {
		bos = tok.Token(tok.BOS())
	}
	if tok.EOS() != tokenizer.NoToken {
		eos = tok.Token(tok.EOS())
	}
	text, err := mt.tpl.Render(TemplateInput{Messages: msgs, BOS: bos, EOS: eos, AddGenerationPrompt: true})
	if err != nil {
		var te *TemplateError
		if errors.As(err, &te) {
			return nil, badRequest("messages", "%s", te.Message)
		}
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: err.Error()}
	}
	ids := tok.Encode(text, false, true)
	if tok.AddBOS() && tok.BOS() != tokenizer.NoToken && (bos == "" || !strings.HasPrefix(text, bos)) {
		ids = append([]int32{tok.BOS()}, ids...)
	}
	return ids, nil
}

func (h *handler) chat(x *exchange) *apiError {
	var req ChatRequest
	if e := h.decode(x, &req); e != nil {
		return e
	}
	x.rec.Model, x.rec.Stream = req.Model, req.Stream
	m, e := h.lookup(req.Model)
	if e != nil {
		return e
	}
	if len(req.Messages) == 0 {
		return badRequest("messages", "messages must be a non-empty array")
	}
	msgs := make([]TemplateMessage, len(req.Messages))
	for i, msg := range req.Messages {
		role, ok := chatRoles[msg.Role]
		if !ok {
			return badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, msg.Role)
		}
		if msg.Content == nil || msg.Content.Null {
			if role != "assistant" {
				return badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content is required for role %q", i, msg.Role)
			}
		} else if msg.Content.NonText > 0 {
			return badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content has %d non-text parts; this model takes text only", i, msg.Content.NonText)
		}
		msgs[i] = TemplateMessage{Role: role, Name: msg.Name}
		if msg.Content != nil {
			msgs[i].Content = msg.Content.Text
		}
	}
	if len(req.Tools) > 0 {
		return badRequest("tools", "tools are not supported yet")
	}
	if rf := req.ResponseFormat; rf != nil && rf.Type != "" && rf.Type != "text" {
		return badRequest("response_format", "response_format %q is not supported yet; only \"text\"", rf.Type)
	}
	maxTokens := 0
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if mt.v != nil {
			if *mt.v <= 0 {
				return badRequest(mt.name, "%s must be at least 1, got %d", mt.name, *mt.v)
			}
			maxTokens = *mt.v // max_completion_tokens, the newer name, wins
		}
	}
	top := 0
	if req.TopLogprobs != nil {
		top = *req.TopLogprobs
		if top < 0 || top > maxTopLogprobs {
			return badRequest("top_logprobs", "top_logprobs must be between 0 and %d, got %d", maxTopLogprobs, top)
		}
		if !req.Logprobs && top > 0 {
			return badRequest("top_logprobs", "top_logprobs requires logprobs to be true")
		}
	}
	params, stops, e := h.sampling(samplingRequest{Temperature: req.Temperature, TopP: req.TopP, PresencePenalty: req.PresencePenalty,
		FrequencyPenalty: req.FrequencyPenalty, MinP: req.MinP, RepeatPenalty: req.RepeatPenalty, TopK: req.TopK, Seed: req.Seed, Stop: req.Stop, N: req.N})
	if e != nil {
		return e
	}
	prompt, e := h.chatPrompt(m, msgs)
	if e != nil {
		return e
	}
	sub, err := submitterFor(x.r.Context(), h.b, m)
	if err != nil {
		return submitError(err, "model")
	}
	g, e := h.start(x, sub, m.Tok, serve.Request{Prompt: prompt, MaxTokens: maxTokens, Sampling: params, Logprobs: req.Logprobs, TopLogprobs: top}, stops, "messages")
	if e != nil {
		return e
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	logprobs := func(toks []genToken) *ChatLogprobs {
		if !req.Logprobs {
			return nil
		}
		lp := &ChatLogprobs{Content: []TokenLogprob{}, Refusal: nil}
		for _, t := range toks {
			if t.id < 0 {
				continue
			}
			p := m.Tok.Piece(t.id)
			tl := TokenLogprob{Token: string(p), Logprob: t.logprob, Bytes: tokenBytes(p), TopLogprobs: []TopLogprob{}}
			for _, alt := range t.top {
				ap := m.Tok.Piece(alt.Token)
				tl.TopLogprobs = append(tl.TopLogprobs, TopLogprob{Token: string(ap), Logprob: alt.Logprob, Bytes: tokenBytes(ap)})
			}
			lp.Content = append(lp.Content, tl)
		}
		return lp
	}
	if !req.Stream {
		var text strings.Builder
		all := &ChatLogprobs{Content: []TokenLogprob{}}
		res := g.run(func(s string, toks []genToken) error {
			text.WriteString(s)
			if lp := logprobs(toks); lp != nil {
				all.Content = append(all.Content, lp.Content...)
			}
			return nil
		})
		if res.err != nil {
			return generationError(x, res.err)
		}
		if !req.Logprobs {
			all = nil
		}
		x.ok(ChatCompletion{ID: id, Object: "chat.completion", Created: created, Model: m.Name, SystemFingerprint: h.o.SystemFingerprint,
			Choices: []ChatChoice{{Message: AssistantMessage{Role: "assistant", Content: text.String()}, Logprobs: all, FinishReason: res.finish}},
			Usage:   g.usage(res)})
		return nil
	}
	usage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	sw := newSSE(x, h.o.StreamWriteTimeout)
	defer sw.end()
	chunk := func(c ChatChunkChoice) ChatChunk {
		ch := ChatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: m.Name, SystemFingerprint: h.o.SystemFingerprint,
			Choices: []ChatChunkChoice{c}}
		if usage {
			ch.Usage = json.RawMessage("null")
		}
		return ch
	}
	empty := ""
	if err := sw.send(chunk(ChatChunkChoice{Delta: ChatDelta{Role: "assistant", Content: &empty}})); err != nil {
		return nil
	}
	res := g.run(func(s string, toks []genToken) error {
		return sw.send(chunk(ChatChunkChoice{Delta: ChatDelta{Content: &s}, Logprobs: logprobs(toks)}))
	})
	if res.err != nil {
		sw.fail(res.err)
		return nil
	}
	finish := res.finish
	if sw.send(chunk(ChatChunkChoice{Delta: ChatDelta{}, FinishReason: &finish})) != nil {
		return nil
	}
	if usage {
		u, _ := json.Marshal(g.usage(res))
		last := ChatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: m.Name, SystemFingerprint: h.o.SystemFingerprint,
			Choices: []ChatChunkChoice{}, Usage: u}
		if sw.send(last) != nil {
			return nil
		}
	}
	sw.done()
	return nil
}

// generationError answers a non-streamed request whose generation failed.
func generationError(x *exchange, err error) *apiError {
	if x.r.Context().Err() != nil {
		// The client went away: nobody reads the answer. 499 is what
		// proxies log for this.
		x.status = 499
		return nil
	}
	if errors.Is(err, serve.ErrClosed) {
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "unavailable", msg: "generation stopped: " + err.Error()}
	}
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "generation failed: " + err.Error()}
}
