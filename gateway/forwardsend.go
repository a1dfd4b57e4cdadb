package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"shoal/transport"
)

// A forwarded request travels on a transport.KindForward stream (mutual
// TLS between agents): the method, path, model name and header in the head
// frame, the raw body in the next; the answer streams back a frame per
// write, so server-sent events pass token by token.

// forwardTarget is the agent a request is passed to.
type forwardTarget struct {
	model string
	name  string // the agent's node name, for errors
	addr  string // its QUIC address
}

// maxBufferedAnswer bounds the answer that is not an event stream which
// send holds until it is whole, so that a cut one becomes a 502 and not a
// truncated 200; a larger one is passed on as it comes.
const maxBufferedAnswer = 16 << 20

// forwardResult is what transport.Forward returned.
type forwardResult struct {
	reply *transport.ForwardReply
	body  *transport.ForwardBody
	err   error
}

// send passes r, whose body is body, to the agent at to.addr and streams
// its answer to w; fail answers when that agent cannot be reached. A
// streamed completion (stream: the request asked for events) never goes
// silent: while the driver's answer has not
// begun, or between its events, an SSE keepalive comment goes out after
// every idle interval (the stream's head is sent here then, and an error
// the driver answers later becomes an error event). An answer that is cut
// ends with an error event, or, not streamed, with a 502 or 504.
func (f *Forwarder) send(w http.ResponseWriter, r *http.Request, to forwardTarget, body []byte, stream bool, fail func(w http.ResponseWriter, status int, code, msg string)) {
	h := passHeader(r.Header)
	h.Del("Authorization")
	h.Del("Cookie")
	head := transport.ForwardHead{Method: r.Method, Path: r.URL.RequestURI(), Model: to.model, Header: h}
	f.cfg.Log.Debug("forwarding request", zap.String("to", to.name), zap.String("path", r.URL.Path), zap.String("model", to.model))
	done := make(chan forwardResult, 1)
	go func() {
		reply, rb, err := transport.Forward(r.Context(), f.cfg.Endpoint, to.addr, head, body)
		done <- forwardResult{reply, rb, err}
	}()
	var ka *keepalive
	if interval := f.keepAliveInterval(); interval > 0 && stream {
		ka = &keepalive{w: w, rc: http.NewResponseController(w), interval: interval}
	}
	var res forwardResult
	if ka == nil {
		res = <-done
	} else {
		t := time.NewTimer(ka.interval)
		for waiting := true; waiting; {
			select {
			case res = <-done:
				waiting = false
			case <-t.C:
				ka.open(http.StatusOK) // the head goes out here: the client must hear something
				ka.comment()
				t.Reset(ka.interval)
			}
		}
		t.Stop()
	}
	if res.err != nil {
		status, code := http.StatusBadGateway, "upstream_unavailable"
		if timedOut(res.err) {
			status, code = http.StatusGatewayTimeout, "upstream_timeout"
		}
		msg := fmt.Sprintf("the agent serving model %s (%s) did not answer: %v", to.model, to.name, res.err)
		if ka != nil && ka.opened {
			ka.errorEvent(openAIErrorBody("server_error", code, msg))
			return
		}
		fail(w, status, code, msg)
		return
	}
	reply, rb := res.reply, res.body
	defer rb.Close()
	cut := func(err error) string {
		f.cfg.Log.Warn("forwarded answer cut", zap.String("from", to.name), zap.String("model", to.model), zap.Error(err))
		return fmt.Sprintf("the agent serving model %s (%s) stopped answering: %v", to.model, to.name, err)
	}
	if ka != nil && ka.opened && (reply.Status != http.StatusOK || !isEventStream(reply.Header)) {
		// The stream's head is out: the driver's refusal becomes an
		// error event.
		ka.errorEvent(refusalEvent(reply.Status, readAnswer(rb)))
		return
	}
	if !isEventStream(reply.Header) {
		f.relayWhole(w, r, reply, rb, func(err error) {
			status, code := http.StatusBadGateway, "upstream_unavailable"
			if timedOut(err) {
				status, code = http.StatusGatewayTimeout, "upstream_timeout"
			}
			fail(w, status, code, cut(err))
		})
		return
	}
	if ka == nil {
		ka = &keepalive{w: w, rc: http.NewResponseController(w)}
	}
	if !ka.opened {
		for k, v := range passHeader(reply.Header) {
			w.Header()[k] = v
		}
		ka.open(reply.Status)
	}
	chunks := make(chan forwardChunk)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			p, err := rb.Next()
			select {
			case chunks <- forwardChunk{p, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var tick <-chan time.Time
	if ka.interval > 0 {
		t := time.NewTicker(ka.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			if time.Since(ka.last) >= ka.interval && ka.atBoundary {
				ka.comment()
			}
			continue
		case c := <-chunks:
			if errors.Is(c.err, io.EOF) {
				if reply.Status == http.StatusOK && !ka.finished {
					// A driver of an older version ends a stream its
					// engine stopped without a word.
					ka.errorEvent(openAIErrorBody("server_error", "upstream_unavailable",
						fmt.Sprintf("the agent serving model %s (%s) ended the stream before the answer was complete", to.model, to.name)))
				}
				return
			}
			if c.err != nil {
				if r.Context().Err() != nil {
					return // the client went away
				}
				// Headers are out: end the event stream with an error event.
				ka.errorEvent(openAIErrorBody("server_error", "upstream_unavailable", cut(c.err)))
				return
			}
			if !ka.write(c.p) {
				return
			}
		}
	}
}

type forwardChunk struct {
	p   []byte
	err error
}

// relayWhole passes an answer that is not an event stream: held until it
// is whole (up to maxBufferedAnswer), so that a cut one is answered by
// cutFail instead, then passed on as it comes, the client's connection
// cut if it breaks after that.
func (f *Forwarder) relayWhole(w http.ResponseWriter, r *http.Request, reply *transport.ForwardReply, rb *transport.ForwardBody, cutFail func(error)) {
	var held bytes.Buffer
	whole := false
	for !whole && held.Len() <= maxBufferedAnswer {
		p, err := rb.Next()
		if errors.Is(err, io.EOF) {
			whole = true
			break
		}
		if err != nil {
			if r.Context().Err() == nil {
				cutFail(err)
			}
			return
		}
		held.Write(p)
	}
	for k, v := range passHeader(reply.Header) {
		w.Header()[k] = v
	}
	w.WriteHeader(reply.Status)
	if _, err := w.Write(held.Bytes()); err != nil || whole {
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for {
		p, err := rb.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			if r.Context().Err() != nil {
				return
			}
			panic(http.ErrAbortHandler) // cut the client's connection: a truncated answer must not look whole
		}
		if _, err := w.Write(p); err != nil {
			return
		}
		_ = rc.Flush()
	}
}
