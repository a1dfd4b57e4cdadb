package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"shoal/serve"
)

// sse writes a Server-Sent Events stream: one "data: JSON" event per chunk
// and "data: [DONE]" at the end.
type sse struct {
	x   *exchange
	rc  *http.ResponseController
	buf bytes.Buffer
	err error
}

func newSSE(x *exchange) *sse {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	x.w.WriteHeader(http.StatusOK)
	x.status = http.StatusOK
	s := &sse{x: x, rc: http.NewResponseController(x.w)}
	s.flush()
	return s
}

func (s *sse) flush() {
	if s.err == nil {
		if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			s.err = err
		}
	}
}

func (s *sse) write(data []byte) error {
	if s.err != nil {
		return s.err
	}
	s.buf.Reset()
	s.buf.WriteString("data: ")
	s.buf.Write(data)
	s.buf.WriteString("\n\n")
	if _, err := s.x.w.Write(s.buf.Bytes()); err != nil {
		s.err = err
		return err
	}
	s.flush()
	return s.err
}

func (s *sse) send(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	return s.write(bytes.TrimRight(b.Bytes(), "\n"))
}

func (s *sse) done() { _ = s.write([]byte("[DONE]")) }

// fail ends a stream whose generation failed with an error event, unless
// the client is gone.
func (s *sse) fail(err error) {
	if s.x.r.Context().Err() != nil || errors.Is(err, context.Canceled) {
		return
	}
	e := &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "generation failed: " + err.Error()}
	if errors.Is(err, serve.ErrClosed) {
		e = &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "unavailable", msg: "generation stopped: " + err.Error()}
	}
	_ = s.send(e.body())
}
