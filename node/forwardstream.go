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

// send passes r, whose body is body, to the agent at to.addr and streams
// its answer to w; fail answers when that agent cannot be reached.
func (f *forwarder) send(w http.ResponseWriter, r *http.Request, to target, body []byte, fail func(w http.ResponseWriter, status int, code, msg string)) {
	h := passHeader(r.Header)
	h.Del("Authorization")
	h.Del("Cookie")
	head := transport.ForwardHead{Method: r.Method, Path: r.URL.RequestURI(), Model: to.model, Header: h}
	f.log.Debug("forwarding request", zap.String("to", to.name), zap.String("path", r.URL.Path), zap.String("model", to.model))
	reply, rb, err := transport.Forward(r.Context(), f.ep, to.addr, head, body)
	if err != nil {
		status, code := http.StatusBadGateway, "upstream_unavailable"
		if timedOut(err) {
			status, code = http.StatusGatewayTimeout, "upstream_timeout"
		}
		fail(w, status, code, fmt.Sprintf("the agent serving model %s (%s) did not answer: %v", to.model, to.name, err))
		return
	}
	defer rb.Close()
	for k, v := range passHeader(reply.Header) {
		w.Header()[k] = v
	}
	w.WriteHeader(reply.Status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for {
		chunk, err := rb.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			if r.Context().Err() != nil {
				return // the client went away
			}
			f.log.Warn("forwarded answer cut", zap.String("from", to.name), zap.String("model", to.model), zap.Error(err))
			msg := fmt.Sprintf("the agent serving model %s (%s) stopped answering: %v", to.model, to.name, err)
			if isEventStream(reply.Header) {
				// Headers are out: end the event stream with an error event.
				b, _ := json.Marshal(openAIErrorBody("server_error", "upstream_unavailable", msg))
				_, _ = w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
				_ = rc.Flush()
				return
			}
			panic(http.ErrAbortHandler) // cut the client's connection: a truncated answer must not look whole
		}
		if _, err := w.Write(chunk); err != nil {
			return
		}
		_ = rc.Flush()
	}
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
	case "/v1/chat/completions", "/v1/completions":
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
