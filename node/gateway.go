package node

import (
	"context"
	"fmt"
	"slices"

	"shoal/api"
	"shoal/coordinator"
	"shoal/gateway"
	"shoal/parallel"
)

// The request path lives in gateway/: the forwarder's Backend gives the
// OpenAI endpoint the model of each completion (this agent's, or one
// another agent drives, at the token level, else passed on as HTTP over
// the transport), the forwarder routes the tokenizer and admin runs, and a
// model this agent runs is the last hop. This file gives it what it needs
// from the agent.

// newForwarder wires the forwarder.
func (a *Agent) newForwarder() *gateway.Forwarder {
	return gateway.NewForwarder(gateway.ForwarderConfig{
		Self: a.id, Endpoint: a.ep, Log: a.log.Named("forward"), PeerAddr: a.peerAddr, Routes: gatewayRoutes{a.par},
		Local:     func(model string) bool { _, ok := a.models.Model(model); return ok },
		Unserved:  a.unserved,
		KeyModels: a.admin.InferenceKey,
		Authorize: func(ctx context.Context, key string, scope api.Scope, model string) error {
			if scope != api.ScopeInference {
				return a.admin.Authorize(ctx, key, scope)
			}
			models, err := a.admin.InferenceKey(ctx, key, false)
			if err == nil && len(models) > 0 && !slices.Contains(models, model) {
				err = fmt.Errorf("the key may not use model %s", model)
			}
			return err
		},
	})
}

// peerAddr is the QUIC address of an alive peer in the gossip view, or "".
func (a *Agent) peerAddr(id string) string {
	for _, m := range a.gossip.Members() {
		if m.ID == id && m.Status == coordinator.StatusAlive {
			return m.RPCAddr
		}
	}
	return ""
}

// unserved is the status, with its reason, of a model the cluster knows
// but has no plan with nodes for (hashing, planning, unservable, failed), from the
// state this agent read last.
func (a *Agent) unserved(model string) (status string, known bool) {
	if !a.life.synced.Load() {
		// Just started: the cluster's models are not known here yet, and
		// "does not exist" (404, which clients do not retry) would be
		// wrong for one the cluster serves.
		return "starting (this node has just started and has not read the cluster's models yet)", true
	}
	a.viewState(func(st *coordinator.State) {
		m, p := st.Models[model], st.Plans[model]
		if m == nil || p != nil && len(p.Pools) > 0 {
			return // unknown, or planned: its route says more
		}
		mi := a.catalog.ModelInfo(st, m)
		status, known = mi.Status, true
		if mi.Reason != "" {
			status += ": " + mi.Reason
		}
	})
	return status, known
}

// gatewayRoutes gives the forwarder the drivers of the plans.
type gatewayRoutes struct{ p *parallel.Reconciler }

func toGatewayRoute(rt parallel.Route) gateway.Route {
	return gateway.Route{Model: rt.Model, Node: rt.Node, NodeName: rt.NodeName, Ready: rt.Ready, Status: rt.Status}
}

func (g gatewayRoutes) Route(model string) (gateway.Route, bool) {
	rt, ok := g.p.Route(model)
	return toGatewayRoute(rt), ok
}

func (g gatewayRoutes) Routes() []gateway.Route {
	var out []gateway.Route
	for _, rt := range g.p.Routes() {
		out = append(out, toGatewayRoute(rt))
	}
	return out
}

// startGateway serves the models this agent drives to the other agents'
// gateways and makes this agent's client of theirs.
func (a *Agent) startGateway() {
	gateway.Serve(a.ep, a.pub.gatewayModel)
	a.fwd.StartTokenPath()
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
