package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Error is the JSON body of every error answer.
type Error struct {
	Error string `json:"error"`
}

// statusOf maps an error to an HTTP status.
func statusOf(err error) int {
	var s interface{ HTTPStatus() int }
	if errors.As(err, &s) {
		return s.HTTPStatus()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// Handler returns the admin API.
func Handler(b Backend) http.Handler {
	mux := http.NewServeMux()
	h := &handler{b: b, log: zap.L().Named("api")}
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /v1/status", h.read(func(r *http.Request) (any, error) { return b.Status(r.Context()) }))
	mux.HandleFunc("GET /v1/nodes", h.read(func(r *http.Request) (any, error) { return b.Nodes(r.Context()) }))
	mux.HandleFunc("GET /v1/nodes/{id}", h.read(func(r *http.Request) (any, error) {
		nodes, err := b.Nodes(r.Context())
		if err != nil {
			return nil, err
		}
		n, err := FindNode(nodes, r.PathValue("id"))
		return n, err
	}))
	mux.HandleFunc("POST /v1/nodes/{id}/drain", h.auth(func(r *http.Request) (any, error) {
		return nil, b.Drain(r.Context(), r.PathValue("id"), true)
	}))
	mux.HandleFunc("POST /v1/nodes/{id}/undrain", h.auth(func(r *http.Request) (any, error) {
		return nil, b.Drain(r.Context(), r.PathValue("id"), false)
	}))
	mux.HandleFunc("POST /v1/nodes/{id}/lead", h.auth(func(r *http.Request) (any, error) {
		return nil, b.TransferLeader(r.Context(), r.PathValue("id"))
	}))
	mux.HandleFunc("DELETE /v1/nodes/{id}", h.auth(func(r *http.Request) (any, error) {
		return nil, b.RemoveNode(r.Context(), r.PathValue("id"))
	}))
	mux.HandleFunc("GET /v1/members", h.read(func(r *http.Request) (any, error) { return b.Members(r.Context()) }))
	mux.HandleFunc("GET /v1/tokens", h.auth(func(r *http.Request) (any, error) { return b.Tokens(r.Context()) }))
	mux.HandleFunc("POST /v1/tokens", h.auth(func(r *http.Request) (any, error) {
		var req TokenRequest
		if r.ContentLength != 0 {
			dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				return nil, &httpError{http.StatusBadRequest, "malformed token request: " + err.Error()}
			}
		}
		if req.Kind == "" {
			req.Kind = TokenJoin
		}
		switch {
		case req.Kind != TokenJoin && req.Kind != TokenAdmin && req.Kind != TokenInference && req.Kind != TokenRead:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("token kind %q: want join, admin, inference or read", req.Kind)}
		case len(req.Models) > 0 && req.Kind != TokenInference:
			return nil, &httpError{http.StatusBadRequest, "only inference keys are limited to models"}
		case slices.Contains(req.Models, ""):
			return nil, &httpError{http.StatusBadRequest, "an empty model name"}
		case req.Role != "" && req.Kind != TokenJoin:
			return nil, &httpError{http.StatusBadRequest, "only join tokens have a role"}
		case req.Role != "" && req.Role != RoleClient && req.Role != RoleServer:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("role %q: want client or server", req.Role)}
		}
		if req.Kind == TokenJoin && req.Role == "" {
			req.Role = RoleClient
		}
		var ttl time.Duration
		if req.TTL != "" {
			d, err := time.ParseDuration(req.TTL)
			if err != nil || d <= 0 {
				return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("ttl %q: want a positive duration such as 24h", req.TTL)}
			}
			ttl = d
		}
		return b.CreateToken(r.Context(), req, ttl)
	}))
	mux.HandleFunc("DELETE /v1/tokens/{id}", h.auth(func(r *http.Request) (any, error) {
		return nil, b.RevokeToken(r.Context(), r.PathValue("id"))
	}))
	mux.HandleFunc("POST /v1/tokens/{id}/rotate", h.auth(func(r *http.Request) (any, error) {
		return b.RotateToken(r.Context(), r.PathValue("id"))
	}))
	mux.HandleFunc("GET /v1/cluster/models", h.read(func(r *http.Request) (any, error) {
		ms, err := b.Models(r.Context())
		if ms == nil && err == nil {
			ms = []ModelInfo{}
		}
		return ms, err
	}))
	mux.HandleFunc("POST /v1/cluster/models", h.auth(func(r *http.Request) (any, error) {
		var req LoadModelRequest
		dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return nil, &httpError{http.StatusBadRequest, "malformed load request: " + err.Error()}
		}
		if req.Path == "" && req.Hub == "" {
			return nil, &httpError{http.StatusBadRequest, "load request without a file path or a hub reference"}
		}
		if req.Path != "" && req.Hub != "" {
			return nil, &httpError{http.StatusBadRequest, "load request with both a file path and a hub reference: give one"}
		}
		if req.Ctx < 0 {
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("ctx %d: want a positive number of tokens", req.Ctx)}
		}
		switch req.Strategy {
		case "", "auto", "pipeline", "tensor":
		default:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("strategy %q: want auto, pipeline or tensor", req.Strategy)}
		}
		if req.Strategy == "auto" {
			req.Strategy = ""
		}
		switch req.Disagg {
		case "", "auto", "on", "off":
		default:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("disagg %q: want auto, on or off", req.Disagg)}
		}
		switch req.DisaggFailure {
		case "", "recompute", "fail":
		default:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("disagg_failure %q: want recompute or fail", req.DisaggFailure)}
		}
		switch req.Wire {
		case "", "f16", "f32", "q8_0":
		default:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("wire %q: want f16, f32 or q8_0", req.Wire)}
		}
		switch req.KVType {
		case "", "f16", "q8_0", "q4_0":
		default:
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("kv_type %q: want f16, q8_0 or q4_0", req.KVType)}
		}
		return b.LoadModel(r.Context(), req)
	}))
	mux.HandleFunc("DELETE /v1/cluster/models/{name}", h.auth(func(r *http.Request) (any, error) {
		return nil, b.UnloadModel(r.Context(), r.PathValue("name"))
	}))
	mux.HandleFunc("GET /v1/cluster/models/{name}/placement", h.read(func(r *http.Request) (any, error) {
		return b.Placement(r.Context(), r.PathValue("name"))
	}))
	if cr, ok := b.(ClusterRunner); ok {
		h.clusterRunner(mux, cr)
	}
	if pp, ok := b.(PrefillPredictor); ok {
		mux.HandleFunc("GET /v1/cluster/models/{name}/prefill", h.read(func(r *http.Request) (any, error) {
			n, err := strconv.Atoi(r.URL.Query().Get("tokens"))
			if err != nil || n < 1 || n > MaxPrefillTokens {
				return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("tokens=%q: want the prompt's length, 1 to %d", r.URL.Query().Get("tokens"), MaxPrefillTokens)}
			}
			return pp.PredictPrefill(r.Context(), r.PathValue("name"), n)
		}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, Error{Error: fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path)})
	})
	return mux
}

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string   { return e.msg }
func (e *httpError) HTTPStatus() int { return e.code }

// FindNode finds a node by ID, unique ID prefix or name.
func FindNode(nodes []*Node, ref string) (*Node, error) {
	var match []*Node
	for _, n := range nodes {
		if n.ID == ref || n.Name == ref {
			return n, nil
		}
		if strings.HasPrefix(n.ID, ref) {
			match = append(match, n)
		}
	}
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		return nil, &httpError{http.StatusNotFound, fmt.Sprintf("node %q not found", ref)}
	}
	return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("node %q is ambiguous: %d nodes match", ref, len(match))}
}

type handler struct {
	b   Backend
	log *zap.Logger
}

// auth serves fn to admin keys; read serves it to read keys too. The
// route names its scope where it is registered.
func (h *handler) auth(fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return h.scoped(ScopeAdmin, fn)
}

func (h *handler) read(fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return h.scoped(ScopeRead, fn)
}

func (h *handler) scoped(scope Scope, fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		r = r.WithContext(ctx)
		if !h.authorized(w, r, scope) {
			return
		}
		key, _ := bearer(r)
		r = r.WithContext(context.WithValue(ctx, keyCtx{}, key))
		out, err := fn(r)
		if err != nil {
			writeJSON(w, statusOf(err), Error{Error: err.Error()})
			return
		}
		if out == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// authorized checks the request's API key within the request's context
// and answers the refusal itself.
func (h *handler) authorized(w http.ResponseWriter, r *http.Request, scope Scope) bool {
	key, ok := bearer(r)
	if !ok {
		writeJSON(w, http.StatusUnauthorized, Error{Error: "missing API key: send Authorization: Bearer <key> (shoal reads SHOAL_TOKEN)"})
		return false
	}
	if err := h.b.Authorize(r.Context(), key, scope); err != nil {
		code := statusOf(err)
		if code == http.StatusInternalServerError {
			code = http.StatusForbidden
		}
		writeJSON(w, code, Error{Error: err.Error()})
		return false
	}
	return true
}

type keyCtx struct{}

// KeyFrom is the API key of the cluster API request whose context ctx is
// (a backend relays it with the writes it forwards), or "".
func KeyFrom(ctx context.Context) string {
	k, _ := ctx.Value(keyCtx{}).(string)
	return k
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const p = "Bearer "
	if len(h) <= len(p) || subtle.ConstantTimeCompare([]byte(strings.ToLower(h[:len(p)])), []byte("bearer ")) != 1 {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
