package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// sse writes a Server-Sent Events stream: one "data: JSON" event per chunk
// and "data: [DONE]" at the end.
type sse struct {
	x       *exchange
	rc      *http.ResponseController
	timeout time.Duration
	buf     bytes.Buffer
	err     error
}

// newSSE starts the stream. Each event must be written within timeout (a
// client that stops reading without disconnecting cannot hold the handler
// forever); end clears the deadline for the connection's next request.
func newSSE(x *exchange, timeout time.Duration) *sse {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	x.w.WriteHeader(http.StatusOK)
	x.status = http.StatusOK
	s := &sse{x: x, rc: http.NewResponseController(x.w), timeout: timeout}
	s.deadline(time.Now().Add(timeout))
	s.flush()
	return s
}

func (s *sse) deadline(t time.Time) {
	if err := s.rc.SetWriteDeadline(t); err != nil && !errors.Is(err, http.ErrNotSupported) && s.err == nil {
		s.err = err
	}
}

// end clears the write deadline.
func (s *sse) end() { _ = s.rc.SetWriteDeadline(time.Time{}) }

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
	s.deadline(time.Now().Add(s.timeout))
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
	_ = s.send(failedGeneration(err).body())
}
