package gateway

import (
	"context"
	"net/http"

	"go.uber.org/zap"

	"shoal/api/openai"
)

// The token path: a completion for a model another agent drives is served
// here by the OpenAI endpoint, whose Backend resolves the model to one with
// the driver's vocabulary and a Submitter that passes the tokens to the
// driver (Client), so that the answer's events are written once, here, and
// a generation whose driver is lost is resubmitted from the tokens it has.
// Drivers that do not take it (agents of an older version), or whose
// vocabulary could not be fetched, get the HTTP request as the endpoint
// read it (openai.PassOn, forwardsend.go).

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

// Backend is what the OpenAI endpoint serves: the models this agent runs
// (local), and, for a completion, the model another agent drives.
func (f *Forwarder) Backend(local *openai.StaticBackend) openai.Backend {
	return frontBackend{f: f, local: local}
}

// frontBackend is what the OpenAI endpoint serves: the models this agent
// runs; for a completion (Resolve) the model the route says, waiting for
// this agent's driver, served with another driver's vocabulary, or passed
// on; for the other routes, the models whose vocabulary is here
// (/v1/models lists the cluster's from the routes, listClusterModels).
type frontBackend struct {
	f     *Forwarder
	local *openai.StaticBackend
}

func (b frontBackend) Models() []*openai.Model { return b.local.Models() }

func (b frontBackend) Model(name string) (*openai.Model, bool) {
	if m, ok := b.local.Model(name); ok {
		return m, true
	}
	if gw := b.f.gw; gw != nil {
		return gw.Cached(name)
	}
	return nil, false
}

// Resolve is the model of a completion: this agent's (once its driver is
// up), the model another agent drives on the token path, or the request
// passed on as HTTP; a model planned but not ready is refused with 503.
// The endpoint checked the user's key for the model before.
func (b frontBackend) Resolve(ctx context.Context, name string) (*openai.Model, error) {
	_, forwarded := ForwardedModel(ctx)
	rt, p := b.f.where(ctx, name, forwarded)
	switch p {
	case servedHere:
		if m, ok := b.Model(name); ok {
			return m, nil
		}
		return nil, openai.ErrNoModel
	case drivenElsewhere:
		if addr := b.f.rpcAddr(rt.Node); addr != "" {
			return b.f.viaGateway(ctx, rt, addr)
		}
	}
	return nil, refusal(rt, p)
}

// viaGateway is rt's model, which the agent at addr drives, served here
// on the token path (its vocabulary fetched once per model, within ctx);
// when the driver does not take it or its vocabulary could not be
// fetched, a PassOn that passes the HTTP request on, with the body the
// endpoint read.
func (f *Forwarder) viaGateway(ctx context.Context, rt Route, addr string) (*openai.Model, error) {
	if f.gw != nil {
		m, err := f.gw.Model(ctx, rt.Model)
		if err == nil {
			return m, nil
		}
		f.cfg.Log.Debug("no token path to the driver; passing the request on", zap.String("model", rt.Model), zap.Error(err))
	}
	to := forwardTarget{model: rt.Model, name: rt.NodeName, addr: addr}
	return nil, &openai.PassOn{Serve: func(w http.ResponseWriter, r *http.Request, body []byte, stream bool) {
		f.send(w, r, to, body, stream, openAIFail)
	}}
}
