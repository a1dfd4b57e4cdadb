package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/zap"
)

// Forwarded requests. An agent that receives a request for a model another
// agent serves passes it on over one stream of KindForward:
//
//	caller → server: head frame (JSON ForwardHead, v 1), body frame, FIN
//	server → caller: head frame (JSON ForwardReply), then the answer's
//	                 body, one frame per write of the handler, then an
//	                 empty frame once the handler returned, then FIN
//
// The server's writes reach the caller as they are made, so a stream of
// server-sent events arrives token by token. Only the empty end frame
// says the answer is whole: a stream reset, a closed connection or a FIN
// before it means the answer was cut (the handler failed or its node went
// away). Servers that send the end frame say so in the reply head (End);
// from older ones, which do not, a FIN ends the answer. A caller that
// goes away resets the stream, which ends the server's context.
const (
	forwardVersion = 1
	maxForwardHead = 64 << 10
	// MaxForwardBody bounds a forwarded request's body.
	MaxForwardBody = DefaultMaxFrame
	// maxForwardChunk bounds one frame of an answer; larger writes are split.
	maxForwardChunk = 1 << 20
	// forwardDialTimeout bounds reaching the server; forwardReadTimeout
	// bounds the server's read of the request.
	forwardDialTimeout = 10 * time.Second
	forwardReadTimeout = 30 * time.Second

	codeForwardCanceled quic.StreamErrorCode = 0x20
	codeForwardFailed   quic.StreamErrorCode = 0x21
)

// ForwardHead opens a forwarded request.
type ForwardHead struct {
	V      int                 `json:"v"`
	Method string              `json:"method"`
	Path   string              `json:"path"` // with the query, if any
	Model  string              `json:"model,omitempty"`
	Header map[string][]string `json:"header,omitempty"`
}

// ForwardReply opens the answer.
type ForwardReply struct {
	Status int                 `json:"status"`
	Header map[string][]string `json:"header,omitempty"`
	// End says the answer ends with an empty frame (set by WriteHead).
	End bool `json:"end,omitempty"`
}

// ErrForwardCut is the error of an answer that ended before its end frame.
var ErrForwardCut = errors.New("the answer ended before it was complete")

// ForwardHandler serves one forwarded request; ctx ends when the caller
// goes away. It answers through w and must not keep w after it returns.
type ForwardHandler func(ctx context.Context, peer Peer, head ForwardHead, body []byte, w *ForwardWriter)

// ServeForward serves forwarded requests on ep with h.
func ServeForward(ep *Endpoint, h ForwardHandler) {
	ep.Handle(KindForward, func(s *Stream) { serveForward(s, h) })
}

func serveForward(s *Stream, h ForwardHandler) {
	log := zap.L().Named("forward")
	defer s.Close()
	_ = s.SetReadDeadline(time.Now().Add(forwardReadTimeout))
	var head ForwardHead
	hb, err := ReadFrame(s, maxForwardHead)
	if err == nil {
		if err = json.Unmarshal(hb, &head); err == nil && head.V != forwardVersion {
			err = fmt.Errorf("forwarded request of version %d, want %d", head.V, forwardVersion)
		}
	}
	var body []byte
	if err == nil {
		body, err = ReadFrame(s, MaxForwardBody)
	}
	if err != nil {
		log.Debug("bad forwarded request", zap.String("peer", s.Peer.ID), zap.Error(err))
		s.CancelWrite(codeForwardFailed)
		return
	}
	_ = s.SetReadDeadline(time.Time{})
	w := &ForwardWriter{s: s}
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler { // the handler's way to cut an answer on purpose
				log.Warn("forwarded request handler panicked", zap.String("path", head.Path), zap.Any("panic", r))
			}
			s.CancelWrite(codeForwardFailed)
		}
	}()
	h(s.Context(), s.Peer, head, body, w)
	if !w.sent {
		_ = w.WriteHead(ForwardReply{Status: 200})
	}
	_ = WriteFrame(s, nil) // the answer is whole
}

// ForwardWriter is the server's side of a forwarded request's answer.
type ForwardWriter struct {
	s    *Stream
	sent bool
}

// WriteHead sends the answer's status and header; it must come first.
func (w *ForwardWriter) WriteHead(r ForwardReply) error {
	if w.sent {
		return errors.New("forward: answer head sent twice")
	}
	w.sent = true
	r.End = true
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return WriteFrame(w.s, b)
}

// Write sends p to the caller at once, as one frame or more.
func (w *ForwardWriter) Write(p []byte) (int, error) {
	if !w.sent {
		return 0, errors.New("forward: body written before the answer head")
	}
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), maxForwardChunk)]
		if err := WriteFrame(w.s, c); err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}

// SetWriteDeadline bounds the writes that follow (a caller that stops
// reading cannot hold the handler).
func (w *ForwardWriter) SetWriteDeadline(t time.Time) error { return w.s.SetWriteDeadline(t) }

// Forward sends a request to the agent at addr and returns the head of its
// answer and the answer's body, to be closed. ctx bounds the whole
// exchange, body included.
func Forward(ctx context.Context, ep *Endpoint, addr string, head ForwardHead, body []byte) (*ForwardReply, *ForwardBody, error) {
	if len(body) > MaxForwardBody {
		return nil, nil, fmt.Errorf("%w: request body of %d bytes, limit %d", ErrFrameTooLarge, len(body), MaxForwardBody)
	}
	head.V = forwardVersion
	hb, err := json.Marshal(head)
	if err != nil {
		return nil, nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, forwardDialTimeout)
	s, err := ep.Dial(dctx, addr, KindForward)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	b := &ForwardBody{s: s}
	b.stop = context.AfterFunc(ctx, func() {
		s.CancelRead(codeForwardCanceled)
		s.CancelWrite(codeForwardCanceled)
	})
	fail := func(err error) (*ForwardReply, *ForwardBody, error) {
		b.Close()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	if err := WriteFrame(s, hb); err != nil {
		return fail(err)
	}
	if err := WriteFrame(s, body); err != nil {
		return fail(err)
	}
	_ = s.CloseWrite()
	rb, err := ReadFrame(s, maxForwardHead)
	if errors.Is(err, io.EOF) {
		err = errors.New("the peer closed the stream without an answer")
	}
	if err != nil {
		return fail(err)
	}
	var reply ForwardReply
	if err := json.Unmarshal(rb, &reply); err != nil || reply.Status < 100 || reply.Status > 999 {
		return fail(errors.New("malformed answer head"))
	}
	b.end = reply.End
	return &reply, b, nil
}

// ForwardBody reads the body of a forwarded request's answer.
type ForwardBody struct {
	s    *Stream
	stop func() bool
	end  bool // the server sends an end frame
	done bool // and it came
}

// Next returns the next chunk of the answer as the server wrote it, and
// io.EOF after the last one. Any other error means the answer was cut:
// ErrForwardCut when the stream ended before the end frame.
func (b *ForwardBody) Next() ([]byte, error) {
	if b.done {
		return nil, io.EOF
	}
	p, err := ReadFrame(b.s, maxForwardChunk)
	switch {
	case err == nil && len(p) == 0 && b.end:
		b.done = true
		return nil, io.EOF
	case errors.Is(err, io.EOF) && b.end:
		return nil, ErrForwardCut
	}
	return p, err
}

// Close releases the stream.
func (b *ForwardBody) Close() {
	b.stop()
	_ = b.s.Close()
}
