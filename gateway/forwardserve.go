package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/transport"
)

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

// ForwardedModel is the model named by the agent that passed on the
// request whose context ctx is; ok is false for a request that did not
// come over the transport.
func ForwardedModel(ctx context.Context) (model string, ok bool) {
	fr, ok := ctx.Value(forwardedKey{}).(forwardedReq)
	return fr.model, ok
}

// ForwardGrant stands in for the user's API key on a forwarded request:
// the sending agent checked the key, and a key never leaves the agent it
// was sent to (a node that drives a model sees the prompts it serves, not
// the keys of the users who send them). The receiver honours it only on
// requests that came over the transport.
const ForwardGrant = "shoal-forwarded-request"

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

// forwardable lists what peers may pass to this agent: completions, the
// admin API's runs of a distributed model and what its driver measures,
// and this agent's traffic for a peer's dashboard; nothing else.
func forwardable(method, path string) bool {
	rest, ok := strings.CutPrefix(path, "/v1/cluster/models/")
	name, op, _ := strings.Cut(rest, "/")
	if method == http.MethodGet {
		return path == "/dashboard/api/traffic" || ok && name != "" && op == "measured"
	}
	if method != http.MethodPost {
		return false
	}
	switch path {
	case "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize":
		return true
	}
	return ok && name != "" && (op == "logits" || op == "bench")
}

// serve answers requests peers forward to this agent through h, the
// agent's HTTP routes, marked as forwarded.
func (f *Forwarder) ServeForwarded(h http.Handler) {
	transport.ServeForward(f.cfg.Endpoint, func(ctx context.Context, peer transport.Peer, head transport.ForwardHead, body []byte, w *transport.ForwardWriter) {
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
		if ce := f.cfg.Log.Check(zap.DebugLevel, "forwarded request"); ce != nil {
			names := make([]string, 0, len(r.Header))
			for k := range r.Header {
				names = append(names, k)
			}
			sort.Strings(names)
			ce.Write(zap.String("from", peer.ID), zap.String("path", r.URL.Path), zap.String("model", head.Model), zap.Strings("headers", names))
		}
		r.Header.Set("Authorization", "Bearer "+ForwardGrant)
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
