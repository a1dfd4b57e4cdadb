package openai

import (
	"strings"
	"unicode/utf8"
)

const defaultCompletionTokens = 16 // OpenAI's default for /v1/completions

func (h *handler) completions(x *exchange) *apiError { return h.generate(x, &CompletionRequest{}) }

// check reads the prompt's form, the logprobs and the token limit.
func (req *CompletionRequest) check(r *genRequest) *apiError {
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
	r.param = "prompt"
	var e *apiError
	if r.gen.MaxTokens, e = maxTokens(defaultCompletionTokens, namedInt{"max_tokens", req.MaxTokens}); e != nil {
		return e
	}
	if r.gen.TopLogprobs, e = topLogprobs(namedInt{"logprobs", req.Logprobs}); e != nil {
		return e
	}
	r.gen.Logprobs = req.Logprobs != nil
	if req.Echo && r.gen.Logprobs {
		return badRequest("echo", "echo with logprobs is not supported (prompt logprobs are not computed)")
	}
	r.echo = req.Echo
	return nil
}

// tokenize encodes a text prompt, or checks a token one and decodes it.
func (req *CompletionRequest) tokenize(h *handler, r *genRequest) *apiError {
	tok := r.model.Tokenizer
	if req.Prompt.IsText {
		r.promptText = req.Prompt.Text
		r.gen.Prompt = tok.Encode(r.promptText, true)
		return nil
	}
	if e := checkTokens(tok, req.Prompt.Tokens); e != nil {
		return e
	}
	r.gen.Prompt = req.Prompt.Tokens
	r.promptText = tok.Decode(r.gen.Prompt)
	return nil
}

func (req *CompletionRequest) shapes(h *handler, r *genRequest) []shape {
	a := h.newAnswer(r, "cmpl-")
	out := make([]shape, r.n)
	for i := range out {
		c := &textShape{answer: a, tok: r.model.Tokenizer, logprobs: r.gen.Logprobs, top: r.gen.TopLogprobs,
			offset: utf8.RuneCountInString(r.promptText)}
		c.index = i
		if r.echo {
			c.echo = r.promptText
		}
		c.text.WriteString(c.echo)
		c.all = c.tokens("", nil)
		out[i] = c
	}
	return out
}

// textShape answers completions.
type textShape struct {
	answer
	tok      Tokenizer
	logprobs bool
	top      int
	offset   int                 // text_offset of the next text: characters from the start of the prompt
	echo     string              // the prompt when it is echoed
	text     strings.Builder     // the answer that is not streamed
	all      *CompletionLogprobs // and its logprobs
}

// tokens are the logprobs of the tokens that generated text (nil when
// they were not asked for).
func (c *textShape) tokens(text string, toks []genToken) *CompletionLogprobs {
	if !c.logprobs {
		return nil
	}
	lp := &CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TextOffset: []int{}}
	if c.top > 0 {
		lp.TopLogprobs = []map[string]float32{}
	}
	at := c.offset
	for _, t := range toks {
		if t.id < 0 {
			continue
		}
		lp.Tokens = append(lp.Tokens, string(c.tok.Piece(t.id)))
		lp.TokenLogprobs = append(lp.TokenLogprobs, t.logprob)
		lp.TextOffset = append(lp.TextOffset, at)
		at += utf8.RuneCountInString(t.text)
		if c.top > 0 {
			alts := make(map[string]float32, len(t.top))
			for _, a := range t.top {
				k := string(c.tok.Piece(a.Token))
				if _, dup := alts[k]; !dup {
					alts[k] = a.Logprob
				}
			}
			lp.TopLogprobs = append(lp.TopLogprobs, alts)
		}
	}
	c.offset += utf8.RuneCountInString(text)
	return lp
}

func (c *textShape) streamed(choice CompletionChoice) Completion {
	choice.Index = c.index
	return oneChoice(c.answer, "text_completion", choice)
}

func (c *textShape) first() any {
	if c.echo == "" {
		return nil
	}
	return c.streamed(CompletionChoice{Text: c.echo})
}

func (c *textShape) chunk(text string, toks []genToken) any {
	return c.streamed(CompletionChoice{Text: text, Logprobs: c.tokens(text, toks)})
}

func (c *textShape) add(text string, toks []genToken) {
	c.text.WriteString(text)
	if lp := c.tokens(text, toks); lp != nil {
		c.all.Tokens = append(c.all.Tokens, lp.Tokens...)
		c.all.TokenLogprobs = append(c.all.TokenLogprobs, lp.TokenLogprobs...)
		c.all.TopLogprobs = append(c.all.TopLogprobs, lp.TopLogprobs...)
		c.all.TextOffset = append(c.all.TextOffset, lp.TextOffset...)
	}
}

func (c *textShape) last(finish string) []any {
	return []any{c.streamed(CompletionChoice{FinishReason: &finish})}
}

func (c *textShape) usage(u Usage) any {
	return withUsage[CompletionChoice](c.answer, "text_completion", u)
}

func (c *textShape) whole(finish string, u Usage) any {
	return withUsage(c.answer, "text_completion", u, CompletionChoice{Index: c.index, Text: c.text.String(), Logprobs: c.all, FinishReason: &finish})
}
