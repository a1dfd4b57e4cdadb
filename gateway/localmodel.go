package gateway

import (
	"context"
	"errors"
	"time"

	"shoal/api/openai"
	"shoal/engine/sample"
	"shoal/engine/tokenizer"
	"shoal/serve"
)

// NewOpenAIModel is a model for the OpenAI endpoint that runs on sched,
// with tok's vocabulary and chatTemplate (the GGUF's
// tokenizer.chat_template, "" when it has none).
func NewOpenAIModel(name, owner string, sched *serve.Scheduler, tok *tokenizer.Tokenizer, chatTemplate string) *openai.Model {
	return &openai.Model{Name: name, Tokenizer: newOpenAITokenizer(tok, chatTemplate), Submitter: schedSubmitter{sched},
		Constrainer: newConstrainer(tok), Created: time.Now(), OwnedBy: owner}
}

// OpenAIVocab is tok's vocabulary and chatTemplate as the endpoint sees
// them: the tokenizer, and the constrainer that compiles grammars for it.
// The gateway builds a model another agent drives from them.
func OpenAIVocab(tok *tokenizer.Tokenizer, chatTemplate string) (openai.Tokenizer, openai.Constrainer) {
	return newOpenAITokenizer(tok, chatTemplate), newConstrainer(tok)
}

// SchedulerOf returns the scheduler m runs on (nil if none).
func SchedulerOf(m *openai.Model) *serve.Scheduler {
	if s, ok := m.Submitter.(schedSubmitter); ok {
		return s.s
	}
	return nil
}

// openAITokenizer is a tokenizer and chat template as the endpoint sees
// them: the control tokens that mark tool calls (openai.ToolCallMarkers)
// are rendered as their text, in pieces and in generated text, for the
// endpoint to read and constrain the calls.
type openAITokenizer struct {
	t        *tokenizer.Tokenizer
	template string
	marks    map[int32]string
}

func newOpenAITokenizer(t *tokenizer.Tokenizer, template string) openAITokenizer {
	return openAITokenizer{t, template, toolMarks(t)}
}

// toolMarks are t's control tokens that mark tool calls, by id, with
// their texts (nil when it has none).
func toolMarks(t *tokenizer.Tokenizer) map[int32]string {
	var m map[int32]string
	for _, s := range openai.ToolCallMarkers() {
		if id, ok := t.TokenID(s); ok && t.IsControl(id) && !t.IsEOG(id) {
			if m == nil {
				m = map[int32]string{}
			}
			m[id] = s
		}
	}
	return m
}

// markDecoder renders the tool-call markers among generated tokens.
type markDecoder struct {
	d     *tokenizer.Decoder
	marks map[int32]string
}

func (d markDecoder) Add(id int32) string {
	if s, ok := d.marks[id]; ok {
		return d.d.Flush() + s
	}
	return d.d.Add(id)
}

func (d markDecoder) Flush() string { return d.d.Flush() }

func (o openAITokenizer) Encode(text string, addSpecial bool) []int32 {
	return o.t.Encode(text, addSpecial, true)
}

func (o openAITokenizer) Decode(ids []int32) string { return o.t.Detokenize(ids, false, false) }
func (o openAITokenizer) Piece(id int32) []byte {
	if s, ok := o.marks[id]; ok {
		return []byte(s)
	}
	return o.t.Piece(id)
}

func (o openAITokenizer) NewDecoder() openai.Decoder {
	if len(o.marks) > 0 {
		return markDecoder{o.t.NewContinuationDecoder(), o.marks}
	}
	return o.t.NewContinuationDecoder()
}

func (o openAITokenizer) NVocab() int          { return o.t.NVocab() }
func (o openAITokenizer) ChatTemplate() string { return o.template }

func (o openAITokenizer) Specials() openai.Specials {
	sp := openai.Specials{BOSID: o.t.BOS(), AddBOS: o.t.AddBOS() && o.t.BOS() != tokenizer.NoToken}
	if o.t.BOS() != tokenizer.NoToken {
		sp.BOS = o.t.Token(o.t.BOS())
	}
	if o.t.EOS() != tokenizer.NoToken {
		sp.EOS = o.t.Token(o.t.EOS())
	}
	return sp
}

// schedSubmitter runs the endpoint's requests on a local scheduler.
type schedSubmitter struct{ s *serve.Scheduler }

func (s schedSubmitter) Capacity() int { return s.s.Capacity() }

func (s schedSubmitter) Submit(ctx context.Context, req openai.Request) (openai.Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	// openai.Sampling has sample.Params' fields: the conversion stops
	// compiling when they part.
	ch, err := s.s.Submit(ctx, serve.Request{Prompt: req.Prompt, MaxTokens: req.MaxTokens, Sampling: sample.Params(req.Sampling),
		Logprobs: req.Logprobs, TopLogprobs: req.TopLogprobs, Constraint: req.Constraint})
	if err != nil {
		cancel()
		return nil, classifyServeError(err)
	}
	return &schedStream{ctx: ctx, cancel: cancel, ch: ch}, nil
}

// schedStream reads a scheduler's events.
type schedStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	ch     <-chan serve.Event
}

var errNoFinalEvent = errors.New("the generation ended without a final event")

func (s *schedStream) Cancel() { s.cancel() }

func (s *schedStream) Next() (openai.Event, error) {
	var ev serve.Event
	var ok bool
	select {
	case ev, ok = <-s.ch:
	case <-s.ctx.Done():
		return openai.Event{}, s.ctx.Err()
	}
	if !ok {
		return openai.Event{}, errNoFinalEvent
	}
	out := openai.Event{Token: ev.Token, Logprob: ev.Logprob, Done: ev.Done, Reason: ev.Reason, Generated: ev.Generated, Cached: ev.Cached,
		Draws: ev.Draws, Drafted: ev.Drafted, Accepted: ev.Accepted}
	if ev.Err != nil {
		out.Err = classifyServeError(ev.Err)
	}
	for _, t := range ev.Top {
		out.Top = append(out.Top, openai.Candidate{Token: t.Token, Logprob: t.Logprob})
	}
	return out, nil
}

// serveErrorClasses are the endpoint's classes of the scheduler's errors.
var serveErrorClasses = []struct{ serve, class error }{
	{serve.ErrQueueFull, openai.ErrQueueFull},
	{serve.ErrTooLong, openai.ErrTooLong},
	{serve.ErrBadInput, openai.ErrBadInput},
	{serve.ErrClosed, openai.ErrClosed},
}

// classifyServeError gives a scheduler error the endpoint's class, keeping
// its message.
func classifyServeError(err error) error {
	for _, c := range serveErrorClasses {
		if errors.Is(err, c.serve) {
			return classifiedError{err: err, class: c.class}
		}
	}
	return err
}

type classifiedError struct{ err, class error }

func (e classifiedError) Error() string   { return e.err.Error() }
func (e classifiedError) Unwrap() []error { return []error{e.class, e.err} }
