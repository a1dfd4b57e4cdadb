package node

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"shoal/api"
	"shoal/api/dashboard"
	"shoal/api/openai"
	"shoal/engine/model"
	"shoal/engine/tokenizer"
	"shoal/serve"
)

// ModelConfig is a model this agent serves from a local file with the whole
// model on this machine. (Models spread over the cluster are placed by the
// leader; this is the single-node path.)
type ModelConfig struct {
	Path    string `json:"path"`
	Name    string `json:"name"`     // default: the file name without .gguf
	Ctx     int    `json:"ctx"`      // KV cache capacity in tokens over all sequences (default: min(model's, 8192))
	Threads int    `json:"threads"`  // worker threads (default: all cores)
	MaxSeqs int    `json:"max_seqs"` // sequences decoded together (default 16)
	Queue   int    `json:"queue"`    // requests waiting beyond the batch before 429 (default 64)
	// NoPrefixCache turns off reusing the KV blocks of shared prompt prefixes.
	NoPrefixCache bool `json:"no_prefix_cache,omitempty"`
}

// served is one model this agent runs.
type served struct {
	cfg    ModelConfig
	m      *model.Model
	runner *model.Runner
	sched  *serve.Scheduler
}

func (c *ModelConfig) validate() error {
	if c.Path == "" {
		return fmt.Errorf("--model: a model file path is required")
	}
	if c.Ctx < 0 || c.Threads < 0 || c.MaxSeqs < 0 || c.Queue < 0 {
		return fmt.Errorf("model %s: ctx, threads, max-seqs and queue must not be negative", c.Path)
	}
	return nil
}

func (c *ModelConfig) name() string {
	if c.Name != "" {
		return c.Name
	}
	return strings.TrimSuffix(filepath.Base(c.Path), ".gguf")
}

// loadModels opens every configured model and starts its scheduler.
func (a *Agent) loadModels() error {
	for _, mc := range a.cfg.Models {
		if err := mc.validate(); err != nil {
			return err
		}
		t0 := time.Now()
		m, err := model.Open(mc.Path)
		if err != nil {
			return err
		}
		tok, err := tokenizer.FromGGUF(m.File)
		if err != nil {
			m.Close()
			return fmt.Errorf("%s: %w", mc.Path, err)
		}
		ctx := mc.Ctx
		if ctx == 0 {
			ctx = min(m.NCtx, 8192)
		}
		r, err := model.NewRunner(m, model.Options{Threads: mc.Threads, CacheTokens: ctx})
		if err != nil {
			m.Close()
			return err
		}
		sc, err := serve.New(r, tok.IsEOG, serve.Options{MaxSeqs: mc.MaxSeqs, QueueSize: mc.Queue, NoPrefixCache: mc.NoPrefixCache})
		if err != nil {
			r.Close()
			m.Close()
			return err
		}
		tpl, _ := m.File.String("tokenizer.chat_template")
		a.models.Set(&openai.Model{Name: mc.name(), Tok: tok, ChatTemplate: tpl, Sched: sc, Created: time.Now(), OwnedBy: a.cfg.Name})
		a.served = append(a.served, &served{cfg: mc, m: m, runner: r, sched: sc})
		a.log.Info("serving model", zap.String("model", mc.name()), zap.String("arch", m.Arch.Name),
			zap.Int("layers", m.NLayer), zap.Int("ctx", ctx), zap.Duration("load", time.Since(t0)))
	}
	return nil
}

// closeModels stops the schedulers (ending their requests) and unmaps files.
func (a *Agent) closeModels() {
	for _, s := range a.served {
		s.sched.Close()
		s.runner.Close()
		s.m.Close()
	}
	a.served = nil
}

// httpHandler routes the OpenAI-compatible endpoint, /metrics, the
// dashboard and the admin API on the one HTTP port.
func (a *Agent) httpHandler() http.Handler {
	mux := http.NewServeMux()
	recent := dashboard.NewRecent(dashboard.DefaultRecent)
	oai := openai.NewHandler(a.models, openai.Options{
		CheckKey: a.Authorize,
		Observer: dashboard.MultiObserver{a.observer, recent},
		Log:      a.log.Named("openai"),
	})
	fwd := a.forwarding(oai)
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/"} {
		mux.Handle(p, fwd)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{}))
	dash := dashboard.Handler(dashboard.Options{Recent: recent, CheckKey: a.Authorize})
	mux.Handle("GET /{$}", dash)
	mux.Handle("/dashboard/", dash)
	admin := api.Handler(a)
	toDriver := a.adminToDriver(admin)
	mux.Handle("POST /v1/cluster/models/{name}/logits", toDriver)
	mux.Handle("POST /v1/cluster/models/{name}/bench", toDriver)
	mux.Handle("/", admin)
	return mux
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
	a.registry.MustRegister(&agentCollector{a: a})
	return nil
}

var (
	descQueue     = prometheus.NewDesc("shoal_queue_depth", "Requests waiting for a place in the running batch.", []string{"model"}, nil)
	descRunning   = prometheus.NewDesc("shoal_running_sequences", "Sequences in the running batch.", []string{"model"}, nil)
	descKVUsed    = prometheus.NewDesc("shoal_kv_blocks_used", "KV cache blocks in use.", []string{"model"}, nil)
	descKVFree    = prometheus.NewDesc("shoal_kv_blocks_free", "KV cache blocks free.", []string{"model"}, nil)
	descBatch     = prometheus.NewDesc("shoal_batch_tokens", "Tokens in the last batch step.", []string{"model"}, nil)
	descSteps     = prometheus.NewDesc("shoal_batch_steps_total", "Batch steps run.", []string{"model"}, nil)
	descPreempt   = prometheus.NewDesc("shoal_preemptions_total", "Sequences preempted for lack of KV blocks.", []string{"model"}, nil)
	descKVCached  = prometheus.NewDesc("shoal_kv_blocks_cached", "KV cache blocks registered in the prefix cache (held by sequences or idle and reusable).", []string{"model"}, nil)
	descPrefixHit = prometheus.NewDesc("shoal_prompt_tokens_cached_total", "Prompt tokens read from the prefix cache instead of computed.", []string{"model"}, nil)
	descLeader    = prometheus.NewDesc("shoal_raft_leader", "1 if this agent is the Raft leader.", nil, nil)
	descMembers   = prometheus.NewDesc("shoal_gossip_members", "Gossip members by state as this agent sees them.", []string{"state"}, nil)
	descRaftKnown = prometheus.NewDesc("shoal_raft_leader_known", "1 if this agent knows a Raft leader.", nil, nil)
)

// agentCollector reads live state at scrape time.
type agentCollector struct{ a *Agent }

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descRunning, descKVUsed, descKVFree, descBatch, descSteps, descPreempt, descKVCached, descPrefixHit, descLeader, descMembers, descRaftKnown} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	for _, s := range a.served {
		collectScheduler(ch, s.cfg.name(), s.sched)
	}
	a.pub.each(func(name string, sc *serve.Scheduler) { collectScheduler(ch, name, sc) })
	leader, known := 0.0, 0.0
	if a.srv != nil {
		if a.srv.IsLeader() {
			leader = 1
		}
		if _, addr := a.srv.Leader(); addr != "" {
			known = 1
		}
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(descRaftKnown, prometheus.GaugeValue, known)
	if a.ml != nil {
		alive := 0
		for _, m := range a.ml.Members() {
			if m.State == 0 {
				alive++
			}
		}
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(alive), "alive")
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(len(a.ml.Members())-alive), "other")
	}
}

// collectScheduler sends the state of the scheduler serving model n.
func collectScheduler(ch chan<- prometheus.Metric, n string, sc *serve.Scheduler) {
	st := sc.Stats()
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(st.Waiting), n)
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(st.Running), n)
	ch <- prometheus.MustNewConstMetric(descKVUsed, prometheus.GaugeValue, float64(st.KVBlocksUsed), n)
	ch <- prometheus.MustNewConstMetric(descKVFree, prometheus.GaugeValue, float64(st.KVBlocksTotal-st.KVBlocksUsed), n)
	ch <- prometheus.MustNewConstMetric(descBatch, prometheus.GaugeValue, float64(st.LastBatchTokens), n)
	ch <- prometheus.MustNewConstMetric(descSteps, prometheus.CounterValue, float64(st.Steps), n)
	ch <- prometheus.MustNewConstMetric(descPreempt, prometheus.CounterValue, float64(st.Preemptions), n)
	ch <- prometheus.MustNewConstMetric(descKVCached, prometheus.GaugeValue, float64(st.KVBlocksCached), n)
	ch <- prometheus.MustNewConstMetric(descPrefixHit, prometheus.CounterValue, float64(st.CachedPromptTokens), n)
}
