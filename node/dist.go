package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/api/openai"
	"shoal/coordinator"
	"shoal/engine/bench"
	"shoal/engine/gguf"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/tokenizer"
	"shoal/parallel"
	"shoal/placement"
	"shoal/serve"
	"shoal/shard"
)

// Distributed serving. Every agent runs a parallel.Host on its QUIC endpoint
// and a parallel.Member for each ready shard of a committed plan. One agent per
// model drives it: the node of stage 0, rank 0 (it holds the embedding).
// Once every shard of the plan is ready it opens a session, wraps it in a
// scheduler and serves the model on its OpenAI endpoint; other agents
// forward requests for the model to it. A plan with one node runs the same
// way (the driver steps its own member over its endpoint), so one code path
// serves every plan.
//
// A failed step (a member died or timed out) fails the requests in flight
// with the step's error and tears the session down; the next reconcile
// opens a new one as soon as the plan's members answer, or after the
// leader re-planned and the new shards are ready. A new plan version tears
// down the members and the session of the old one.

const (
	// distRunTimeout bounds one step of the sessions the admin API opens
	// for logits and benchmarks (prefill steps of up to benchChunk tokens).
	distRunTimeout = 2 * time.Minute
	// rpcTimeout bounds a call on the agent's RPC server; dist steps run
	// there, so it exceeds every step timeout.
	rpcTimeout = distRunTimeout + 10*time.Second
	// distMaxTokens is the scheduler's token budget per step of a
	// distributed model: prefill advances in chunks this long, so a step
	// stays well inside the step timeout on slow nodes.
	distMaxTokens = 64
	// benchChunk is the longest prefill step of a cluster benchmark.
	benchChunk = 128
)

// distState is the agent's distributed runtime.
type distState struct {
	rec sync.Mutex // serializes reconcile and close

	mu      sync.Mutex
	closed  bool
	members map[string]*distMember // by shard key
	drivers map[string]*distDriver // by model
	routes  map[string]distRoute   // by model: where its driver runs
	logged  map[string]string      // the last driver error logged, by model
	wake    chan struct{}
}

type distMember struct {
	version uint64
	m       *parallel.Member
}

// distRoute says which node drives a planned model.
type distRoute struct {
	Model    string
	Node     string
	NodeName string
	HTTPAddr string
	Ready    bool   // every shard of the plan is ready
	Status   string // the model's status
}

// distDriver serves one model from this node over its plan.
type distDriver struct {
	name    string
	version uint64
	plan    placement.Plan
	addrs   map[string]string
	ctx     int // KV positions of every member
	meta    *gguf.File
	cluster *parallel.Cluster
	sess    *parallel.Session
	sched   *serve.Scheduler

	run sync.Mutex // one logits or benchmark run at a time

	mu     sync.Mutex
	failed error
}

func (d *distDriver) fail(err error) {
	d.mu.Lock()
	if d.failed == nil {
		d.failed = err
	}
	d.mu.Unlock()
}

func (d *distDriver) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// distEngine is the scheduler's engine: a parallel.Engine that reports a failed
// session to the agent.
type distEngine struct {
	*parallel.Engine
	d *distDriver
	a *Agent
}

func (e *distEngine) Step(b *model.Batch, rows []int) ([]float32, error) {
	logits, err := e.Engine.Step(b, rows)
	if err != nil && !errors.Is(err, kv.ErrFull) {
		e.d.fail(err)
		e.a.wakeDist()
		return nil, fmt.Errorf("model %s runs across nodes and a step failed (it is served again once every node of its plan answers, or the cluster has re-planned): %w", e.d.name, err)
	}
	return logits, err
}

func (a *Agent) wakeDist() {
	select {
	case a.dist.wake <- struct{}{}:
	default:
	}
}

// distStepTimeout bounds a step of a served model.
func (a *Agent) distStepTimeout() time.Duration { return a.cfg.Tuning.DistStep.or(30 * time.Second) }

// driverOf is the node that drives a plan: stage 0, rank 0 of its first
// pool, which holds the embedding.
func driverOf(p *placement.Plan) string {
	if len(p.Pools) == 0 || len(p.Pools[0].Stages) == 0 || len(p.Pools[0].Stages[0].Members) == 0 {
		return ""
	}
	return p.Pools[0].Stages[0].Members[0].Node
}

// planAddrs maps the plan's nodes to their QUIC addresses.
func planAddrs(st *coordinator.State, p *coordinator.Plan) map[string]string {
	out := map[string]string{}
	for _, id := range p.Nodes() {
		if n := st.Nodes[id]; n != nil && n.RPCAddr != "" {
			out[id] = n.RPCAddr
		}
	}
	return out
}

// cacheTokens is the KV capacity every member of a plan gets: the context
// the planner reserved memory for, times its batch.
func cacheTokens(p *placement.Plan) int {
	c := p.Context
	if c <= 0 {
		c = placement.DefaultContext
	}
	return c * max(p.Batch, 1)
}

// reconcileDist brings the members and drivers in line with the state.
func (a *Agent) reconcileDist(st *coordinator.State) {
	a.dist.rec.Lock()
	defer a.dist.rec.Unlock()
	a.dist.mu.Lock()
	closed := a.dist.closed
	a.dist.mu.Unlock()
	if closed || a.host == nil {
		return
	}
	a.reconcileMembers(st)
	routes := map[string]distRoute{}
	for name, m := range st.Models {
		p := st.Plans[name]
		if p == nil || p.Placement == nil {
			continue
		}
		drv := driverOf(p.Placement)
		if drv == "" {
			continue
		}
		mi := a.modelInfo(st, m)
		r := distRoute{Model: name, Node: drv, NodeName: drv, Ready: mi.Status == "ready", Status: mi.Status}
		if mi.Reason != "" {
			r.Status += ": " + mi.Reason
		}
		if n := st.Nodes[drv]; n != nil {
			r.NodeName, r.HTTPAddr = n.Name, n.HTTPAddr
		}
		routes[name] = r
		if drv != a.id {
			continue
		}
		a.dist.mu.Lock()
		d := a.dist.drivers[name]
		a.dist.mu.Unlock()
		if d != nil && (d.version != p.Version || d.err() != nil) {
			why := "plan v" + fmt.Sprint(p.Version)
			if err := d.err(); err != nil {
				why = err.Error()
			}
			a.log.Info("stopping distributed serving", zap.String("model", name), zap.Uint64("version", d.version), zap.String("why", why))
			a.stopDriver(d)
			d = nil
		}
		if d == nil && r.Ready && !a.servesLocally(name) {
			d, err := a.startDriver(st, m, p)
			a.dist.mu.Lock()
			if err != nil {
				if a.dist.logged[name] != err.Error() {
					a.dist.logged[name] = err.Error()
					a.log.Info("cannot serve the distributed model yet; retrying", zap.String("model", name), zap.Error(err))
				}
			} else {
				delete(a.dist.logged, name)
				a.dist.drivers[name] = d
			}
			a.dist.mu.Unlock()
		}
	}
	a.dist.mu.Lock()
	var stale []*distDriver
	for name, d := range a.dist.drivers {
		if r, ok := routes[name]; !ok || r.Node != a.id {
			stale = append(stale, d)
		}
	}
	a.dist.routes = routes
	a.dist.mu.Unlock()
	for _, d := range stale {
		a.log.Info("stopping distributed serving: no longer planned here", zap.String("model", d.name))
		a.stopDriver(d)
	}
}

// servesLocally reports whether name is a model given with --model.
func (a *Agent) servesLocally(name string) bool {
	for _, s := range a.served {
		if s.cfg.name() == name {
			return true
		}
	}
	return false
}

// reconcileMembers runs a parallel.Member for every ready shard of a committed
// plan and closes the others.
func (a *Agent) reconcileMembers(st *coordinator.State) {
	a.shards.mu.Lock()
	jobs := make([]*shardJob, 0, len(a.shards.jobs))
	for _, j := range a.shards.jobs {
		jobs = append(jobs, j)
	}
	a.shards.mu.Unlock()
	keep := map[string]bool{}
	for _, j := range jobs {
		j.mu.Lock()
		ready := j.state == coordinator.ShardReady && j.sh != nil
		version, sh, spec := j.version, j.sh, j.spec
		j.mu.Unlock()
		p := st.Plans[j.model]
		if !ready || p == nil || p.Placement == nil || p.Version != version {
			continue
		}
		keep[j.key] = true
		a.dist.mu.Lock()
		old := a.dist.members[j.key]
		a.dist.mu.Unlock()
		if old != nil && old.version == version {
			continue
		}
		if old != nil {
			a.dropMember(j.key)
		}
		mdl, err := sh.Model()
		if err != nil {
			a.log.Warn("shard cannot run", zap.String("model", j.model), zap.Error(err))
			continue
		}
		m, err := a.host.AddMember(parallel.MemberConfig{Plan: *p.Placement, Node: a.id, Addrs: planAddrs(st, p), Spec: spec,
			Model: mdl, Threads: a.cfg.Threads, CacheTokens: cacheTokens(p.Placement)})
		if err != nil {
			a.log.Warn("shard cannot join its plan", zap.String("model", j.model), zap.Uint64("version", version), zap.Error(err))
			continue
		}
		a.dist.mu.Lock()
		a.dist.members[j.key] = &distMember{version: version, m: m}
		a.dist.mu.Unlock()
		a.log.Info("shard serving its plan", zap.String("model", j.model), zap.Uint64("version", version),
			zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi), zap.Int("tp_rank", spec.TPRank), zap.Int("tp_size", spec.TPSize))
	}
	a.dist.mu.Lock()
	var drop []string
	for key := range a.dist.members {
		if !keep[key] {
			drop = append(drop, key)
		}
	}
	a.dist.mu.Unlock()
	for _, key := range drop {
		a.dropMember(key)
	}
}

// dropMember closes the member running shard key (waiting for its steps),
// before the shard's mapping goes away.
func (a *Agent) dropMember(key string) {
	a.dist.mu.Lock()
	m := a.dist.members[key]
	delete(a.dist.members, key)
	a.dist.mu.Unlock()
	if m != nil {
		m.m.Close()
	}
}

// startDriver opens a session over the plan and serves the model.
func (a *Agent) startDriver(st *coordinator.State, m *coordinator.Model, p *coordinator.Plan) (*distDriver, error) {
	meta, err := a.modelMeta(m.Name)
	if err != nil {
		return nil, err
	}
	d := &distDriver{name: m.Name, version: p.Version, plan: *p.Placement, addrs: planAddrs(st, p), ctx: cacheTokens(p.Placement), meta: meta}
	ok := false
	defer func() {
		if !ok {
			a.stopDriver(d)
		}
	}()
	tok, err := tokenizer.FromGGUF(meta)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if d.cluster, err = a.host.NewCluster(d.plan, d.addrs, parallel.Options{Timeout: a.distStepTimeout()}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d.sess, err = d.cluster.Open(ctx)
	cancel()
	if err != nil {
		return nil, err
	}
	eng, err := parallel.NewEngine(d.sess, d.ctx, 0)
	if err != nil {
		return nil, err
	}
	if d.sched, err = serve.NewEngine(&distEngine{Engine: eng, d: d, a: a}, tok.IsEOG, serve.Options{MaxTokens: distMaxTokens}); err != nil {
		return nil, err
	}
	tpl, _ := meta.String("tokenizer.chat_template")
	a.models.Set(&openai.Model{Name: m.Name, Tok: tok, ChatTemplate: tpl, Sched: d.sched, Created: time.Now(), OwnedBy: a.cfg.Name})
	ok = true
	a.log.Info("serving distributed model", zap.String("model", m.Name), zap.Uint64("version", p.Version),
		zap.String("strategy", d.plan.Strategy), zap.Int("nodes", len(d.addrs)), zap.Int("ctx", d.ctx),
		zap.Float64("predicted_ms_per_token", d.plan.Cost.MsPerToken))
	return d, nil
}

// stopDriver stops serving d's model: requests in flight end with an
// error, the session closes on every member.
func (a *Agent) stopDriver(d *distDriver) {
	a.dist.mu.Lock()
	if a.dist.drivers[d.name] == d {
		delete(a.dist.drivers, d.name)
	}
	a.dist.mu.Unlock()
	if d.sched != nil {
		if m, ok := a.models.Model(d.name); ok && m.Sched == d.sched {
			a.models.Remove(d.name)
		}
		d.sched.Close()
	}
	if d.sess != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = d.sess.Close(ctx)
		cancel()
	}
	if d.meta != nil {
		_ = d.meta.Close()
	}
}

// closeDist stops every driver and member (before the shards unmap).
func (a *Agent) closeDist() {
	a.dist.rec.Lock()
	defer a.dist.rec.Unlock()
	a.dist.mu.Lock()
	a.dist.closed = true
	var ds []*distDriver
	for _, d := range a.dist.drivers {
		ds = append(ds, d)
	}
	var keys []string
	for k := range a.dist.members {
		keys = append(keys, k)
	}
	a.dist.mu.Unlock()
	for _, d := range ds {
		a.stopDriver(d)
	}
	for _, k := range keys {
		a.dropMember(k)
	}
}

// modelMeta returns the model's GGUF metadata (tokenizer, chat template)
// from the local file, or from the header kept in this node's assembled
// shard file.
func (a *Agent) modelMeta(name string) (*gguf.File, error) {
	a.shards.mu.Lock()
	var jobs []*shardJob
	for _, j := range a.shards.jobs {
		if j.model == name {
			jobs = append(jobs, j)
		}
	}
	a.shards.mu.Unlock()
	for _, j := range jobs {
		j.mu.Lock()
		path, sha := j.path, j.spec.FileSHA
		j.mu.Unlock()
		if lf, ok := a.files.get(sha); ok {
			return gguf.Open(lf.Path)
		}
		if path == "" {
			continue
		}
		hdr, err := shard.Header(path)
		if err != nil {
			return nil, err
		}
		return gguf.ParseHeader(hdr)
	}
	return nil, fmt.Errorf("no shard of %s on this node", name)
}

// distRoute returns where model's driver runs, if it is planned.
func (a *Agent) distRoute(model string) (distRoute, bool) {
	a.dist.mu.Lock()
	defer a.dist.mu.Unlock()
	r, ok := a.dist.routes[model]
	return r, ok
}

func (a *Agent) distRoutes() []distRoute {
	a.dist.mu.Lock()
	defer a.dist.mu.Unlock()
	out := make([]distRoute, 0, len(a.dist.routes))
	for _, r := range a.dist.routes {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// localDriver returns the driver of model on this node, or an error that
// says where the model is or why it is not served.
func (a *Agent) localDriver(model string) (*distDriver, error) {
	a.dist.mu.Lock()
	d := a.dist.drivers[model]
	r, planned := a.dist.routes[model]
	a.dist.mu.Unlock()
	switch {
	case d != nil && d.err() == nil:
		return d, nil
	case !planned:
		return nil, notFoundErr("model %q is not loaded on the cluster (see 'shoal model ls')", model)
	case r.Node != a.id:
		return nil, &coordinator.Error{Code: http.StatusMisdirectedRequest, Msg: fmt.Sprintf("model %q is driven by node %s", model, r.NodeName)}
	}
	return nil, &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("model %q is not served yet (%s)", model, r.Status)}
}

// openRun opens a session of its own for a logits or benchmark run, so the
// counters and KV caches of served requests stay apart.
func (a *Agent) openRun(ctx context.Context, d *distDriver) (*parallel.Cluster, *parallel.Session, error) {
	c, err := a.host.NewCluster(d.plan, d.addrs, parallel.Options{Timeout: distRunTimeout})
	if err != nil {
		return nil, nil, err
	}
	s, err := c.Open(ctx)
	if err != nil {
		return nil, nil, &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: err.Error()}
	}
	return c, s, nil
}

// ClusterLogits implements api.ClusterRunner: the tokens as one prompt, one
// step through the plan, every row's logits.
func (a *Agent) ClusterLogits(ctx context.Context, name string, tokens []int32) (*api.Logits, error) {
	d, err := a.localDriver(name)
	if err != nil {
		return nil, err
	}
	if len(tokens) > d.ctx {
		return nil, badRequest("%d tokens do not fit the model's KV cache of %d positions (load it with a larger --ctx)", len(tokens), d.ctx)
	}
	d.run.Lock()
	defer d.run.Unlock()
	_, s, err := a.openRun(ctx, d)
	if err != nil {
		return nil, err
	}
	defer s.Close(context.Background())
	for _, t := range tokens {
		if t < 0 || int(t) >= s.NVocab() {
			return nil, badRequest("token id %d is outside the vocabulary (0..%d)", t, s.NVocab()-1)
		}
	}
	rows := make([]int, len(tokens))
	for i := range rows {
		rows[i] = i
	}
	b := &model.Batch{Tokens: tokens, Chunks: []model.Chunk{{Seq: 0, N: len(tokens)}}}
	l, err := s.Step(ctx, b, rows)
	if err != nil {
		return nil, err
	}
	return &api.Logits{NTokens: len(tokens), NVocab: s.NVocab(), Data: append([]float32(nil), l...)}, nil
}

// ClusterBench implements api.ClusterRunner: ppN (N random tokens of one
// sequence from an empty cache, in steps of at most benchChunk) and tgN (N
// one-token steps), one warm-up and Reps measured runs each, with the
// payload bytes the plan's nodes sent per token.
func (a *Agent) ClusterBench(ctx context.Context, name string, req api.BenchRequest) (*api.BenchResult, error) {
	d, err := a.localDriver(name)
	if err != nil {
		return nil, err
	}
	if req.Reps <= 0 {
		req.Reps = 3
	}
	for _, p := range req.Prompt {
		if p > d.ctx {
			return nil, badRequest("pp%d does not fit the model's KV cache of %d positions (load it with a larger --ctx)", p, d.ctx)
		}
	}
	for _, g := range req.Gen {
		if g+1 > d.ctx {
			return nil, badRequest("tg%d does not fit the model's KV cache of %d positions (load it with a larger --ctx)", g, d.ctx)
		}
	}
	d.run.Lock()
	defer d.run.Unlock()
	c, s, err := a.openRun(ctx, d)
	if err != nil {
		return nil, err
	}
	defer s.Close(context.Background())
	out := &api.BenchResult{Model: name, PlanVersion: d.version, Strategy: d.plan.Strategy, Nodes: len(d.addrs),
		Driver: a.cfg.Name, Activations: "f32", PredictedMsPerToken: d.plan.Cost.MsPerToken, Stages: a.describeStages(ctx, &d.plan)}
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, d.ctx)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(s.NVocab()))
	}
	const seq kv.SeqID = 0
	var b model.Batch
	step := func(toks []int32, rows []int) error {
		b.Tokens = toks
		b.Chunks = append(b.Chunks[:0], model.Chunk{Seq: seq, N: len(toks)})
		_, err := s.Step(ctx, &b, rows)
		return err
	}
	measure := func(test string, n int, run func() error) error {
		var xs []float64
		var sent, stepped int64
		for rep := 0; rep <= req.Reps; rep++ {
			if err := s.Free(ctx, seq); err != nil {
				return err
			}
			before := c.Stats()
			t0 := time.Now()
			if err := run(); err != nil {
				return fmt.Errorf("%s: %w", test, err)
			}
			el := time.Since(t0)
			if rep == 0 {
				continue // warm-up
			}
			xs = append(xs, float64(n)/el.Seconds())
			st := c.Stats().Sub(before)
			stepped += st.Tokens
			sent += st.Bytes()
		}
		mean, sd := bench.MeanSD(xs)
		row := api.BenchRow{Test: test, TokPerSec: mean, StdDev: sd, Samples: xs}
		if mean > 0 {
			row.MsPerToken = 1000 / mean
		}
		if stepped > 0 {
			row.BytesPerToken = float64(sent) / float64(stepped)
		}
		out.Results = append(out.Results, row)
		return nil
	}
	for _, p := range req.Prompt {
		err := measure(fmt.Sprintf("pp%d", p), p, func() error {
			for off := 0; off < p; off += benchChunk {
				n := min(benchChunk, p-off)
				var rows []int
				if off+n == p {
					rows = []int{n - 1}
				}
				if err := step(tokens[off:off+n], rows); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, g := range req.Gen {
		err := measure(fmt.Sprintf("tg%d", g), g, func() error {
			for i := 0; i < g; i++ {
				if err := step(tokens[i:i+1], []int{0}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// describeStages writes a plan's stages as "[0,11) node-a".
func (a *Agent) describeStages(ctx context.Context, p *placement.Plan) []string {
	names := map[string]string{}
	if nodes, err := a.Nodes(ctx); err == nil {
		for _, n := range nodes {
			names[n.ID] = n.Name
		}
	}
	var out []string
	for _, pool := range p.Pools {
		for _, st := range pool.Stages {
			var ms []string
			for _, m := range st.Members {
				n := names[m.Node]
				if n == "" {
					n = m.Node
				}
				ms = append(ms, n)
			}
			s := fmt.Sprintf("[%d,%d) %s", st.Lo, st.Hi, strings.Join(ms, "+"))
			if len(ms) > 1 {
				s += " (tp)"
			}
			out = append(out, s)
		}
	}
	return out
}

var _ api.ClusterRunner = (*Agent)(nil)
