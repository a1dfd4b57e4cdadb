package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
}

// NewRPCServer serves kind on ep. timeout bounds one call.
func NewRPCServer(ep *Endpoint, kind Kind, timeout time.Duration) *RPCServer {
	s := &RPCServer{methods: map[string]RPCHandler{}, timeout: timeout}
	ep.Handle(kind, s.serve)
	return s
}

// Register adds a method.
func (s *RPCServer) Register(method string, h RPCHandler) {
	s.mu.Lock()
	s.methods[method] = h
	s.mu.Unlock()
}

func (s *RPCServer) serve(st *Stream) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(s.timeout))
	raw, err := ReadFrame(st, DefaultMaxFrame)
	if err != nil {
		zap.L().Named("rpc").Debug("bad request frame", zap.Error(err), zap.Stringer("peer", st.Peer.Addr))
		return
	}
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
	st, err := ep.Dial(ctx, addr, kind)
	if err != nil {
		if errors.Is(err, ErrRevoked) {
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
