package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"shoal/api"
	"shoal/api/dashboard"
	"shoal/api/openai"
	"shoal/catalog"
	"shoal/coordinator"
	"shoal/disagg"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/gateway"
	"shoal/internal/version"
	"shoal/node/links"
	"shoal/node/metrics"
	"shoal/parallel"
	"shoal/serve"
	"shoal/transport"
)

// localModel is the --model configuration of name, if any.
func (a *Agent) localModel(name string) (ModelConfig, bool) {
	for _, mc := range a.cfg.Models {
		if mc.ServedName() == name {
			return mc, true
		}
	}
	return ModelConfig{}, false
}

// localRequests checks every --model file and turns it into a load
// request: an absolute path, and a KV cache of mc.Ctx tokens (default the
// model's context, at most 8192) reserved as the plan's context.
func (a *Agent) localRequests() ([]api.LoadModelRequest, error) {
	var out []api.LoadModelRequest
	for _, mc := range a.cfg.Models {
		if err := mc.Validate(); err != nil {
			return nil, err
		}
		path, err := filepath.Abs(mc.Path)
		if err != nil {
			return nil, err
		}
		if err := catalog.CheckModelFile(path); err != nil {
			return nil, fmt.Errorf("--model %s: %v: give the path of a GGUF file", path, err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		if model.IsEncoder(f) {
			f.Close()
			a.encoders = append(a.encoders, gateway.Embedding{Name: mc.ServedName(), Path: path, Threads: mc.Threads})
			continue
		}
		if pool, ok := model.DecoderPooling(f); ok {
			// A decoder that pools (Qwen3-Embedding style) embeds; it
			// does not generate.
			f.Close()
			a.encoders = append(a.encoders, gateway.Embedding{Name: mc.ServedName(), Path: path, Threads: mc.Threads, Decoder: true, Pooling: pool, Ctx: mc.Ctx})
			continue
		}
		cfg, err := model.ConfigFromGGUF(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if mc.Draft != "" {
			if err := catalog.CheckModelFile(mc.Draft); err != nil {
				return nil, fmt.Errorf("--draft %s: %v: give the path of a GGUF file", mc.Draft, err)
			}
			if err := serve.CheckDraft(mc.Draft, path); err != nil {
				return nil, err
			}
		}
		ctx := mc.Ctx
		if ctx == 0 {
			ctx = min(cfg.NCtx, 8192)
		}
		out = append(out, api.LoadModelRequest{Path: path, Name: mc.ServedName(), Ctx: ctx})
	}
	return out, nil
}

// registerLocal registers the --model files in the cluster state, each
// pinned to this node, retrying until the cluster has a leader.
func (a *Agent) registerLocal(reqs []api.LoadModelRequest) {
	defer a.bg.Done()
	for _, req := range reqs {
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := a.catalog.RegisterFile(ctx, req, []string{a.id})
			cancel()
			if err == nil {
				break
			}
			if c := transport.StatusOf(err); c >= 400 && c < 500 {
				a.log.Error("cannot serve --model", zap.String("model", req.Name), zap.Error(err))
				break
			}
			a.log.Debug("registering --model; retrying", zap.String("model", req.Name), zap.Error(err))
			select {
			case <-a.done:
				return
			case <-time.After(backoff):
			}
		}
	}
}

// serveOptions are the scheduler options of a model this node drives:
// a --model of this node keeps its settings (--max-seqs sequences share
// its --ctx); any other runs at most the sequences its plan reserved KV
// for (model load --max-seqs), each up to the plan's context, and queues
// up to --queue more (4 per sequence by default) before answering 429. A
// model run across nodes advances prefill in short steps beside decoding
// streams, and in long ones (bounded in time) when a prompt is alone.
func (a *Agent) serveOptions(name string, s parallel.Servable) serve.Options {
	if mc, ok := a.localModel(name); ok && s.Runner != nil {
		o := serve.Options{MaxSeqs: mc.MaxSeqs, QueueSize: mc.Queue, NoPrefixCache: mc.NoPrefixCache, Lookup: mc.Lookup}
		if mc.Draft != "" {
			c := s.Runner.Cache().Config()
			d, err := serve.OpenModelDrafter(mc.Draft, mc.Path, mc.Threads, c.NumBlocks*c.BlockSize)
			if err != nil {
				a.log.Error("serving without the draft model", zap.String("model", name), zap.String("draft", mc.Draft), zap.Error(err))
			} else {
				o.Draft, o.DraftMax = d, mc.DraftMax
			}
		}
		return o
	}
	o := serve.Options{MaxSeqs: max(s.Seqs, 1), SeqTokens: s.SeqTokens, QueueSize: queueBound(s.Queue, s.Seqs), Lookup: s.Lookup, Draft: s.Draft, DraftMax: s.DraftMax}
	if s.Runner == nil {
		o.MaxTokens = distMaxTokens
		o.PrefillTokens = distPrefillTokens
		o.PrefillTime = a.cfg.Tuning.DistStep.Or(parallel.DefaultStepTimeout) / 4
	}
	return o
}

// httpHandler routes the OpenAI-compatible endpoint, /metrics, the
// dashboard and the admin API on the one HTTP port.
func (a *Agent) httpHandler() http.Handler {
	mux := http.NewServeMux()
	recent := dashboard.NewRecent(dashboard.DefaultRecent)
	oai := openai.NewHandler(a.fwd.Backend(a.models), openai.Options{
		CheckKey: a.admin.InferenceKey,
		Observer: dashboard.MultiObserver{a.observer, recent},
		Log:      a.log.Named("openai"),
	})
	// Completions go to the endpoint as they come: it decodes them, and
	// its Backend (the forwarder's) finds the model here or at its
	// driver. Embedding models run whole on the agent given them
	// (--model).
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		mux.Handle(p, oai)
	}
	fwd := a.fwd.OpenAI(oai)
	for _, p := range []string{"/v1/models", "/v1/models/", "/tokenize", "/detokenize"} {
		mux.Handle(p, fwd)
	}
	mux.Handle("GET /metrics", a.metricsHandler())
	dash := dashboard.Handler(dashboard.Options{Recent: recent, CheckKey: a.admin.ReadKey, Node: a.cfg.Name, Peers: a.peerTraffic})
	mux.Handle("GET /{$}", dash)
	mux.Handle("/dashboard/", dash)
	admin := api.Handler(a.admin)
	toDriver := a.fwd.Admin(admin)
	mux.Handle("POST /v1/cluster/models/{name}/logits", toDriver)
	mux.Handle("POST /v1/cluster/models/{name}/bench", toDriver)
	mux.Handle("GET /v1/cluster/models/{name}/measured", toDriver)
	mux.Handle("/", admin)
	return a.lifecycleHandler(mux)
}

// metricsHandler serves the Prometheus metrics to a key with the read
// scope (a read or admin key, as the dashboard's data), or to anyone when
// the agent runs with --metrics-public: they name every model and the
// address of every peer.
func (a *Agent) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{})
	if a.cfg.MetricsPublic {
		return h
	}
	refuse := func(w http.ResponseWriter, code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="shoal"`)
		}
		w.WriteHeader(code)
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(api.Error{Error: msg})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		const p = "bearer "
		if len(auth) <= len(p) || !strings.EqualFold(auth[:len(p)], p) || strings.TrimSpace(auth[len(p):]) == "" {
			refuse(w, http.StatusUnauthorized, "missing API key: /metrics needs a read or admin key (Authorization: Bearer <key>), or an agent started with --metrics-public")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := a.admin.ReadKey(ctx, strings.TrimSpace(auth[len(p):])); err != nil {
			code := transport.StatusOf(err)
			if code == http.StatusInternalServerError {
				code = http.StatusForbidden
			}
			refuse(w, code, err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// setupMetrics registers the agent's collectors: the OpenAI endpoint's
// request metrics, each served model's scheduler state, and cluster health.
func (a *Agent) setupMetrics() error {
	a.registry = prometheus.NewRegistry()
	a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	obs, err := openai.NewPrometheusObserver(a.registry)
	if err != nil {
		return err
	}
	a.observer = obs
	a.registry.MustRegister(metrics.Agent(a.metricsSource()), links.NewCollector(a.net, a.gossip.Members), metrics.Control())
	return nil
}

// metricsSource is what the agent's collector reads at each scrape.
func (a *Agent) metricsSource() metrics.Source {
	return metrics.Source{
		Models: func(fn func(string, *serve.Scheduler, *parallel.Engine)) { a.pub.each(fn) },
		KVLink: func() (disagg.LinkStats, bool) {
			if a.kvLink == nil {
				return disagg.LinkStats{}, false
			}
			return a.kvLink.Stats(), true
		},
		Raft: func() (leader, known bool) {
			if a.srv == nil {
				return false, false
			}
			_, addr := a.srv.Leader()
			return a.srv.IsLeader(), addr != ""
		},
		Gossip: func() (alive, other int, ok bool) {
			if a.ml == nil {
				return 0, 0, false
			}
			ms := a.ml.Members()
			for _, m := range ms {
				if m.State == memberlist.StateAlive {
					alive++
				}
			}
			return alive, len(ms) - alive, true
		},
		Build: metrics.Build{Version: a.buildVersion(), Protocol: a.protocols().Max, MinProtocol: a.protocols().Min, Go: runtime.Version()},
		ClusterProtocol: func() (int, bool) {
			if a.srv == nil {
				return 0, false
			}
			p := 0
			a.srv.FSM().View(func(st *coordinator.State) { p = version.Of(st.Protocol) })
			return p, true
		},
	}
}

// buildVersion is the version the agent reports: its configured one, else
// this build's.
func (a *Agent) buildVersion() string {
	if a.cfg.Version != "" {
		return a.cfg.Version
	}
	return version.String()
}

// awaitLocal waits up to d until every --model model is served. Start
// calls it when this agent forms a cluster on its own (bootstrap-expect
// 1): the leader is this agent, which plans the models at once, so Start
// returns serving them as an agent that serves a file should.
func (a *Agent) awaitLocal(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, mc := range a.cfg.Models {
		for {
			if _, ok := a.models.Model(mc.ServedName()); ok {
				break
			}
			if time.Now().After(deadline) {
				a.log.Warn("--model is not served yet; see 'shoal model ls'", zap.String("model", mc.ServedName()))
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-a.done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}
