package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"time"

	"go.uber.org/zap"
)

// forwardedHeader marks a request one agent passed to another, so that it
// is never passed on twice.
const forwardedHeader = "X-Shoal-Forwarded-By"

// maxForwardBody bounds the body read to find the model name; larger bodies
// go to the local handler, which refuses them with 413.
const maxForwardBody = 4 << 20

// peerModel is a model another agent drives.
type peerModel struct {
	Model    string
	NodeID   string
	NodeName string
	HTTPAddr string
}

// forwarding wraps the OpenAI handler: a completion for a model this agent
// does not serve goes to the agent that drives it, streaming passed
// through as it comes; /v1/models lists the models of the whole cluster.
func (a *Agent) forwarding(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && (r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/completions"):
			body, err := io.ReadAll(io.LimitReader(r.Body, maxForwardBody+1))
			r.Body.Close()
			if err != nil {
				http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var probe struct {
				Model string `json:"model"`
			}
			forwarded := r.Header.Get(forwardedHeader) != ""
			if len(body) <= maxForwardBody && json.Unmarshal(body, &probe) == nil && probe.Model != "" {
				if _, ok := a.models.Model(probe.Model); !ok {
					if rt, ok := a.distRoute(probe.Model); ok && (!forwarded || rt.Node == a.id) {
						a.toDistDriver(w, r, rt, local)
						return
					}
				}
			}
			local.ServeHTTP(w, r)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/models" && r.Header.Get(forwardedHeader) == "":
			a.listClusterModels(w, r, local)
		default:
			local.ServeHTTP(w, r)
		}
	})
}

func (a *Agent) proxy(w http.ResponseWriter, r *http.Request, p peerModel) {
	a.proxyTo(w, r, p.HTTPAddr, func(w http.ResponseWriter, err error) {
		openAIError(w, http.StatusBadGateway, "server_error", "upstream_unavailable",
			"the agent serving model "+p.Model+" ("+p.NodeName+") did not answer: "+err.Error())
	})
}

// proxyTo passes r to the agent at addr, marked as forwarded, streaming
// the answer as it comes; fail answers when that agent cannot be reached.
func (a *Agent) proxyTo(w http.ResponseWriter, r *http.Request, addr string, fail func(w http.ResponseWriter, err error)) {
	target := &url.URL{Scheme: "http", Host: addr}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set(forwardedHeader, a.id)
		},
		FlushInterval: -1, // stream server-sent events as they come
		ErrorHandler:  func(w http.ResponseWriter, r *http.Request, err error) { fail(w, err) },
	}
	a.log.Debug("forwarding request", zap.String("to", addr), zap.String("path", r.URL.Path))
	rp.ServeHTTP(w, r)
}

func openAIError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
}

// driverStartWait bounds how long a completion for a model this agent is
// planned to drive waits for its driver to start: the plan turns ready
// (every shard loaded) a moment before the driver has opened its session.
const driverStartWait = 15 * time.Second

// toDistDriver forwards a completion for a model spread over the cluster
// to the agent that drives it, serves it here once this agent's driver is
// up (waiting also when another agent, whose view is ahead, forwarded it),
// or says why it cannot run yet.
func (a *Agent) toDistDriver(w http.ResponseWriter, r *http.Request, rt distRoute, local http.Handler) {
	if rt.Node == a.id && (rt.Ready || r.Header.Get(forwardedHeader) != "") && a.awaitDriver(r, rt.Model) {
		local.ServeHTTP(w, r)
		return
	}
	switch {
	case rt.Node == a.id || !rt.Ready || rt.HTTPAddr == "":
		openAIError(w, http.StatusServiceUnavailable, "server_error", "model_not_ready",
			fmt.Sprintf("model %s is spread over the cluster and not served yet (%s; driver %s)", rt.Model, rt.Status, rt.NodeName))
	default:
		a.proxy(w, r, peerModel{Model: rt.Model, NodeID: rt.Node, NodeName: rt.NodeName, HTTPAddr: rt.HTTPAddr})
	}
}

// awaitDriver waits until this agent serves model (its driver started),
// the request ends, the model is planned elsewhere, or driverStartWait
// passes.
func (a *Agent) awaitDriver(r *http.Request, model string) bool {
	deadline := time.Now().Add(driverStartWait)
	for {
		if _, ok := a.models.Model(model); ok {
			return true
		}
		if rt, ok := a.distRoute(model); !ok || rt.Node != a.id || time.Now().After(deadline) {
			return false
		}
		select {
		case <-r.Context().Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// adminToDriver passes the admin API's logits and benchmark requests for a
// model spread over the cluster to the agent that drives it.
func (a *Agent) adminToDriver(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt, ok := a.distRoute(r.PathValue("name"))
		if r.Header.Get(forwardedHeader) != "" || !ok || rt.Node == a.id || rt.HTTPAddr == "" {
			local.ServeHTTP(w, r)
			return
		}
		a.proxyTo(w, r, rt.HTTPAddr, func(w http.ResponseWriter, err error) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf("the agent driving model %s (%s) did not answer: %v", rt.Model, rt.NodeName, err)})
		})
	})
}

// listClusterModels answers /v1/models with the local models followed by
// those other agents serve.
func (a *Agent) listClusterModels(w http.ResponseWriter, r *http.Request, local http.Handler) {
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
	seen := map[string]bool{}
	for _, m := range list.Data {
		if id, ok := m["id"].(string); ok {
			seen[id] = true
		}
	}
	for _, rt := range a.distRoutes() {
		if seen[rt.Model] || !rt.Ready || rt.Node == a.id {
			continue
		}
		seen[rt.Model] = true
		list.Data = append(list.Data, map[string]any{"id": rt.Model, "object": "model", "created": 0, "owned_by": rt.NodeName, "shoal.served_by": rt.NodeName})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}
