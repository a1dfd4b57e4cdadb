package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/zap"
)

// RPCError is an error that crossed the wire. Code follows HTTP status
// codes so the admin API can pass it on unchanged.
type RPCError struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

func (e *RPCError) Error() string { return e.Msg }

// HTTPStatus reports the status code the error maps to.
func (e *RPCError) HTTPStatus() int { return e.Code }

// Errorf builds an RPCError with an HTTP status code.
func Errorf(code int, format string, args ...any) error {
	return &RPCError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// StatusOf returns the HTTP status an error maps to (500 when unknown).
func StatusOf(err error) int {
	var s interface{ HTTPStatus() int }
	if errors.As(err, &s) {
		return s.HTTPStatus()
	}
	return http.StatusInternalServerError
}

type rpcRequest struct {
	Method string          `json:"method"`
	Body   json.RawMessage `json:"body,omitempty"`
}

type rpcResponse struct {
	Err  *RPCError       `json:"err,omitempty"`
	Body json.RawMessage `json:"body,omitempty"`
}

// RPCHandler answers one request. peer is the verified caller.
type RPCHandler func(ctx context.Context, peer Peer, body json.RawMessage) (any, error)

// RPCServer dispatches request/response calls by method name. One call
// uses one stream: a request frame, a response frame.
type RPCServer struct {
	mu      sync.RWMutex
	methods map[string]RPCHandler
	timeout time.Duration
	// request bounds the wait for a call's request frame (see
	// RequestTimeout); tests shorten it.
	request time.Duration
}

// RequestTimeout bounds how long an RPC stream may wait for its request
// frame: a caller writes it as soon as it opens the stream, so a stream
// that stays silent this long is reset (its handler's own timeout starts
// once the request is in). A large request gets a further second per
// requestRate bytes it announced.
const RequestTimeout = 5 * time.Second

// requestRate is the slowest rate at which a caller may send an announced
// request body (256 KiB/s: a 4 MiB request gets 16 s more).
const requestRate = 256 << 10

// NewRPCServer serves kind on ep. timeout bounds one call.
func NewRPCServer(ep *Endpoint, kind Kind, timeout time.Duration) *RPCServer {
	return newRPCServer(ep, kind, timeout, RequestTimeout)
}

// newRPCServer is NewRPCServer with the request timeout given. It is set
// before the server handles streams: the serving goroutines read it with
// no lock (the ordering through the network is not one the race detector
// sees, so it is not set after).
func newRPCServer(ep *Endpoint, kind Kind, timeout, request time.Duration) *RPCServer {
	s := &RPCServer{methods: map[string]RPCHandler{}, timeout: timeout, request: request}
	ep.Handle(kind, s.serve)
	return s
}

// Register adds a method.
func (s *RPCServer) Register(method string, h RPCHandler) {
	s.mu.Lock()
	s.methods[method] = h
	s.mu.Unlock()
}

// readRequest reads the request frame of st within the request timeout
// (extended by the announced size at requestRate). Unlike ReadFrame it
// allocates as the bytes arrive, not what the length prefix announces: a
// caller that announces 4 MiB and sends nothing holds nothing.
func (s *RPCServer) readRequest(st *Stream) ([]byte, error) {
	t0 := time.Now()
	_ = st.SetReadDeadline(t0.Add(s.request))
	var hdr [4]byte
	if _, err := io.ReadFull(st, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > DefaultMaxFrame {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, DefaultMaxFrame)
	}
	_ = st.SetReadDeadline(t0.Add(s.request + time.Duration(n)*time.Second/requestRate))
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, st, int64(n)); err != nil {
		return nil, fmt.Errorf("short frame: %w", err)
	}
	return buf.Bytes(), nil
}

func (s *RPCServer) serve(st *Stream) {
	defer st.Close()
	raw, err := s.readRequest(st)
	if err != nil {
		zap.L().Named("rpc").Debug("bad request frame", zap.Error(err), zap.Stringer("peer", st.Peer.Addr))
		return
	}
	_ = st.SetDeadline(time.Now().Add(s.timeout))
	var req rpcRequest
	var resp rpcResponse
	if err := json.Unmarshal(raw, &req); err != nil {
		resp.Err = &RPCError{Code: http.StatusBadRequest, Msg: "malformed rpc request"}
	} else {
		s.mu.RLock()
		h := s.methods[req.Method]
		s.mu.RUnlock()
		if h == nil {
			resp.Err = &RPCError{Code: http.StatusNotFound, Msg: fmt.Sprintf("unknown rpc method %q", req.Method)}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			out, err := h(ctx, st.Peer, req.Body)
			cancel()
			if err != nil {
				resp.Err = &RPCError{Code: StatusOf(err), Msg: err.Error()}
			} else if out != nil {
				resp.Body, err = json.Marshal(out)
				if err != nil {
					resp.Err = &RPCError{Code: http.StatusInternalServerError, Msg: err.Error()}
				}
			}
		}
	}
	b, _ := json.Marshal(resp)
	_ = WriteFrame(st, b)
}

// Call sends one request on a fresh stream of kind to addr and decodes the
// reply into out (which may be nil). The error of a request that got no
// answer because addr could not be reached, or shut down (so it served the
// request only if it was shutting down as it came), has an Unreachable()
// bool method that returns true: a request that is safe to repeat may be
// retried, there or elsewhere.
func Call(ctx context.Context, ep *Endpoint, addr string, kind Kind, method string, in, out any) error {
	return CallAs(ctx, ep, addr, kind, "", "", method, in, out)
}

// CallAs is Call sent only if the peer's certificate names node wantID
// (when not empty) with role wantRole (when not empty): a request that
// carries a key or a write goes to the node meant, never to whoever an
// address (from gossip) reaches. A peer that is not the one meant is an
// ErrWrongPeer error, not an unreachable one.
func CallAs(ctx context.Context, ep *Endpoint, addr string, kind Kind, wantID, wantRole, method string, in, out any) error {
	st, err := ep.DialAs(ctx, addr, kind, wantID, wantRole)
	if err != nil {
		if errors.Is(err, ErrRevoked) || errors.Is(err, ErrWrongPeer) {
			return err
		}
		return unreachableError{err}
	}
	err = CallStream(ctx, st, method, in, out)
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote && ae.ErrorCode == codeOK {
		return unreachableError{err} // the peer shut down
	}
	return err
}

// unreachableError is the error of a call its server did not serve.
type unreachableError struct{ err error }

func (e unreachableError) Error() string     { return e.err.Error() }
func (e unreachableError) Unwrap() error     { return e.err }
func (e unreachableError) Unreachable() bool { return true }

// CallStream performs a call on an open stream and closes it.
func CallStream(ctx context.Context, st *Stream, method string, in, out any) error {
	defer st.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	}
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, _ := json.Marshal(rpcRequest{Method: method, Body: body})
	if err := WriteFrame(st, req); err != nil {
		return fmt.Errorf("rpc %s: %w", method, asRevoked(err))
	}
	_ = st.CloseWrite()
	raw, err := ReadFrame(st, DefaultMaxFrame)
	if err != nil {
		return fmt.Errorf("rpc %s: %w", method, asRevoked(err))
	}
	var resp rpcResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return fmt.Errorf("rpc %s: malformed reply", method)
	}
	if resp.Err != nil {
		return resp.Err
	}
	if out != nil && len(resp.Body) > 0 {
		return json.Unmarshal(resp.Body, out)
	}
	return nil
}
