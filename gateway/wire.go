package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"shoal/api/openai"
)

// The wire format, one transport.KindGateway stream per call:
//
//	front → driver: one request frame (JSON Request, v 1, at most
//	                MaxRequestFrame bytes), then FIN
//	driver → front, op "generate": a head frame (JSON Head: the refusal,
//	                or the model's capacity and vocabulary digest), then
//	                one frame per event (JSON wireEvent), the last one
//	                Done; then FIN
//	driver → front, op "vocab": a head frame (JSON Head with the size of
//	                the vocabulary), then the vocabulary as a
//	                metadata-only GGUF in frames of at most vocabChunk
//	                bytes, then FIN
//
// A generation stops when the front resets the stream (or its connection
// closes). A stream that ends before the Done event was cut: the front
// may send the same state (the prompt, the tokens generated so far) again.
const (
	wireVersion = 1
	// MaxRequestFrame bounds a request frame: a prompt of 128k tokens and
	// a grammar of 256 KiB fit with room to spare.
	MaxRequestFrame = 4 << 20
	// maxTokens bounds the prompt plus the generated tokens of a request.
	maxTokens = 1 << 20
	// maxGrammar bounds a constraint's grammar, prefix and trigger.
	maxGrammar = 1 << 20
	maxTop     = 20
	maxModel   = 256
	// maxHead bounds a head frame, maxEvent an event frame.
	maxHead  = 64 << 10
	maxEvent = 64 << 10
	// vocabChunk is the largest frame of a vocabulary; maxVocab bounds
	// the whole.
	vocabChunk = 1 << 20
	maxVocab   = 64 << 20
)

// Ops of a request.
const (
	OpGenerate = "generate"
	OpVocab    = "vocab"
)

// Request is a generation as it travels to a driver: the tokens, not the
// HTTP request they came from.
type Request struct {
	V     int    `json:"v"`
	Op    string `json:"op"`
	Model string `json:"model"`
	// Vocab is the digest of the vocabulary the front tokenized with
	// (empty: unchecked); a driver with another refuses the request.
	Vocab  string  `json:"vocab,omitempty"`
	Prompt []int32 `json:"prompt,omitempty"`
	// Generated are the tokens an earlier driver produced: the driver
	// continues after them.
	Generated   []int32         `json:"generated,omitempty"`
	MaxTokens   int             `json:"max_tokens,omitempty"` // of the whole generation, Generated included
	Sampling    openai.Sampling `json:"sampling"`
	Logprobs    bool            `json:"logprobs,omitempty"`
	TopLogprobs int             `json:"top_logprobs,omitempty"`
	Constraint  *Constraint     `json:"constraint,omitempty"`
}

// Constraint is an openai.ConstraintSpec on the wire.
type Constraint struct {
	Grammar string `json:"grammar"`
	Prefix  []byte `json:"prefix,omitempty"`
	Trigger string `json:"trigger,omitempty"`
}

// ParseRequest decodes and checks a request frame.
func ParseRequest(b []byte) (Request, error) {
	var r Request
	if len(b) > MaxRequestFrame {
		return r, fmt.Errorf("request frame of %d bytes, limit %d", len(b), MaxRequestFrame)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Request{}, fmt.Errorf("malformed request frame: %v", err)
	}
	return r, r.check()
}

func (r *Request) check() error {
	switch {
	case r.V != wireVersion:
		return fmt.Errorf("request of version %d, want %d", r.V, wireVersion)
	case r.Op != OpGenerate && r.Op != OpVocab:
		return fmt.Errorf("unknown op %q", r.Op)
	case r.Model == "" || len(r.Model) > maxModel:
		return fmt.Errorf("model name of %d bytes (1 to %d)", len(r.Model), maxModel)
	case r.Op == OpVocab:
		return nil
	case len(r.Prompt) == 0:
		return errors.New("empty prompt")
	case len(r.Prompt)+len(r.Generated) > maxTokens:
		return fmt.Errorf("%d tokens, limit %d", len(r.Prompt)+len(r.Generated), maxTokens)
	case r.MaxTokens < 0 || r.MaxTokens > 0 && r.MaxTokens <= len(r.Generated):
		return fmt.Errorf("max_tokens %d with %d generated", r.MaxTokens, len(r.Generated))
	case r.TopLogprobs < 0 || r.TopLogprobs > maxTop:
		return fmt.Errorf("top_logprobs %d (0 to %d)", r.TopLogprobs, maxTop)
	}
	for _, ids := range [][]int32{r.Prompt, r.Generated} {
		for _, id := range ids {
			if id < 0 {
				return fmt.Errorf("negative token id %d", id)
			}
		}
	}
	if c := r.Constraint; c != nil && (c.Grammar == "" || len(c.Grammar)+len(c.Prefix)+len(c.Trigger) > maxGrammar) {
		return fmt.Errorf("constraint of %d bytes (a grammar, at most %d)", len(c.Grammar)+len(c.Prefix)+len(c.Trigger), maxGrammar)
	}
	return nil
}

// Head opens a driver's answer.
type Head struct {
	V   int        `json:"v"`
	Err *wireError `json:"err,omitempty"`
	// Capacity is the model's longest sequence; Vocab its vocabulary's
	// digest (op generate).
	Capacity int    `json:"capacity,omitempty"`
	Vocab    string `json:"vocab,omitempty"`
	// Size is the vocabulary's size in bytes (op vocab).
	Size int `json:"size,omitempty"`
}

// wireEvent is an openai.Event on the wire.
type wireEvent struct {
	Token     int32      `json:"t"`
	Logprob   float32    `json:"lp,omitempty"`
	Top       []wireCand `json:"top,omitempty"`
	Done      bool       `json:"done,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Err       *wireError `json:"err,omitempty"`
	Generated int        `json:"gen,omitempty"` // counting the request's Generated
	Cached    int        `json:"cached,omitempty"`
	Drafted   int        `json:"drafted,omitempty"` // speculative decoding's drafts, on the final event
	Accepted  int        `json:"accepted,omitempty"`
	Draws     uint64     `json:"draws,omitempty"` // the sampler's random draws after the token
}

type wireCand struct {
	Token   int32   `json:"t"`
	Logprob float32 `json:"lp"`
}

// wireError is an error with its class, so that the front answers it as
// the driver's endpoint would have.
type wireError struct {
	Class  string `json:"class,omitempty"`
	Status int    `json:"status,omitempty"` // its HTTPStatus(), if it had one
	Msg    string `json:"msg"`
}

// Error classes: the openai errors a Submitter wraps, and the driver's
// own refusals.
const (
	classQueueFull  = "queue_full"
	classTooLong    = "too_long"
	classBadInput   = "bad_input"
	classClosed     = "closed"
	classNotServing = "not_serving"
	classNoModel    = "no_model"
	classVocab      = "vocab"
)

var classes = []struct {
	name string
	err  error
}{
	{classQueueFull, openai.ErrQueueFull},
	{classTooLong, openai.ErrTooLong},
	{classBadInput, openai.ErrBadInput},
	{classClosed, openai.ErrClosed},
	{classNotServing, openai.ErrNotServing},
}

// toWire gives err its class for the wire.
func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	if we, ok := err.(*Error); ok {
		return &wireError{Class: we.Class, Status: we.Status, Msg: we.Msg}
	}
	w := &wireError{Msg: err.Error()}
	for _, c := range classes {
		if errors.Is(err, c.err) {
			w.Class = c.name
			break
		}
	}
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) {
		w.Status = hs.HTTPStatus()
	}
	return w
}

// Error is an error a driver answered. It unwraps to the openai error of
// its class, so the front's endpoint answers it as the driver's would.
type Error struct {
	Class  string
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap is the openai error of the class (nil when none).
func (e *Error) Unwrap() error {
	for _, c := range classes {
		if c.name == e.Class {
			return c.err
		}
	}
	return nil
}

// HTTPStatus is the status the driver gave the error, or the one its
// class means (404 for an unknown model, 503 for another vocabulary, 502
// otherwise).
func (e *Error) HTTPStatus() int {
	switch {
	case e.Status != 0:
		return e.Status
	case e.Class == classNoModel:
		return http.StatusNotFound
	case e.Class == classVocab || e.Class == classClosed || e.Class == classNotServing:
		return http.StatusServiceUnavailable
	case e.Class == classQueueFull:
		return http.StatusTooManyRequests
	case e.Class == classTooLong || e.Class == classBadInput:
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}

func (w *wireError) err() error {
	if w == nil {
		return nil
	}
	return &Error{Class: w.Class, Status: w.Status, Msg: w.Msg}
}
