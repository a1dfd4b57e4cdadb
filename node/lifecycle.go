package node

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/gateway"
)

// The agent's lifecycle as a service manager sees it: ready once it has
// joined, a leader is known and the state lists it alive; draining after
// SIGTERM, when it takes no new requests from clients and lets those in
// flight finish before it leaves.
type lifecycle struct {
	joined     atomic.Bool // gossip joined, or nothing to join
	registered atomic.Bool // the committed state lists this node alive
	// synced is set once the serving loop has applied a state: the
	// agent knows the cluster's models and where they are driven.
	synced    atomic.Bool
	draining  atomic.Bool
	inflight  atomic.Int64 // inference requests in this agent's handlers
	ready     chan struct{}
	readyOnce atomic.Bool
}

// Ready is closed the first time the agent is ready: joined, a leader
// known and this node alive in the committed state (systemd's READY=1).
func (a *Agent) Ready() <-chan struct{} { return a.life.ready }

// IsReady tells whether the agent is ready now (GET /v1/health?ready=1):
// as Ready, and not draining, and a leader known at this moment.
func (a *Agent) IsReady() bool {
	l := &a.life
	if !l.joined.Load() || !l.registered.Load() || !l.synced.Load() || l.draining.Load() {
		return false
	}
	if a.srv != nil {
		_, addr := a.srv.Leader()
		return addr != ""
	}
	return true
}

// noteState records whether the state lists this node alive, and closes
// Ready the first time the agent is ready.
func (a *Agent) noteState(st *coordinator.State) {
	n := st.Nodes[a.id]
	a.life.registered.Store(n != nil && n.Status == coordinator.StatusAlive)
	a.checkReady()
}

func (a *Agent) checkReady() {
	if a.IsReady() && a.life.readyOnce.CompareAndSwap(false, true) {
		close(a.life.ready)
		a.log.Info("ready: joined, leader known, serving")
	}
}

// readyLoop closes Ready once the agent is ready; the serving loop checks
// on every state it reconciles, this on a short timer for what changes
// between (gossip joined, a leader elected).
func (a *Agent) readyLoop() {
	defer a.bg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for !a.life.readyOnce.Load() {
		a.checkReady()
		select {
		case <-a.done:
			return
		case <-t.C:
		}
	}
}

// Draining tells whether Drain has begun.
func (a *Agent) Draining() bool { return a.life.draining.Load() }

// InFlight is the number of inference requests in this agent's handlers,
// those peers passed on included.
func (a *Agent) InFlight() int { return int(a.life.inflight.Load()) }

// Drain stops taking inference requests from clients (they get 503 with
// Retry-After, and readiness turns false so load balancers move on; peers
// may still pass on requests for models this node drives) and waits until
// the requests in flight have finished or ctx ends. It returns how many
// were still running. Shutdown(true) then leaves the cluster.
func (a *Agent) Drain(ctx context.Context) int {
	if a.life.draining.CompareAndSwap(false, true) {
		a.log.Info("draining: no new client requests", zap.Int("in_flight", a.InFlight()))
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		n := a.InFlight()
		if n == 0 {
			a.log.Info("drained: no request in flight")
			return 0
		}
		select {
		case <-ctx.Done():
			a.log.Warn("drain deadline reached; requests still in flight", zap.Int("in_flight", n))
			return n
		case <-a.done:
			return n
		case <-t.C:
		}
	}
}

// lifecycleHandler answers GET /v1/health?ready=1, refuses new inference
// requests from clients while draining and counts those in flight.
func (a *Agent) lifecycleHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" { // llama-server's name for it
			r.URL.Path = "/v1/health"
		}
		if r.URL.Path == "/v1/health" && r.Method == http.MethodGet && r.URL.Query().Has("ready") {
			status, body := http.StatusOK, map[string]string{"status": "ready"}
			if !a.IsReady() {
				status, body = http.StatusServiceUnavailable, map[string]string{"status": a.notReadyReason()}
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(body)
			return
		}
		if !inferencePath(r) {
			next.ServeHTTP(w, r)
			return
		}
		if _, forwarded := gateway.ForwardedModel(r.Context()); !forwarded && a.life.draining.Load() {
			w.Header().Set("Retry-After", "1")
			gateway.OpenAIError(w, http.StatusServiceUnavailable, "server_error", "draining",
				"this node is shutting down and takes no new requests; send it to another node of the cluster")
			return
		}
		a.life.inflight.Add(1)
		defer a.life.inflight.Add(-1)
		next.ServeHTTP(w, r)
	})
}

func (a *Agent) notReadyReason() string {
	l := &a.life
	switch {
	case l.draining.Load():
		return "draining"
	case !l.joined.Load():
		return "joining"
	case !l.registered.Load():
		return "not registered"
	case !l.synced.Load():
		return "starting"
	}
	return "no leader"
}

func inferencePath(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/v1/completions", "/v1/embeddings":
		return true
	}
	return false
}

// Done is closed when the agent has stopped (e.g. after `shoal node rm`).
func (a *Agent) Done() <-chan struct{} { return a.done }

// Shutdown stops the agent. graceful hands off leadership and announces
// the leave to gossip; otherwise the node looks failed to its peers.
func (a *Agent) Shutdown(graceful bool) error {
	a.close(graceful)
	return nil
}

func (a *Agent) close(graceful bool) {
	a.stopOnce.Do(func() {
		close(a.done)
		if graceful && a.srv != nil {
			a.srv.Leave()
		}
		if a.ml != nil {
			if graceful {
				_ = a.ml.Leave(2 * time.Second)
			}
			_ = a.ml.Shutdown()
		}
		if a.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = a.http.Shutdown(ctx)
			cancel()
		} else if a.httpLn != nil {
			_ = a.httpLn.Close()
		}
		if a.par != nil {
			a.par.Close() // the drivers end their requests before the endpoint closes
			if a.kvLink != nil {
				a.kvLink.Close()
			}
		}
		if a.srv != nil {
			if err := a.srv.Shutdown(); err != nil {
				a.log.Warn("raft shutdown", zap.Error(err))
			}
		}
		if a.ep != nil {
			_ = a.ep.Close()
		}
		a.bg.Wait()
		a.net.Close()
		for _, c := range a.encoderClosers {
			_ = c()
		}
		if a.catalog != nil {
			a.catalog.Close()
		}
		a.log.Info("agent stopped", zap.Bool("graceful", graceful))
	})
}
