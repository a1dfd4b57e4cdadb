package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/gateway"
	"shoal/parallel"
	"shoal/transport"
)

// maxForwardBody bounds the body read to find the model name; larger bodies
// go to the local handler, which refuses them with 413.
const maxForwardBody = transport.MaxForwardBody

// forwarder passes OpenAI requests for a model this agent does not serve,
// and the admin API's runs of a model spread over the cluster, to the agent
// that serves or drives it over the node transport (forwardstream.go). The
// body is decoded once, here, to read the model name, which travels beside
// the raw body; the receiving agent does not decode it again to route it.
type forwarder struct {
	self    string
	ep      *transport.Endpoint
	log     *zap.Logger
	members func() []coordinator.Member // the gossip view, for peers' QUIC addresses
	local   func(model string) bool     // this agent serves model itself
	// keyModels gives the models an API key is limited to (none: all).
	keyModels func(ctx context.Context, key string, list bool) ([]string, error)
	// authorize checks a request's key for scope (and, for inference,
	// model) here, before the request leaves without it.
	authorize func(ctx context.Context, key string, scope api.Scope, model string) error
	routes    routeSource
	// keepAlive is the idle interval of forwarded streams (0: the
	// OpenAI endpoint's default).
	keepAlive time.Duration
	// gw passes completions to drivers as tokens (gateway.go); nil: as
	// HTTP only.
	gw *gateway.Client
}

// routeSource says where the driver of each planned model runs.
type routeSource interface {
	Route(model string) (parallel.Route, bool)
	Routes() []parallel.Route
}

// newForwarder wires the forwarder.
func (a *Agent) newForwarder() *forwarder {
	return &forwarder{
		self: a.id, ep: a.ep, log: a.log.Named("forward"), members: a.gossip.Members, routes: a.par,
		local:     func(model string) bool { _, ok := a.models.Model(model); return ok },
		keyModels: a.admin.InferenceKey,
		authorize: func(ctx context.Context, key string, scope api.Scope, model string) error {
			if scope != api.ScopeInference {
				return a.admin.Authorize(ctx, key, scope)
			}
			models, err := a.admin.InferenceKey(ctx, key, false)
			if err == nil && len(models) > 0 && !slices.Contains(models, model) {
				err = fmt.Errorf("the key may not use model %s", model)
			}
			return err
		},
	}
}

// keyAllows checks the request's API key for scope at this agent; a
// request it refuses goes to the local handler, which answers the refusal
// as it answers any other.
func (f *forwarder) keyAllows(r *http.Request, scope api.Scope, model string) bool {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && f.authorize != nil && f.authorize(r.Context(), strings.TrimSpace(key), scope, model) == nil
}

// rpcAddr is the QUIC address of an alive peer, or "".
func (f *forwarder) rpcAddr(id string) string {
	for _, m := range f.members() {
		if m.ID == id && m.Status == coordinator.StatusAlive {
			return m.RPCAddr
		}
	}
	return ""
}

// openAI wraps the OpenAI handler: a completion for a model this agent
// does not serve goes to the agent that drives it, streaming passed
// through as it comes; /v1/models lists the models of the whole cluster.
func (f *forwarder) openAI(local http.Handler) http.Handler {
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
				openAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "reading the request body: "+err.Error())
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
func (f *forwarder) route(w http.ResponseWriter, r *http.Request, local http.Handler, model string, body []byte, forwarded bool) {
	if model == "" || f.local(model) {
		local.ServeHTTP(w, r)
		return
	}
	if rt, ok := f.routes.Route(model); ok && (!forwarded || rt.Node == f.self) {
		f.toDistDriver(w, r, rt, body, local, forwarded)
		return
	}
	local.ServeHTTP(w, r)
}

func openAIError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(openAIErrorBody(typ, code, msg))
}

func openAIErrorBody(typ, code, msg string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
}

// openAIFail answers a request the serving agent could not take.
func openAIFail(w http.ResponseWriter, status int, code, msg string) {
	openAIError(w, status, "server_error", code, msg)
}

// adminFail answers an admin API request the driver could not take.
func adminFail(w http.ResponseWriter, status int, _, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// driverStartWait bounds how long a completion for a model this agent is
// planned to drive waits for its driver to start: the plan turns ready
// (every shard loaded) a moment before the driver has opened its session.
const driverStartWait = 15 * time.Second

// toDistDriver forwards a completion for a model spread over the cluster
// to the agent that drives it, serves it here once this agent's driver is
// up (waiting also when another agent, whose view is ahead, forwarded it),
// or says why it cannot run yet.
func (f *forwarder) toDistDriver(w http.ResponseWriter, r *http.Request, rt parallel.Route, body []byte, local http.Handler, forwarded bool) {
	if rt.Node == f.self && (rt.Ready || forwarded) && f.awaitDriver(r, rt.Model) {
		local.ServeHTTP(w, r)
		return
	}
	addr := ""
	if rt.Node != f.self && rt.Ready {
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
		openAIError(w, http.StatusServiceUnavailable, "server_error", "model_not_ready",
			fmt.Sprintf("model %s is spread over the cluster and not served yet (%s; driver %s)", rt.Model, rt.Status, rt.NodeName))
		return
	}
	f.send(w, r, target{model: rt.Model, name: rt.NodeName, addr: addr}, body, openAIFail)
}

// awaitDriver waits until this agent serves model (its driver started),
// the request ends, the model is planned elsewhere, or driverStartWait
// passes.
func (f *forwarder) awaitDriver(r *http.Request, model string) bool {
	deadline := time.Now().Add(driverStartWait)
	for {
		if f.local(model) {
			return true
		}
		if rt, ok := f.routes.Route(model); !ok || rt.Node != f.self || time.Now().After(deadline) {
			return false
		}
		select {
		case <-r.Context().Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// admin passes the admin API's logits and benchmark requests for a model
// spread over the cluster to the agent that drives it.
func (f *forwarder) admin(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, forwarded := forwardedOf(r)
		rt, ok := f.routes.Route(r.PathValue("name"))
		addr := ""
		if !forwarded && ok && rt.Node != f.self {
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
			f.send(w, r, target{model: rt.Model, name: rt.NodeName, addr: addr}, body, adminFail)
		}
	})
}

// listClusterModels answers /v1/models with the local models followed by
// those other agents serve.
// allowedModels are the models the request's key is limited to (none: any).
func (f *forwarder) allowedModels(r *http.Request) []string {
	if key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && f.keyModels != nil {
		allowed, _ := f.keyModels(r.Context(), strings.TrimSpace(key), true)
		return allowed
	}
	return nil
}

// getClusterModel answers GET /v1/models/NAME for a model another agent
// serves as the list does (this agent's own answer otherwise).
func (f *forwarder) getClusterModel(w http.ResponseWriter, r *http.Request, local http.Handler) {
	rec := httptest.NewRecorder()
	local.ServeHTTP(rec, r)
	if rec.Code == http.StatusNotFound {
		name := strings.TrimPrefix(r.URL.Path, "/v1/models/")
		allowed := f.allowedModels(r)
		for _, rt := range f.routes.Routes() {
			if rt.Ready && rt.Node != f.self && rt.Model == name && (len(allowed) == 0 || slices.Contains(allowed, rt.Model)) {
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(map[string]any{"id": rt.Model, "object": "model", "created": 0, "owned_by": rt.NodeName, "shoal.served_by": rt.NodeName})
				return
			}
		}
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

func (f *forwarder) listClusterModels(w http.ResponseWriter, r *http.Request, local http.Handler) {
	rec := httptest.NewRecorder()
	local.ServeHTTP(rec, r)
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
		return
	}
	// The local list passed the key; a key limited to models sees only
	// those of the other agents' models too.
	allowed := f.allowedModels(r)
	seen := map[string]bool{}
	for _, m := range list.Data {
		if id, ok := m["id"].(string); ok {
			seen[id] = true
		}
	}
	for _, rt := range f.routes.Routes() {
		if rt.Ready && rt.Node != f.self && !seen[rt.Model] && (len(allowed) == 0 || slices.Contains(allowed, rt.Model)) {
			seen[rt.Model] = true
			list.Data = append(list.Data, map[string]any{"id": rt.Model, "object": "model", "created": 0, "owned_by": rt.NodeName, "shoal.served_by": rt.NodeName})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}
