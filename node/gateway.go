package node

import (
	"net/http"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/gateway"
)

// The token path (gateway/): a completion for a model another agent
// drives is served here by the OpenAI endpoint with the model's
// vocabulary and a Submitter that passes the tokens to the driver, so
// that the answer's events are written once, here, and a generation whose
// driver is lost is resubmitted from the tokens it has. Drivers that do
// not take it (agents of an older version), and the other requests the
// forwarder passes on, still go as HTTP (forwardstream.go).

// startGateway serves the models this agent drives to the other agents'
// gateways and makes this agent's client of theirs.
func (a *Agent) startGateway() {
	gateway.Serve(a.ep, a.pub.gatewayModel)
	a.fwd.gw = gateway.NewClient(gateway.Config{Endpoint: a.ep, Route: a.fwd.gatewayRoute, Local: gateway.OpenAIVocab})
}

// gatewayRoute is where the driver of model runs now, if it is ready.
func (f *forwarder) gatewayRoute(model string) (gateway.Target, bool) {
	rt, ok := f.routes.Route(model)
	if !ok || !rt.Ready {
		return gateway.Target{}, false
	}
	addr := f.rpcAddr(rt.Node)
	return gateway.Target{Addr: addr, Node: rt.Node, Name: rt.NodeName}, addr != ""
}

// viaGateway serves a completion for model, which the agent at addr
// drives, with the token path: true when it did. False when the driver
// does not take it or its vocabulary could not be fetched: the caller
// passes the HTTP request on instead.
func (f *forwarder) viaGateway(w http.ResponseWriter, r *http.Request, local http.Handler, model string) bool {
	if f.gw == nil || r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/v1/completions" {
		return false
	}
	if _, err := f.gw.Model(r.Context(), model); err != nil {
		f.log.Debug("no token path to the driver; passing the request on", zap.String("model", model), zap.Error(err))
		return false
	}
	local.ServeHTTP(w, r)
	return true
}

// frontBackend is what the OpenAI endpoint serves: the models this agent
// runs, then those other agents drive whose vocabulary is here (only the
// forwarder sends their requests to the endpoint; /v1/models lists them
// from the routes, listClusterModels).
type frontBackend struct {
	local *openai.StaticBackend
	gw    func() *gateway.Client
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

// serveEncoders loads the embedding models among the --model files and
// puts them on the endpoint.
func (a *Agent) serveEncoders() error {
	for _, e := range a.encoders {
		m, closeFn, err := gateway.OpenEmbedding(e, a.cfg.Name, a.log)
		if err != nil {
			return err
		}
		a.encoderClosers = append(a.encoderClosers, closeFn)
		a.models.Set(m)
	}
	return nil
}
