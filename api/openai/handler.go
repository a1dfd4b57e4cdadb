package openai

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Options configure the handler.
type Options struct {
	// CheckKey validates the API key of "Authorization: Bearer KEY": nil
	// accepts it; an error refuses it with 401, or with its HTTPStatus()
	// if it has one (e.g. 503 when the key store cannot be reached). A nil
	// CheckKey means no key is needed. models, when not empty, are the
	// only models the key may use: the others do not exist for it (404,
	// and /v1/models leaves them out). list is true for the requests that
	// only list models (GET /v1/models), which a read-only key may make.
	CheckKey func(ctx context.Context, key string, list bool) (models []string, err error)
	// MaxBodyBytes limits request bodies (default 4 MiB); larger is 413.
	MaxBodyBytes int64
	// RetryAfter is the Retry-After sent with 429 (default 1 s).
	RetryAfter time.Duration
	// Sampling is the base for the parameters a request does not set
	// (default: temperature 1, as OpenAI's API).
	Sampling *Sampling
	// StreamWriteTimeout bounds the write of each streamed event (default
	// 1 min): a client that stops reading is dropped.
	StreamWriteTimeout time.Duration
	// StreamKeepAlive is how long a stream may stay idle before an SSE
	// comment keeps it alive (default 3 s; < 0: never), so that clients
	// and proxies do not time out while the engine replays or prefills.
	StreamKeepAlive time.Duration
	// Observer, if set, receives a Record per request.
	Observer Observer
	// SystemFingerprint, if set, is returned in every completion.
	SystemFingerprint string
	// Log defaults to zap.L().Named("openai").
	Log *zap.Logger
}

const defaultMaxBody = 4 << 20

// DefaultStreamKeepAlive is the default of Options.StreamKeepAlive.
const DefaultStreamKeepAlive = 3 * time.Second

type handler struct {
	b    Backend
	o    Options
	log  *zap.Logger
	base Sampling
	mux  *http.ServeMux

	mu        sync.Mutex
	templates map[templateKey]*modelTemplate
}

// NewHandler returns the OpenAI-compatible endpoint: POST
// /v1/chat/completions, POST /v1/completions, GET /v1/models and GET
// /v1/models/{id}. Every answer, errors included, is JSON in OpenAI's
// shapes; streams are Server-Sent Events.
func NewHandler(b Backend, o Options) http.Handler { return newHandler(b, o) }

func newHandler(b Backend, o Options) *handler {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = defaultMaxBody
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	if o.StreamWriteTimeout <= 0 {
		o.StreamWriteTimeout = time.Minute
	}
	if o.StreamKeepAlive == 0 {
		o.StreamKeepAlive = DefaultStreamKeepAlive
	}
	if o.Log == nil {
		o.Log = zap.L().Named("openai")
	}
	h := &handler{b: b, o: o, log: o.Log, templates: map[templateKey]*modelTemplate{}}
	h.base = Sampling{Temperature: 1}
	if o.Sampling != nil {
		h.base = *o.Sampling
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", h.route("chat.completions", http.MethodPost, h.chat))
	mux.HandleFunc("/v1/completions", h.route("completions", http.MethodPost, h.completions))
	mux.HandleFunc("/v1/embeddings", h.route("embeddings", http.MethodPost, h.embeddings))
	mux.HandleFunc("/v1/models", h.route("models", http.MethodGet, h.models))
	mux.HandleFunc("/v1/models/{id...}", h.route("models", http.MethodGet, h.model))
	mux.HandleFunc("/tokenize", h.route("tokenize", http.MethodPost, h.tokenize))
	mux.HandleFunc("/detokenize", h.route("detokenize", http.MethodPost, h.detokenize))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "unknown_url",
			msg: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path)})
	})
	h.mux = mux
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// apiError is an error answered in the OpenAI shape.
type apiError struct {
	status int
	typ    string
	msg    string
	param  string
	code   string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func (e *apiError) body() ErrorBody {
	b := ErrorBody{Error: ErrorDetail{Message: e.msg, Type: e.typ}}
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code != "" {
		b.Error.Code = &e.code
	}
	return b
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, e.body())
}

// exchange is one request in flight: the response writer with its status,
// and what the Observer will be told.
type exchange struct {
	w      http.ResponseWriter
	r      *http.Request
	start  time.Time
	status int
	rec    Record
	models []string // the key's models; none: every model
	body   []byte   // the request's body, as decode read it
	// passed: the backend passed the request on (PassOn), which
	// answered it.
	passed bool
}

// allowed reports whether the request's key may use model.
func (x *exchange) allowed(model string) bool {
	return len(x.models) == 0 || slices.Contains(x.models, model)
}

func (x *exchange) fail(e *apiError) {
	if x.status != 0 || x.passed {
		return
	}
	x.status = e.status
	writeError(x.w, e)
}

func (x *exchange) ok(v any) {
	x.status = http.StatusOK
	writeJSON(x.w, http.StatusOK, v)
}

// route checks the method and the API key, then runs fn and reports the
// exchange to the Observer.
func (h *handler) route(endpoint, method string, fn func(*exchange) *apiError) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		x := &exchange{w: w, r: r, start: time.Now(), rec: Record{Endpoint: endpoint}}
		defer func() {
			if h.o.Observer != nil && !x.passed {
				x.rec.Status = x.status
				x.rec.Duration = time.Since(x.start)
				h.o.Observer.RequestDone(x.rec)
			}
		}()
		var e *apiError
		if x.models, e = h.authorize(r); e != nil {
			x.fail(e)
			return
		}
		if r.Method != method {
			w.Header().Set("Allow", method)
			x.fail(&apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
				msg: fmt.Sprintf("%s is not allowed on %s; use %s.", r.Method, r.URL.Path, method)})
			return
		}
		if e := fn(x); e != nil {
			if e.status == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", strconv.Itoa(max(1, int((h.o.RetryAfter+time.Second-1)/time.Second))))
			}
			x.fail(e)
		}
	}
}

func (h *handler) authorize(r *http.Request) ([]string, *apiError) {
	if h.o.CheckKey == nil {
		return nil, nil
	}
	auth := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(auth, "Bearer ")
	key = strings.TrimSpace(key)
	if auth == "" {
		return nil, &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			msg: "You didn't provide an API key. Send it as \"Authorization: Bearer YOUR_KEY\"."}
	}
	if !ok || key == "" {
		return nil, &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			msg: "Incorrect API key provided: send it as \"Authorization: Bearer YOUR_KEY\"."}
	}
	models, err := h.o.CheckKey(r.Context(), key, r.Method == http.MethodGet)
	if err == nil {
		return models, nil
	}
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) && hs.HTTPStatus() != http.StatusUnauthorized && hs.HTTPStatus() != http.StatusForbidden {
		return nil, &apiError{status: hs.HTTPStatus(), typ: "server_error", msg: "cannot check the API key: " + err.Error()}
	}
	return nil, &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
		msg: "Incorrect API key provided."}
}

// decode reads the JSON body into v.
func (h *handler) decode(x *exchange, v any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(x.w, x.r.Body, h.o.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
				msg: fmt.Sprintf("The request body is larger than the limit of %d bytes.", mbe.Limit)}
		}
		return badRequest("", "could not read the request body: %v", err)
	}
	x.body = body
	if len(strings.TrimSpace(string(body))) == 0 {
		return badRequest("", "the request body is empty; send a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		msg, param := describeJSONError(err)
		return badRequest(param, "%s", msg)
	}
	return nil
}

// lookup finds the requested model.
func (h *handler) lookup(x *exchange, name string) (*Model, *apiError) {
	if name == "" {
		return nil, badRequest("model", "you must provide a model parameter")
	}
	m, ok := h.b.Model(name)
	if !ok || !x.allowed(name) {
		return nil, modelNotFound(name)
	}
	return m, nil
}

func modelNotFound(name string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
		msg: fmt.Sprintf("The model `%s` does not exist.", name)}
}

// passedOn is resolve's answer for a request the backend passed on and
// answered: there is nothing left to do.
var passedOn = &apiError{status: http.StatusOK, msg: "passed on"}

// resolve finds the model a completion names, once the key may use it:
// the backend's model, its refusal, or the request passed on (passedOn)
// with the body decode read.
func (h *handler) resolve(x *exchange, name string) (*Model, *apiError) {
	if name == "" {
		return nil, badRequest("model", "you must provide a model parameter")
	}
	if !x.allowed(name) {
		return nil, modelNotFound(name)
	}
	m, err := h.b.Resolve(x.r.Context(), name)
	var pass *PassOn
	var ref *Refusal
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, ErrNoModel):
		return nil, modelNotFound(name)
	case errors.As(err, &pass):
		x.passed = true
		pass.Serve(x.w, x.r, x.body, x.rec.Stream)
		return nil, passedOn
	case errors.As(err, &ref):
		if ref.RetryAfter > 0 {
			x.w.Header().Set("Retry-After", strconv.Itoa(ref.RetryAfter))
		}
		return nil, &apiError{status: ref.Status, typ: ref.Type, code: ref.Code, msg: ref.Message}
	}
	return nil, submitError(err, "model")
}

// submitError maps a Submit error to an answer.
func submitError(err error, param string) *apiError {
	var hs interface{ HTTPStatus() int }
	switch {
	case errors.Is(err, ErrQueueFull):
		return &apiError{status: http.StatusTooManyRequests, typ: "server_busy", code: "rate_limit_exceeded",
			msg: "The server is at capacity (request queue full); retry later."}
	case errors.Is(err, ErrTooLong):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, code: "context_length_exceeded", msg: err.Error()}
	case errors.Is(err, ErrBadInput):
		return badRequest(param, "%v", err)
	case errors.Is(err, ErrClosed), errors.Is(err, ErrNotServing):
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "unavailable", msg: err.Error()}
	case errors.As(err, &hs):
		return &apiError{status: hs.HTTPStatus(), typ: "server_error", msg: err.Error()}
	}
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: err.Error()}
}

const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func newID(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idChars[int(b[i])%len(idChars)]
	}
	return prefix + string(b)
}
