package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"
)

// keepaliveComment is the SSE comment written when a stream has been idle
// for the keepalive interval; clients ignore it, proxies see traffic.
const keepaliveComment = ": keepalive\n\n"

// sse writes a Server-Sent Events stream: one "data: JSON" event per chunk
// and "data: [DONE]" at the end, with a keepalive comment whenever no event
// was written for a while (a replay or a long prefill).
type sse struct {
	x       *exchange
	rc      *http.ResponseController
	timeout time.Duration

	mu   sync.Mutex // one writer at a time: the generation or the keepalive
	buf  bytes.Buffer
	err  error
	last time.Time // when something was last written

	stop chan struct{} // closed by end: the keepalive goroutine returns
	quit sync.WaitGroup
}

// newSSE starts the stream. Each event must be written within timeout (a
// client that stops reading without disconnecting cannot hold the handler
// forever); a keepalive comment is written after every idle interval
// (<= 0: none). end stops the keepalives and clears the deadline for the
// connection's next request.
func newSSE(x *exchange, timeout, interval time.Duration) *sse {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	x.w.WriteHeader(http.StatusOK)
	x.status = http.StatusOK
	s := &sse{x: x, rc: http.NewResponseController(x.w), timeout: timeout, stop: make(chan struct{})}
	s.deadline(time.Now().Add(timeout))
	s.flush()
	s.last = time.Now()
	if interval > 0 {
		s.quit.Add(1)
		go s.keepalive(interval)
	}
	return s
}

// keepalive writes a comment whenever the stream was idle for interval.
func (s *sse) keepalive(interval time.Duration) {
	defer s.quit.Done()
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		idle := time.Since(s.last)
		if idle >= interval && s.err == nil {
			s.writeLocked([]byte(keepaliveComment))
			idle = 0
		}
		s.mu.Unlock()
		t.Reset(interval - idle)
	}
}

func (s *sse) deadline(t time.Time) {
	if err := s.rc.SetWriteDeadline(t); err != nil && !errors.Is(err, http.ErrNotSupported) && s.err == nil {
		s.err = err
	}
}

// end stops the keepalives and clears the write deadline.
func (s *sse) end() {
	close(s.stop)
	s.quit.Wait()
	_ = s.rc.SetWriteDeadline(time.Time{})
}

func (s *sse) flush() {
	if s.err == nil {
		if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			s.err = err
		}
	}
}

func (s *sse) write(data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.buf.Reset()
	s.buf.WriteString("data: ")
	s.buf.Write(data)
	s.buf.WriteString("\n\n")
	return s.writeLocked(s.buf.Bytes())
}

// writeLocked writes p and flushes it; s.mu is held.
func (s *sse) writeLocked(p []byte) error {
	if s.err != nil {
		return s.err
	}
	s.deadline(time.Now().Add(s.timeout))
	s.last = time.Now()
	if _, err := s.x.w.Write(p); err != nil {
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
// the client is gone. A generation the server cancelled (its engine
// stopped) ends with an error event too: a stream that just stops would
// look whole to the client.
func (s *sse) fail(err error) {
	if s.x.r.Context().Err() != nil {
		return
	}
	_ = s.send(failedGeneration(err).body())
}
