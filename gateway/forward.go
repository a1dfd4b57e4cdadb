package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/api/openai"
	"shoal/transport"
)

// maxForwardBody bounds the body read to find the model name; larger bodies
// go to the local handler, which refuses them with 413.
const maxForwardBody = transport.MaxForwardBody

// Route says where the driver of a planned model runs.
type Route struct {
	Model    string
	Node     string // the driver's node ID
	NodeName string
	Ready    bool   // every shard of the plan is ready
	Status   string // the model's status
}

// RouteSource says where the driver of each planned model runs.
type RouteSource interface {
	Route(model string) (Route, bool)
	Routes() []Route
}

// ForwarderConfig is what a Forwarder needs from its agent.
type ForwarderConfig struct {
	Self     string // this agent's node ID
	Endpoint *transport.Endpoint
	Log      *zap.Logger
	// PeerAddr is the QUIC address of an alive peer, or "".
	PeerAddr func(id string) string
	// Local reports whether this agent serves model itself.
	Local func(model string) bool
	// KeyModels gives the models an API key is limited to (none: all).
	KeyModels func(ctx context.Context, key string, list bool) ([]string, error)
	// Authorize checks a request's key for scope (and, for inference,
	// model) here, before the request leaves without it.
	Authorize func(ctx context.Context, key string, scope api.Scope, model string) error
	Routes    RouteSource
	// Unserved gives, for a model the cluster knows but has no plan for
	// (hashing, planning, unservable, failed), its status with the
	// reason; nil or false: the model is not the cluster's.
	Unserved func(model string) (string, bool)
	// KeepAlive is the idle interval of forwarded streams (0: the
	// OpenAI endpoint's default).
	KeepAlive time.Duration
}

// Forwarder passes the requests for a model this agent does not serve,
// and the admin API's runs of a model spread over the cluster, to the agent
// that serves or drives it. A completion is not its to read: the OpenAI
// endpoint decodes it and asks its Backend (Forwarder.Backend) for the
// model, which is served here at the token level when the driver takes it
// (tokenpath.go) or passed on as HTTP over the node transport
// (forwardsend.go) with the body the endpoint read. The tokenizer routes
// are scanned here for the model name, which travels beside the raw body;
// the receiving agent does not read it again to route them.
type Forwarder struct {
	cfg ForwarderConfig
	// gw passes completions to drivers as tokens (tokenpath.go); nil: as
	// HTTP only.
	gw *Client
}

// NewForwarder is a Forwarder as cfg wires it.
func NewForwarder(cfg ForwarderConfig) *Forwarder { return &Forwarder{cfg: cfg} }

// keyAllows checks the request's API key for scope at this agent; a
// request it refuses goes to the local handler, which answers the refusal
// as it answers any other.
func (f *Forwarder) keyAllows(r *http.Request, scope api.Scope, model string) bool {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && f.cfg.Authorize != nil && f.cfg.Authorize(r.Context(), strings.TrimSpace(key), scope, model) == nil
}

// rpcAddr is the QUIC address of an alive peer, or "".
func (f *Forwarder) rpcAddr(id string) string {
	if f.cfg.PeerAddr == nil {
		return ""
	}
	return f.cfg.PeerAddr(id)
}

// OpenAI wraps the OpenAI handler: a tokenizer request for a model this
// agent does not serve goes to the agent that drives it; /v1/models lists
// the models of the whole cluster. Completions go to the handler as they
// came: its Backend routes them (Resolve).
func (f *Forwarder) OpenAI(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && (r.URL.Path == "/tokenize" || r.URL.Path == "/detokenize"):
			fr, forwarded := forwardedOf(r)
			if forwarded {
				f.route(w, r, local, fr.model, nil, true)
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, maxForwardBody+1))
			r.Body.Close()
			if err != nil {
				OpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "reading the request body: "+err.Error())
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if model, ok := modelOf(body); ok && len(body) <= maxForwardBody {
				f.route(w, r, local, model, body, false)
				return
			}
			local.ServeHTTP(w, r)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
			f.listClusterModels(w, r, local)
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/models/"):
			f.getClusterModel(w, r, local)
		default:
			local.ServeHTTP(w, r)
		}
	})
}

// modelOf reads the "model" member of a JSON object without decoding the
// rest: clients send it first, so the messages are not even scanned. ok is
// false for a body that is not an object with a string model; the local
// handler then says what is wrong with it.
func modelOf(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", false
		}
		if k, _ := key.(string); strings.EqualFold(k, "model") { // as encoding/json matches fields
			var m string
			return m, dec.Decode(&m) == nil
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return "", false
		}
	}
	return "", true
}

// route serves a tokenizer request for model here or passes it on as
// HTTP. A forwarded request is never passed on again.
func (f *Forwarder) route(w http.ResponseWriter, r *http.Request, local http.Handler, model string, body []byte, forwarded bool) {
	rt, p := f.where(r.Context(), model, forwarded)
	switch p {
	case servedHere:
		local.ServeHTTP(w, r)
		return
	case drivenElsewhere:
		if !f.keyAllows(r, api.ScopeInference, rt.Model) {
			local.ServeHTTP(w, r)
			return
		}
		if addr := f.rpcAddr(rt.Node); addr != "" {
			f.send(w, r, forwardTarget{model: rt.Model, name: rt.NodeName, addr: addr}, body, false, openAIFail)
			return
		}
	}
	e := refusal(rt, p)
	w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	OpenAIError(w, e.Status, e.Type, e.Code, e.Message)
}

// placement is where a request for a model is answered.
type placement int

const (
	// servedHere: by this agent, which serves the model (its driver is
	// up), or knows no route for it (its endpoint says what is wrong).
	servedHere placement = iota
	// drivenElsewhere: by the route's node, whose plan is ready.
	drivenElsewhere
	// notReady: nowhere yet (the plan is not ready, or this agent's
	// driver did not start in time).
	notReady
	// moved: a forwarded request for a model driven by another node now.
	moved
)

// movedRefusal answers a request another agent passed on by a route that
// no longer holds: 503, to be sent again (the route names the new driver).
func movedRefusal(rt Route) *openai.Refusal {
	return &openai.Refusal{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "model_moved", RetryAfter: 1,
		Message: fmt.Sprintf("model %s is driven by %s now; the request came here by an older route: send it again", rt.Model, rt.NodeName)}
}

// refusal says why a request for rt's model is not answered here.
func refusal(rt Route, p placement) *openai.Refusal {
	if p == moved {
		return movedRefusal(rt)
	}
	return notReadyRefusal(rt)
}

// driverStartWait bounds how long a completion for a model this agent is
// planned to drive waits for its driver to start: the plan turns ready
// (every shard loaded) a moment before the driver has opened its session.
const driverStartWait = 15 * time.Second

// where says where a request for model, whose context is ctx, is
// answered, and the model's route. When this agent is to drive the model
// it waits for its driver to start (also when the route is not ready yet
// but another agent, whose view is ahead, forwarded the request). A
// forwarded request is never passed on again.
func (f *Forwarder) where(ctx context.Context, model string, forwarded bool) (Route, placement) {
	if model == "" || f.cfg.Local(model) {
		return Route{Model: model}, servedHere
	}
	rt, ok := f.cfg.Routes.Route(model)
	switch {
	case !ok && !forwarded && f.cfg.Unserved != nil:
		if status, known := f.cfg.Unserved(model); known {
			return Route{Model: model, Status: status}, notReady
		}
		return rt, servedHere
	case !ok:
		return rt, servedHere
	case forwarded && rt.Node != f.cfg.Self:
		// Passed on by an agent whose route was older than this one's
		// (the driver moved away from here a moment ago): not "does not
		// exist", which clients do not retry; a forwarded request is
		// never passed on again.
		return rt, moved
	case rt.Node == f.cfg.Self && (rt.Ready || forwarded) && f.awaitDriver(ctx, rt.Model):
		return rt, servedHere
	case rt.Node != f.cfg.Self && rt.Ready:
		return rt, drivenElsewhere
	}
	return rt, notReady
}

// notReadyRefusal says why a request for rt's model cannot run yet. A plan
// being (re)loaded is ready in seconds: clients that honour Retry-After
// (the OpenAI SDKs retry 503) come back. A model without a plan (no
// driver in rt) is told by its status and reason; one the cluster cannot
// serve as it is (unservable, failed) may be served once nodes join or an
// operator acts, so clients are asked to come back later.
func notReadyRefusal(rt Route) *openai.Refusal {
	e := &openai.Refusal{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "model_not_ready", RetryAfter: 2,
		Message: fmt.Sprintf("model %s is spread over the cluster and not served yet (%s; driver %s)", rt.Model, rt.Status, rt.NodeName)}
	stuck := strings.HasPrefix(rt.Status, "unservable") || strings.HasPrefix(rt.Status, "failed")
	if stuck {
		e.RetryAfter = 30
	}
	if rt.Node == "" || stuck {
		e.Message = fmt.Sprintf("model %s is not served: %s", rt.Model, rt.Status)
	}
	return e
}

// awaitDriver waits until this agent serves model (its driver started),
// ctx ends, the model is planned elsewhere, or driverStartWait passes.
func (f *Forwarder) awaitDriver(ctx context.Context, model string) bool {
	deadline := time.Now().Add(driverStartWait)
	for {
		if f.cfg.Local(model) {
			return true
		}
		if rt, ok := f.cfg.Routes.Route(model); !ok || rt.Node != f.cfg.Self || time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Admin passes the admin API's logits and benchmark requests for a model
// spread over the cluster to the agent that drives it.
func (f *Forwarder) Admin(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, forwarded := forwardedOf(r)
		rt, ok := f.cfg.Routes.Route(r.PathValue("name"))
		addr := ""
		if !forwarded && ok && rt.Node != f.cfg.Self {
			addr = f.rpcAddr(rt.Node)
		}
		scope := api.ScopeAdmin
		if r.Method == http.MethodGet {
			scope = api.ScopeRead // what the driver measures, as placement show reads
		}
		if addr == "" || !f.keyAllows(r, scope, rt.Model) {
			local.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxForwardBody+1))
		switch {
		case err != nil:
			adminFail(w, http.StatusBadRequest, "", "reading the request body: "+err.Error())
		case len(body) > maxForwardBody:
			adminFail(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("request body over %d bytes", maxForwardBody))
		default:
			f.send(w, r, forwardTarget{model: rt.Model, name: rt.NodeName, addr: addr}, body, false, adminFail)
		}
	})
}
