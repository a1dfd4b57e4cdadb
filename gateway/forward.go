package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
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
	// KeepAlive is the idle interval of forwarded streams (0: the
	// OpenAI endpoint's default).
	KeepAlive time.Duration
}

// Forwarder passes OpenAI requests for a model this agent does not serve,
// and the admin API's runs of a model spread over the cluster, to the agent
// that serves or drives it: at the token level when it can (tokenpath.go),
// else as HTTP over the node transport (forwardsend.go). The body is
// decoded once, here, to read the model name, which travels beside the raw
// body; the receiving agent does not decode it again to route it.
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

// OpenAI wraps the OpenAI handler: a completion for a model this agent
// does not serve goes to the agent that drives it, streaming passed
// through as it comes; /v1/models lists the models of the whole cluster.
func (f *Forwarder) OpenAI(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && forwardable(r.Method, r.URL.Path) && !strings.HasPrefix(r.URL.Path, "/v1/cluster/"):
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

// route serves a completion for model here or passes it on. A forwarded
// request is never passed on again.
func (f *Forwarder) route(w http.ResponseWriter, r *http.Request, local http.Handler, model string, body []byte, forwarded bool) {
	if model == "" || f.cfg.Local(model) {
		local.ServeHTTP(w, r)
		return
	}
	if rt, ok := f.cfg.Routes.Route(model); ok && (!forwarded || rt.Node == f.cfg.Self) {
		f.toDistDriver(w, r, rt, body, local, forwarded)
		return
	}
	local.ServeHTTP(w, r)
}

// driverStartWait bounds how long a completion for a model this agent is
// planned to drive waits for its driver to start: the plan turns ready
// (every shard loaded) a moment before the driver has opened its session.
const driverStartWait = 15 * time.Second

// toDistDriver forwards a completion for a model spread over the cluster
// to the agent that drives it, serves it here once this agent's driver is
// up (waiting also when another agent, whose view is ahead, forwarded it),
// or says why it cannot run yet.
func (f *Forwarder) toDistDriver(w http.ResponseWriter, r *http.Request, rt Route, body []byte, local http.Handler, forwarded bool) {
	if rt.Node == f.cfg.Self && (rt.Ready || forwarded) && f.awaitDriver(r, rt.Model) {
		local.ServeHTTP(w, r)
		return
	}
	addr := ""
	if rt.Node != f.cfg.Self && rt.Ready {
		if !f.keyAllows(r, api.ScopeInference, rt.Model) {
			local.ServeHTTP(w, r)
			return
		}
		addr = f.rpcAddr(rt.Node)
		if addr != "" && f.viaGateway(w, r, local, rt.Model) {
			return
		}
	}
	if addr == "" {
		// A plan being (re)loaded is ready in seconds: clients that
		// honour Retry-After (the OpenAI SDKs retry 503) come back.
		w.Header().Set("Retry-After", "2")
		OpenAIError(w, http.StatusServiceUnavailable, "server_error", "model_not_ready",
			fmt.Sprintf("model %s is spread over the cluster and not served yet (%s; driver %s)", rt.Model, rt.Status, rt.NodeName))
		return
	}
	f.send(w, r, forwardTarget{model: rt.Model, name: rt.NodeName, addr: addr}, body, openAIFail)
}

// awaitDriver waits until this agent serves model (its driver started),
// the request ends, the model is planned elsewhere, or driverStartWait
// passes.
func (f *Forwarder) awaitDriver(r *http.Request, model string) bool {
	deadline := time.Now().Add(driverStartWait)
	for {
		if f.cfg.Local(model) {
			return true
		}
		if rt, ok := f.cfg.Routes.Route(model); !ok || rt.Node != f.cfg.Self || time.Now().After(deadline) {
			return false
		}
		select {
		case <-r.Context().Done():
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
		if addr == "" || !f.keyAllows(r, api.ScopeAdmin, rt.Model) {
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
			f.send(w, r, forwardTarget{model: rt.Model, name: rt.NodeName, addr: addr}, body, adminFail)
		}
	})
}
