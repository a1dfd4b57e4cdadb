package openai

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"time"
)

const maxStops = 4

// floatParam is a number a request may set, its range and where it goes.
type floatParam struct {
	name   string
	v      *float64
	lo, hi float64 // hi = +Inf: no upper bound
	dst    *float32
}

// set checks the value and stores it.
func (f floatParam) set() *apiError {
	if f.v == nil {
		return nil
	}
	v := *f.v
	if math.IsNaN(v) || math.IsInf(v, 0) || v < f.lo || v > f.hi {
		if math.IsInf(f.hi, 1) {
			return badRequest(f.name, "%s must be >= %v, got %v", f.name, f.lo, v)
		}
		return badRequest(f.name, "%s must be between %v and %v, got %v", f.name, f.lo, f.hi, v)
	}
	*f.dst = float32(v)
	return nil
}

// setAll sets the parameters in order and stops at the first bad one.
func setAll(params ...floatParam) *apiError {
	for _, f := range params {
		if e := f.set(); e != nil {
			return e
		}
	}
	return nil
}

// sampling validates the request's parameters and returns the sampler
// settings and the stop strings.
func (h *handler) sampling(s *GenerationParams) (Sampling, []string, *apiError) {
	p := h.base
	if e := setAll(floatParam{"temperature", s.Temperature, 0, 2, &p.Temperature}, floatParam{"top_p", s.TopP, 0, 1, &p.TopP},
		floatParam{"presence_penalty", s.PresencePenalty, -2, 2, &p.PresencePenalty},
		floatParam{"frequency_penalty", s.FrequencyPenalty, -2, 2, &p.FrequencyPenalty}); e != nil {
		return p, nil, e
	}
	if s.TopP != nil && *s.TopP == 0 {
		p.Temperature = 0 // nothing but the most likely token
	}
	if v := s.TopK; v != nil {
		if *v < 0 {
			return p, nil, badRequest("top_k", "top_k must be >= 0 (0 disables), got %d", *v)
		}
		p.TopK = *v
	}
	if e := setAll(floatParam{"min_p", s.MinP, 0, 1, &p.MinP}, floatParam{"repeat_penalty", s.RepeatPenalty, 0, math.Inf(1), &p.RepeatPenalty}); e != nil {
		return p, nil, e
	}
	if (p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepeatPenalty != 0 && p.RepeatPenalty != 1)) && p.RepeatLastN == 0 {
		p.RepeatLastN = 64
	}
	if s.Seed != nil {
		p.Seed = uint64(*s.Seed)
	} else {
		p.Seed = rand.Uint64()
	}
	if len(s.Stop) > maxStops {
		return p, nil, badRequest("stop", "stop has %d sequences; at most %d are allowed", len(s.Stop), maxStops)
	}
	var stops []string
	for _, st := range s.Stop {
		if st != "" {
			stops = append(stops, st)
		}
	}
	return p, stops, nil
}

// genToken is a generated token with the text attributed to it.
type genToken struct {
	id      int32
	text    string
	logprob float32
	top     []Candidate
}

// generation is a submitted request whose events are being read.
type generation struct {
	x      *exchange
	rec    *Record // the exchange's record (choice 0) or a private one
	stream Stream
	tok    Tokenizer
	stops  []string
	prompt int
}

// genResult is how a generation ended.
type genResult struct {
	finish    string // "stop" or "length"; "" when it failed
	generated int
	cached    int   // prompt tokens read from the prefix cache
	drafted   int   // tokens drafted by speculative decoding
	accepted  int   // of which the model accepted
	err       error // the client went away, the engine failed, or a write failed
}

// usage is the token accounting of a finished generation.
func (g *generation) usage(res genResult) Usage {
	u := Usage{PromptTokens: g.prompt, CompletionTokens: res.generated, TotalTokens: g.prompt + res.generated,
		PromptTokensDetails: PromptTokensDetails{CachedTokens: res.cached}}
	if res.drafted > 0 {
		u.CompletionTokensDetails = &CompletionTokensDetails{AcceptedPredictionTokens: res.accepted, RejectedPredictionTokens: res.drafted - res.accepted}
	}
	return u
}

// start submits the request (choice i of its n: a constraint of its own,
// and the seed plus i so that the choices differ). Errors come back in the
// OpenAI shape.
func (h *handler) start(x *exchange, r *genRequest, i int) (*generation, *apiError) {
	sub := r.model.Submitter
	if sub == nil {
		return nil, submitError(ErrNotServing, "model")
	}
	x.rec.PromptTokens = len(r.gen.Prompt)
	if c := sub.Capacity(); len(r.gen.Prompt) >= c {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: r.param, code: "context_length_exceeded",
			msg: fmt.Sprintf("This model's maximum context length is %d tokens, and your prompt has %d tokens (the prompt plus at least one generated token must fit).", c, len(r.gen.Prompt))}
	}
	req := r.gen
	req.Sampling.Seed += uint64(i)
	if r.constrain != nil {
		c, e := r.constrain()
		if e != nil {
			return nil, e
		}
		req.Constraint = c
	}
	st, err := sub.Submit(x.r.Context(), req)
	if err != nil {
		return nil, submitError(err, r.param)
	}
	g := &generation{x: x, rec: &x.rec, stream: st, tok: r.model.Tokenizer, stops: r.stops, prompt: len(r.gen.Prompt)}
	if i > 0 {
		g.rec = &Record{}
	}
	return g, nil
}

// run reads the events, applies the stop strings to the detokenized text
// and calls emit with each piece of final text and the tokens it covers
// (a token's text is cut where a stop string begins; the stop string is
// never emitted). Text that might be the start of a stop string is held
// back until it is known not to be.
func (g *generation) run(emit func(text string, toks []genToken) error) genResult {
	defer g.stream.Cancel()
	dec := g.tok.NewDecoder()
	f := &stopFilter{stops: g.stops, emit: emit}
	var (
		received int
		last     time.Time
	)
	rec := g.rec
	for {
		ev, err := g.stream.Next()
		if err != nil {
			rec.FinishReason = "error"
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				rec.FinishReason = "cancelled"
				rec.GeneratedTokens = received
			}
			return genResult{generated: received, err: err}
		}
		if ev.Done {
			return g.end(ev, max(ev.Generated, received), dec, f)
		}
		now := time.Now()
		if received == 0 {
			rec.TTFT = now.Sub(g.x.start)
		} else {
			rec.InterToken = append(rec.InterToken, now.Sub(last))
		}
		last = now
		received++
		f.pend = append(f.pend, genToken{id: ev.Token, text: dec.Add(ev.Token), logprob: ev.Logprob, top: ev.Top})
		stopped, err := f.settle(false)
		if err != nil {
			rec.FinishReason = "cancelled"
			rec.GeneratedTokens = received
			return genResult{generated: received, err: err}
		}
		if stopped {
			// Cancelling frees the sequence's KV blocks at once.
			g.stream.Cancel()
			rec.FinishReason = "stop"
			rec.GeneratedTokens = received
			return genResult{finish: "stop", generated: received}
		}
	}
}

// end reads the final event of a generation that generated gen tokens.
func (g *generation) end(ev Event, gen int, dec Decoder, f *stopFilter) genResult {
	rec := g.rec
	rec.GeneratedTokens = gen
	switch ev.Reason {
	case "stop", "length":
		if rest := dec.Flush(); rest != "" {
			f.pend = append(f.pend, genToken{id: -1, text: rest})
		}
		stopped, err := f.settle(true)
		if err != nil {
			rec.FinishReason = "cancelled"
			return genResult{generated: gen, err: err}
		}
		reason := ev.Reason
		if stopped {
			reason = "stop"
		}
		rec.FinishReason = reason
		return genResult{finish: reason, generated: gen, cached: ev.Cached, drafted: ev.Drafted, accepted: ev.Accepted}
	case "cancelled":
		rec.FinishReason = "cancelled"
		err := ev.Err
		if err == nil {
			err = context.Canceled
		}
		return genResult{generated: gen, err: err}
	}
	rec.FinishReason = "error"
	err := ev.Err
	if err == nil {
		err = errors.New("the generation failed")
	}
	return genResult{generated: gen, err: err}
}

// tokenBytes returns a token's bytes as the ints the logprobs shapes use.
func tokenBytes(p []byte) []int {
	out := make([]int, len(p))
	for i, b := range p {
		out[i] = int(b)
	}
	return out
}
