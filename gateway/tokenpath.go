package gateway

import (
	"net/http"

	"go.uber.org/zap"

	"shoal/api/openai"
)

// The token path: a completion for a model another agent drives is served
// here by the OpenAI endpoint with the model's vocabulary and a Submitter
// that passes the tokens to the driver (Client), so that the answer's
// events are written once, here, and a generation whose driver is lost is
// resubmitted from the tokens it has. Drivers that do not take it (agents
// of an older version), and the other requests the Forwarder passes on,
// still go as HTTP (forwardsend.go).

// StartTokenPath makes the Forwarder pass completions to drivers as
// tokens, fetching each model's vocabulary from its driver.
func (f *Forwarder) StartTokenPath() {
	f.gw = NewClient(Config{Endpoint: f.cfg.Endpoint, Route: f.gatewayRoute, Local: OpenAIVocab})
}

// gatewayRoute is where the driver of model runs now, if it is ready.
func (f *Forwarder) gatewayRoute(model string) (Target, bool) {
	rt, ok := f.cfg.Routes.Route(model)
	if !ok || !rt.Ready {
		return Target{}, false
	}
	addr := f.rpcAddr(rt.Node)
	return Target{Addr: addr, Node: rt.Node, Name: rt.NodeName}, addr != ""
}

// viaGateway serves a completion for model, which the agent at addr
// drives, with the token path: true when it did. False when the driver
// does not take it or its vocabulary could not be fetched: the caller
// passes the HTTP request on instead.
func (f *Forwarder) viaGateway(w http.ResponseWriter, r *http.Request, local http.Handler, model string) bool {
	if f.gw == nil || r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/v1/completions" {
		return false
	}
	if _, err := f.gw.Model(r.Context(), model); err != nil {
		f.cfg.Log.Debug("no token path to the driver; passing the request on", zap.String("model", model), zap.Error(err))
		return false
	}
	local.ServeHTTP(w, r)
	return true
}

// Backend is what the OpenAI endpoint serves: the models this agent runs
// (local), then those other agents drive whose vocabulary is here.
func (f *Forwarder) Backend(local *openai.StaticBackend) openai.Backend {
	return frontBackend{local: local, gw: func() *Client { return f.gw }}
}

// frontBackend is what the OpenAI endpoint serves: the models this agent
// runs, then those other agents drive whose vocabulary is here (only the
// forwarder sends their requests to the endpoint; /v1/models lists them
// from the routes, listClusterModels).
type frontBackend struct {
	local *openai.StaticBackend
	gw    func() *Client
}

func (b frontBackend) Models() []*openai.Model { return b.local.Models() }

func (b frontBackend) Model(name string) (*openai.Model, bool) {
	if m, ok := b.local.Model(name); ok {
		return m, true
	}
	if gw := b.gw(); gw != nil {
		return gw.Cached(name)
	}
	return nil, false
}
