package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"shoal/api/openai"
	"shoal/transport"
)

// keepalive writes a forwarded event stream to the client: the driver's
// bytes, and comments when it is idle.
type keepalive struct {
	w          http.ResponseWriter
	rc         *http.ResponseController
	interval   time.Duration
	opened     bool      // the stream's head is out
	last       time.Time // when something was last written
	atBoundary bool      // what was written so far ends between two events
	finished   bool      // the last event was [DONE] or an error
	failed     bool
}

// note remembers whether the last event in p ends the stream.
func (k *keepalive) note(p []byte) {
	for len(p) > 0 {
		line, rest, _ := bytes.Cut(p, []byte("\n"))
		p = rest
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			k.finished = bytes.Equal(data, []byte("[DONE]")) || bytes.HasPrefix(data, []byte(`{"error"`))
		}
	}
}

// open sends the head of an event stream with status, once.
func (k *keepalive) open(status int) {
	if k.opened {
		return
	}
	k.opened = true
	h := k.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	k.w.WriteHeader(status)
	k.atBoundary = true
	k.last = time.Now()
	_ = k.rc.Flush()
}

func (k *keepalive) write(p []byte) bool {
	if k.failed {
		return false
	}
	if _, err := k.w.Write(p); err != nil {
		k.failed = true
		return false
	}
	_ = k.rc.Flush()
	k.last = time.Now()
	k.atBoundary = bytes.HasSuffix(p, []byte("\n\n"))
	k.note(p)
	return true
}

func (k *keepalive) comment() { k.write([]byte(": keepalive\n\n")) }

// errorEvent ends the stream with an error event.
func (k *keepalive) errorEvent(body any) {
	b, _ := json.Marshal(body)
	if !k.atBoundary {
		k.write([]byte("\n\n"))
	}
	k.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

// keepAliveInterval is how long a forwarded stream may stay idle.
func (f *Forwarder) keepAliveInterval() time.Duration {
	if f.cfg.KeepAlive != 0 {
		return f.cfg.KeepAlive
	}
	return openai.DefaultStreamKeepAlive
}

// readAnswer reads what is left of a short answer.
func readAnswer(rb *transport.ForwardBody) []byte {
	var b bytes.Buffer
	for b.Len() < 64<<10 {
		p, err := rb.Next()
		if err != nil {
			break
		}
		b.Write(p)
	}
	return b.Bytes()
}

// refusalEvent is the error event for an answer of status with body that
// came after the stream's head went out: the driver's OpenAI error as it
// is, or one that says what came.
func refusalEvent(status int, body []byte) any {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 && e.Error[0] == '{' {
		return e
	}
	msg := strings.TrimSpace(string(body))
	if msg == "" {
		msg = http.StatusText(status)
	}
	return openAIErrorBody("server_error", "upstream_error", fmt.Sprintf("the serving agent answered %d: %s", status, msg))
}

func isEventStream(h map[string][]string) bool {
	ct := h["Content-Type"]
	return len(ct) > 0 && strings.HasPrefix(ct[0], "text/event-stream")
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
