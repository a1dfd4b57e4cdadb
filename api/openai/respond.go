package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"
)

// shape is how one endpoint's answers look.
type shape interface {
	// first is streamed before the first token (nil: nothing).
	first() any
	// chunk is the streamed event for text and the tokens it covers (nil:
	// nothing to send yet).
	chunk(text string, toks []genToken) any
	// add collects text and its tokens for the answer that is not
	// streamed.
	add(text string, toks []genToken)
	// last are the last streamed events: what was held back, and the
	// finish reason.
	last(finish string) []any
	// usage is the last streamed event when the usage was asked for.
	usage(u Usage) any
	// whole is the answer that is not streamed.
	whole(finish string, u Usage) any
}

// respond submits the request and answers it in the shapes of its choices
// (one per choice, r.n of them), as one JSON object or as Server-Sent
// Events. Choice 0 starts first; the others are submitted once its prompt
// is in the KV cache (its first token), so that they read the prompt's
// blocks from the prefix cache instead of computing them again.
func (h *handler) respond(x *exchange, r *genRequest, shapes []shape) *apiError {
	g0, e := h.start(x, r, 0)
	if e != nil {
		return e
	}
	defer g0.stream.Cancel()
	gens := []*generation{g0}
	var sw *sse
	if r.stream {
		sw = newSSE(x, h.o.StreamWriteTimeout, h.o.StreamKeepAlive)
		defer sw.end()
	}
	// send emits choice i's text: collected, or streamed.
	send := func(i int) func(string, []genToken) error {
		return func(s string, toks []genToken) error {
			if sw == nil {
				shapes[i].add(s, toks)
				return nil
			}
			if c := shapes[i].chunk(s, toks); c != nil {
				return sw.send(c)
			}
			return nil
		}
	}
	if sw != nil {
		if c := shapes[0].first(); c != nil && sw.send(c) != nil {
			return nil
		}
	}
	results := make([]genResult, len(shapes))
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		emit := send(0)
		results[0] = g0.run(func(s string, toks []genToken) error {
			once.Do(func() { close(started) })
			return emit(s, toks)
		})
		once.Do(func() { close(started) })
	}()
	var startErr *apiError
	if len(shapes) > 1 {
		<-started
		for i := 1; i < len(shapes); i++ {
			g, e := h.start(x, r, i)
			if e != nil {
				startErr = e
				break
			}
			defer g.stream.Cancel()
			gens = append(gens, g)
			if sw != nil {
				if c := shapes[i].first(); c != nil && sw.send(c) != nil {
					break
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = g.run(send(i))
			}()
		}
		if startErr != nil {
			for _, g := range gens {
				g.stream.Cancel()
			}
		}
	}
	wg.Wait()
	for i, g := range gens[1:] {
		x.rec.GeneratedTokens += g.rec.GeneratedTokens
		results[0].generated += results[i+1].generated
	}
	var err error
	for _, res := range results[:len(gens)] {
		if res.err != nil {
			err = res.err
			break
		}
	}
	if startErr != nil && err == nil {
		err = errors.New(startErr.msg)
	}
	u := g0.usage(results[0])
	if sw == nil {
		if startErr != nil {
			return startErr
		}
		if err != nil {
			return generationError(x, err)
		}
		wholes := make([]any, len(shapes))
		for i, sh := range shapes {
			wholes[i] = sh.whole(results[i].finish, u)
		}
		x.ok(merge(wholes))
		return nil
	}
	if err != nil {
		sw.fail(err)
		return nil
	}
	for i, sh := range shapes {
		for _, ev := range sh.last(results[i].finish) {
			if sw.send(ev) != nil {
				return nil
			}
		}
	}
	if r.usage && sw.send(shapes[0].usage(u)) != nil {
		return nil
	}
	sw.done()
	return nil
}

// merge joins the answers of n choices into one: the first's envelope and
// usage with every choice.
func merge(wholes []any) any {
	switch w := wholes[0].(type) {
	case ChatCompletion:
		for _, o := range wholes[1:] {
			w.Choices = append(w.Choices, o.(ChatCompletion).Choices...)
		}
		return w
	case Completion:
		for _, o := range wholes[1:] {
			w.Choices = append(w.Choices, o.(Completion).Choices...)
		}
		return w
	}
	return wholes[0]
}

// answer is what the answers of one request share: the envelope, and the
// usage every streamed chunk but the last carries when the last one
// carries the usage (null; absent otherwise).
type answer struct {
	env       Envelope
	chunkNull json.RawMessage
	index     int // the choice's
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
