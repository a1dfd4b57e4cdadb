package openai

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"shoal/serve"
)

const defaultCompletionTokens = 16 // OpenAI's default for /v1/completions

func (h *handler) completions(x *exchange) *apiError {
	var req CompletionRequest
	if e := h.decode(x, &req); e != nil {
		return e
	}
	x.rec.Model, x.rec.Stream = req.Model, req.Stream
	m, e := h.lookup(req.Model)
	if e != nil {
		return e
	}
	if req.Prompt == nil || req.Prompt.Count == 0 {
		return badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids")
	}
	if req.Prompt.Count > 1 {
		return badRequest("prompt", "%d prompts were given; shoal serves one prompt per request", req.Prompt.Count)
	}
	if req.BestOf != nil && *req.BestOf != 1 {
		return badRequest("best_of", "best_of = %d is not supported (it must be 1)", *req.BestOf)
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return badRequest("suffix", "suffix (insertion) is not supported")
	}
	maxTokens := defaultCompletionTokens
	if req.MaxTokens != nil {
		if *req.MaxTokens <= 0 {
			return badRequest("max_tokens", "max_tokens must be at least 1, got %d", *req.MaxTokens)
		}
		maxTokens = *req.MaxTokens
	}
	wantLP, top := false, 0
	if req.Logprobs != nil {
		top = *req.Logprobs
		if top < 0 || top > maxTopLogprobs {
			return badRequest("logprobs", "logprobs must be between 0 and %d, got %d", maxTopLogprobs, top)
		}
		wantLP = true
	}
	if req.Echo && wantLP {
		return badRequest("echo", "echo with logprobs is not supported (prompt logprobs are not computed)")
	}
	params, stops, e := h.sampling(samplingRequest{Temperature: req.Temperature, TopP: req.TopP, PresencePenalty: req.PresencePenalty,
		FrequencyPenalty: req.FrequencyPenalty, MinP: req.MinP, RepeatPenalty: req.RepeatPenalty, TopK: req.TopK, Seed: req.Seed, Stop: req.Stop, N: req.N})
	if e != nil {
		return e
	}
	var prompt []int32
	var promptText string
	if req.Prompt.IsText {
		promptText = req.Prompt.Text
		prompt = m.Tok.Encode(promptText, true, true)
	} else {
		prompt = req.Prompt.Tokens
		for _, t := range prompt {
			if t < 0 || int(t) >= m.Tok.NVocab() {
				return badRequest("prompt", "token id %d is outside the vocabulary of %d", t, m.Tok.NVocab())
			}
		}
		promptText = m.Tok.Detokenize(prompt, false, false)
	}
	sub, err := submitterFor(x.r.Context(), h.b, m)
	if err != nil {
		return submitError(err, "model")
	}
	g, e := h.start(x, sub, m.Tok, serve.Request{Prompt: prompt, MaxTokens: maxTokens, Sampling: params, Logprobs: wantLP, TopLogprobs: top}, stops, "prompt")
	if e != nil {
		return e
	}
	id, created := newID("cmpl-"), time.Now().Unix()
	// text_offset counts characters from the start of the prompt.
	offset := utf8.RuneCountInString(promptText)
	logprobs := func(s string, toks []genToken) *CompletionLogprobs {
		if !wantLP {
			return nil
		}
		lp := &CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TextOffset: []int{}}
		if top > 0 {
			lp.TopLogprobs = []map[string]float32{}
		}
		at := offset
		for _, t := range toks {
			if t.id < 0 {
				continue
			}
			lp.Tokens = append(lp.Tokens, string(m.Tok.Piece(t.id)))
			lp.TokenLogprobs = append(lp.TokenLogprobs, t.logprob)
			lp.TextOffset = append(lp.TextOffset, at)
			at += utf8.RuneCountInString(t.text)
			if top > 0 {
				alts := make(map[string]float32, len(t.top))
				for _, a := range t.top {
					k := string(m.Tok.Piece(a.Token))
					if _, dup := alts[k]; !dup {
						alts[k] = a.Logprob
					}
				}
				lp.TopLogprobs = append(lp.TopLogprobs, alts)
			}
		}
		offset += utf8.RuneCountInString(s)
		return lp
	}
	if !req.Stream {
		var text strings.Builder
		if req.Echo {
			text.WriteString(promptText)
		}
		var all *CompletionLogprobs
		res := g.run(func(s string, toks []genToken) error {
			text.WriteString(s)
			if lp := logprobs(s, toks); lp != nil {
				if all == nil {
					all = lp
				} else {
					all.Tokens = append(all.Tokens, lp.Tokens...)
					all.TokenLogprobs = append(all.TokenLogprobs, lp.TokenLogprobs...)
					all.TopLogprobs = append(all.TopLogprobs, lp.TopLogprobs...)
					all.TextOffset = append(all.TextOffset, lp.TextOffset...)
				}
			}
			return nil
		})
		if res.err != nil {
			return generationError(x, res.err)
		}
		if wantLP && all == nil {
			all = logprobs("", nil)
		}
		finish := res.finish
		u, _ := json.Marshal(g.usage(res))
		x.ok(Completion{ID: id, Object: "text_completion", Created: created, Model: m.Name, SystemFingerprint: h.o.SystemFingerprint,
			Choices: []CompletionChoice{{Text: text.String(), Logprobs: all, FinishReason: &finish}}, Usage: u})
		return nil
	}
	usage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	sw := newSSE(x, h.o.StreamWriteTimeout)
	defer sw.end()
	chunk := func(c CompletionChoice) Completion {
		ch := Completion{ID: id, Object: "text_completion", Created: created, Model: m.Name, SystemFingerprint: h.o.SystemFingerprint,
			Choices: []CompletionChoice{c}}
		if usage {
			ch.Usage = json.RawMessage("null")
		}
		return ch
	}
	if req.Echo && promptText != "" {
		if sw.send(chunk(CompletionChoice{Text: promptText})) != nil {
			return nil
		}
	}
	res := g.run(func(s string, toks []genToken) error {
		return sw.send(chunk(CompletionChoice{Text: s, Logprobs: logprobs(s, toks)}))
	})
	if res.err != nil {
		sw.fail(res.err)
		return nil
	}
	finish := res.finish
	if sw.send(chunk(CompletionChoice{FinishReason: &finish})) != nil {
		return nil
	}
	if usage {
		u, _ := json.Marshal(g.usage(res))
		if sw.send(Completion{ID: id, Object: "text_completion", Created: created, Model: m.Name, SystemFingerprint: h.o.SystemFingerprint,
			Choices: []CompletionChoice{}, Usage: u}) != nil {
			return nil
		}
	}
	sw.done()
	return nil
}

func (h *handler) entry(m *Model) ModelEntry {
	e := ModelEntry{ID: m.Name, Object: "model", OwnedBy: m.OwnedBy, ChatTemplate: h.templateState(m)}
	if e.OwnedBy == "" {
		e.OwnedBy = "shoal"
	}
	if !m.Created.IsZero() {
		e.Created = m.Created.Unix()
	}
	if m.Sched != nil {
		e.ContextLen = m.Sched.Capacity()
	}
	return e
}

func (h *handler) models(x *exchange) *apiError {
	list := ModelList{Object: "list", Data: []ModelEntry{}}
	for _, m := range h.b.Models() {
		list.Data = append(list.Data, h.entry(m))
	}
	x.ok(list)
	return nil
}

func (h *handler) model(x *exchange) *apiError {
	id := x.r.PathValue("id")
	x.rec.Model = id
	m, ok := h.b.Model(id)
	if !ok {
		return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: "The model `" + id + "` does not exist."}
	}
	x.ok(h.entry(m))
	return nil
}
