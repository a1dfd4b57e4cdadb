package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// shape is how one endpoint's answers look.
type shape interface {
	// first is streamed before the first token (nil: nothing).
	first() any
	// chunk is the streamed event for text and the tokens it covers.
	chunk(text string, toks []genToken) any
	// add collects text and its tokens for the answer that is not
	// streamed.
	add(text string, toks []genToken)
	// last is the streamed event with the finish reason.
	last(finish string) any
	// usage is the last streamed event when the usage was asked for.
	usage(u Usage) any
	// whole is the answer that is not streamed.
	whole(finish string, u Usage) any
}

// respond submits the request and answers it in sh's shape, as one JSON
// object or as Server-Sent Events.
func (h *handler) respond(x *exchange, r *genRequest, sh shape) *apiError {
	g, e := h.start(x, r)
	if e != nil {
		return e
	}
	defer g.stream.Cancel()
	if !r.stream {
		res := g.run(func(s string, toks []genToken) error {
			sh.add(s, toks)
			return nil
		})
		if res.err != nil {
			return generationError(x, res.err)
		}
		x.ok(sh.whole(res.finish, g.usage(res)))
		return nil
	}
	sw := newSSE(x, h.o.StreamWriteTimeout, h.o.StreamKeepAlive)
	defer sw.end()
	if c := sh.first(); c != nil && sw.send(c) != nil {
		return nil
	}
	res := g.run(func(s string, toks []genToken) error { return sw.send(sh.chunk(s, toks)) })
	if res.err != nil {
		sw.fail(res.err)
		return nil
	}
	if sw.send(sh.last(res.finish)) != nil {
		return nil
	}
	if r.usage && sw.send(sh.usage(g.usage(res))) != nil {
		return nil
	}
	sw.done()
	return nil
}

// answer is what the answers of one request share: the envelope, and the
// usage every streamed chunk but the last carries when the last one
// carries the usage (null; absent otherwise).
type answer struct {
	env       Envelope
	chunkNull json.RawMessage
}

func (h *handler) newAnswer(r *genRequest, idPrefix string) answer {
	a := answer{env: Envelope{ID: newID(idPrefix), Created: time.Now().Unix(), Model: r.model.Name, SystemFingerprint: h.o.SystemFingerprint}}
	if r.usage {
		a.chunkNull = json.RawMessage("null")
	}
	return a
}

// as returns the envelope of an answer of the given object type.
func (a answer) as(object string) Envelope {
	e := a.env
	e.Object = object
	return e
}

// oneChoice is a streamed event with one choice.
func oneChoice[C any](a answer, object string, choice C) Chunk[C] {
	return Chunk[C]{Envelope: a.as(object), Choices: []C{choice}, Usage: a.chunkNull}
}

// withUsage is an answer that carries the usage, with choices (none for
// the last streamed event).
func withUsage[C any](a answer, object string, u Usage, choices ...C) Chunk[C] {
	b, _ := json.Marshal(u)
	return Chunk[C]{Envelope: a.as(object), Choices: append([]C{}, choices...), Usage: b}
}

// generationError answers a non-streamed request whose generation failed.
func generationError(x *exchange, err error) *apiError {
	if x.r.Context().Err() != nil {
		// The client went away: nobody reads the answer. 499 is what
		// proxies log for this.
		x.status = 499
		return nil
	}
	return failedGeneration(err)
}

// failedGeneration is the error answer for a generation that failed.
func failedGeneration(err error) *apiError {
	if errors.Is(err, ErrClosed) {
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "unavailable", msg: "generation stopped: " + err.Error()}
	}
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "generation failed: " + err.Error()}
}
