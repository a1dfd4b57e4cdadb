package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/transport"
)

// A forwarded request travels on a transport.KindForward stream (mutual
// TLS between agents): the method, path, model name and header in the head
// frame, the raw body in the next; the answer streams back a frame per
// write, so server-sent events pass token by token.

// target is the agent a request is passed to.
type target struct {
	model string
	name  string // the agent's node name, for errors
	addr  string // its QUIC address
}

// forwardedReq marks a request that arrived over the transport, with the
// model name its sender read, so it is neither decoded again to route it
// nor passed on a second time.
type forwardedReq struct {
	model string
	from  string // the sending agent's node ID
}

type forwardedKey struct{}

func forwardedOf(r *http.Request) (forwardedReq, bool) {
	fr, ok := r.Context().Value(forwardedKey{}).(forwardedReq)
	return fr, ok
}

// forwardGrant stands in for the user's API key on a forwarded request:
// the sending agent checked the key, and a key never leaves the agent it
// was sent to (a node that drives a model sees the prompts it serves, not
// the keys of the users who send them). The receiver honours it only on
// requests that came over the transport.
const forwardGrant = "shoal-forwarded-request"

// hopHeaders are not passed on either way (the body is framed by the
// stream, and each side keeps its own connection).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade", "Content-Length"}

func passHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, k := range hopHeaders {
		out.Del(k)
	}
	return out
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
// streamed completion never goes silent: while the driver's answer has not
// begun, or between its events, an SSE keepalive comment goes out after
// every idle interval (the stream's head is sent here then, and an error
// the driver answers later becomes an error event). An answer that is cut
// ends with an error event, or, not streamed, with a 502 or 504.
func (f *forwarder) send(w http.ResponseWriter, r *http.Request, to target, body []byte, fail func(w http.ResponseWriter, status int, code, msg string)) {
	h := passHeader(r.Header)
	h.Del("Authorization")
	h.Del("Cookie")
	head := transport.ForwardHead{Method: r.Method, Path: r.URL.RequestURI(), Model: to.model, Header: h}
	f.log.Debug("forwarding request", zap.String("to", to.name), zap.String("path", r.URL.Path), zap.String("model", to.model))
	done := make(chan forwardResult, 1)
	go func() {
		reply, rb, err := transport.Forward(r.Context(), f.ep, to.addr, head, body)
		done <- forwardResult{reply, rb, err}
	}()
	var ka *keepalive
	if interval := f.keepAliveInterval(); interval > 0 && streamRequested(r, body) {
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
		f.log.Warn("forwarded answer cut", zap.String("from", to.name), zap.String("model", to.model), zap.Error(err))
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
func (f *forwarder) relayWhole(w http.ResponseWriter, r *http.Request, reply *transport.ForwardReply, rb *transport.ForwardBody, cutFail func(error)) {
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
func (f *forwarder) keepAliveInterval() time.Duration {
	if f.keepAlive != 0 {
		return f.keepAlive
	}
	return openai.DefaultStreamKeepAlive
}

// streamRequested reports whether r is a completion that asks for a
// stream of events.
func streamRequested(r *http.Request, body []byte) bool {
	if r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/v1/completions" {
		return false
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	return json.Unmarshal(body, &req) == nil && req.Stream
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

// forwardable lists what peers may pass to this agent: completions and
// the admin API's runs of a distributed model, nothing else.
func forwardable(method, path string) bool {
	if method != http.MethodPost {
		return false
	}
	switch path {
	case "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize":
		return true
	}
	rest, ok := strings.CutPrefix(path, "/v1/cluster/models/")
	name, op, _ := strings.Cut(rest, "/")
	return ok && name != "" && (op == "logits" || op == "bench")
}

// serve answers requests peers forward to this agent through h, the
// agent's HTTP routes, marked as forwarded.
func (f *forwarder) serve(h http.Handler) {
	transport.ServeForward(f.ep, func(ctx context.Context, peer transport.Peer, head transport.ForwardHead, body []byte, w *transport.ForwardWriter) {
		sw := &streamWriter{w: w, header: http.Header{}}
		ctx = context.WithValue(ctx, forwardedKey{}, forwardedReq{model: head.Model, from: peer.ID})
		r, err := http.NewRequestWithContext(ctx, head.Method, head.Path, bytes.NewReader(body))
		if err != nil || !forwardable(head.Method, r.URL.Path) {
			adminFail(sw, http.StatusNotFound, "", fmt.Sprintf("agent does not take forwarded %s %s", head.Method, head.Path))
			return
		}
		r.Header = http.Header(head.Header)
		if r.Header == nil {
			r.Header = http.Header{}
		}
		if ce := f.log.Check(zap.DebugLevel, "forwarded request"); ce != nil {
			names := make([]string, 0, len(r.Header))
			for k := range r.Header {
				names = append(names, k)
			}
			sort.Strings(names)
			ce.Write(zap.String("from", peer.ID), zap.String("path", r.URL.Path), zap.String("model", head.Model), zap.Strings("headers", names))
		}
		r.Header.Set("Authorization", "Bearer "+forwardGrant)
		r.RemoteAddr = peer.Addr.String()
		r.RequestURI = head.Path
		h.ServeHTTP(sw, r)
		sw.WriteHeader(http.StatusOK) // a handler that wrote nothing answers 200, as net/http does
	})
}

// streamWriter is an http.ResponseWriter over a forwarded request's
// answer stream. Every write goes out at once, so Flush has nothing to do.
type streamWriter struct {
	w      *transport.ForwardWriter
	header http.Header
	sent   bool
	err    error
}

func (s *streamWriter) Header() http.Header { return s.header }

func (s *streamWriter) WriteHeader(code int) {
	if s.sent || code < 200 {
		return
	}
	s.sent = true
	s.err = s.w.WriteHead(transport.ForwardReply{Status: code, Header: s.header.Clone()})
}

func (s *streamWriter) Write(p []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	s.err = err
	return n, err
}

// FlushError implements what http.ResponseController.Flush looks for.
func (s *streamWriter) FlushError() error {
	s.WriteHeader(http.StatusOK)
	return s.err
}

// SetWriteDeadline implements what http.ResponseController looks for.
func (s *streamWriter) SetWriteDeadline(t time.Time) error { return s.w.SetWriteDeadline(t) }
