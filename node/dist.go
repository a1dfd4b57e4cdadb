package node

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"shoal/api"
	"shoal/api/openai"
	"shoal/coordinator"
	"shoal/engine/tokenizer"
	"shoal/gateway"
	"shoal/parallel"
	"shoal/placement"
	"shoal/serve"
	"shoal/shard"
	"shoal/transport"
)

// Serving wires two runners (see parallel.Reconciler and shard.Manager):
// on every state change the agent tells the shard manager which shards the
// committed plans give this node, and the reconciler which plans there
// are; the reconciler runs members on the ready shards and drives the
// plans that start here, publishing each servable model through the
// publisher below on the OpenAI endpoint. Every model, one node or many,
// takes this one path.

const (
	// rpcTimeout bounds a call on the agent's RPC server; parallel steps
	// run there, so it exceeds every step timeout.
	rpcTimeout = parallel.RunTimeout + 10*time.Second
	// distMaxTokens is the scheduler's token budget per step of a served
	// model: prefill advances in chunks this long, so a step stays well
	// inside the step timeout on slow nodes.
	distMaxTokens = 64
	// distPrefillTokens is the budget of a step while no sequence
	// decodes: a prompt alone prefills in steps of up to this many tokens,
	// pipelined in pieces through the stages, each step kept to a quarter
	// of the step timeout at the speed the steps measure.
	distPrefillTokens = parallel.PrefillStep
)

// publisher serves the models this node drives on the OpenAI endpoint:
// a scheduler over the driver's engine or local runner, the tokenizer and
// chat template of the model's metadata. It implements parallel.Publisher.
type publisher struct {
	models  *openai.StaticBackend
	owner   string // this node's name
	options func(name string, s parallel.Servable) serve.Options

	mu      sync.Mutex
	scheds  map[string]*serve.Scheduler // by model
	engines map[string]*parallel.Engine // of the models run across nodes, by model
	served  map[string]gateway.Served   // as the gateway serves them to other agents, by model
}

// Publish implements parallel.Publisher.
func (p *publisher) Publish(name string, s parallel.Servable) error {
	tok, err := tokenizer.FromGGUF(s.Meta)
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	var sc *serve.Scheduler
	if s.Runner != nil {
		sc, err = serve.New(s.Runner, tok.IsEOG, p.options(name, s))
	} else {
		sc, err = serve.NewEngine(s.Engine, tok.IsEOG, p.options(name, s))
	}
	if err != nil {
		return err
	}
	tpl, _ := s.Meta.String("tokenizer.chat_template")
	m := gateway.NewOpenAIModel(name, p.owner, sc, tok, tpl)
	sv, svErr := gateway.NewServed(m, s.Meta)
	p.mu.Lock()
	p.scheds[name] = sc
	if p.engines == nil {
		p.engines = map[string]*parallel.Engine{}
	}
	delete(p.engines, name)
	if s.Runner == nil && s.Engine != nil {
		p.engines[name] = s.Engine
	}
	if svErr == nil {
		if p.served == nil {
			p.served = map[string]gateway.Served{}
		}
		p.served[name] = sv
	} else {
		delete(p.served, name) // other agents pass its requests over HTTP
	}
	p.mu.Unlock()
	p.models.Set(m)
	return nil
}

// gatewayModel is model name as the gateway serves it to other agents:
// the model this node publishes now, with its vocabulary.
func (p *publisher) gatewayModel(name string) (gateway.Served, bool) {
	p.mu.Lock()
	sv, ok := p.served[name]
	p.mu.Unlock()
	if m, live := p.models.Model(name); !ok || !live || m != sv.Model {
		return gateway.Served{}, false
	}
	return sv, true
}

// Withdraw implements parallel.Publisher.
func (p *publisher) Withdraw(name string) {
	if sc := p.unlist(name); sc != nil {
		sc.Close()
	}
}

// Retire implements parallel.Retirer: the model is no longer served here
// to new requests (they follow its route to the new driver); the
// scheduler serves those in flight until stop closes it.
func (p *publisher) Retire(name string) (busy func() bool, stop func(), ok bool) {
	sc := p.unlist(name)
	if sc == nil {
		return nil, nil, false
	}
	busy = func() bool {
		st := sc.Stats()
		return st.Waiting+st.Running > 0
	}
	return busy, sc.Close, true
}

// unlist stops serving model name to new requests and returns the
// scheduler that served it (nil: none).
func (p *publisher) unlist(name string) *serve.Scheduler {
	p.mu.Lock()
	sc := p.scheds[name]
	delete(p.scheds, name)
	delete(p.engines, name)
	delete(p.served, name)
	p.mu.Unlock()
	if sc == nil {
		return nil
	}
	if m, ok := p.models.Model(name); ok && gateway.SchedulerOf(m) == sc {
		p.models.Remove(name)
	}
	return sc
}

// each calls f for every model published, by name, with its scheduler
// and, for a model run across nodes, the engine under it (else nil).
func (p *publisher) each(f func(name string, sc *serve.Scheduler, eng *parallel.Engine)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, sc := range p.scheds {
		f(name, sc, p.engines[name])
	}
}

// planView is the reconciler's view of the state: every planned model,
// the addresses and names of its nodes, whether its shards are ready (info
// is the model's status as the admin API reports it), for a --model of
// this node (local), its worker threads, and the replaced plan that runs
// on while it loads (old, by model).
func planView(st *coordinator.State, info func(*coordinator.State, *coordinator.Model) api.ModelInfo, local func(string) (ModelConfig, bool), old map[string]*placement.Plan) parallel.View {
	var v parallel.View
	for name, m := range st.Models {
		p := st.Plans[name]
		if p == nil {
			continue
		}
		pm := parallel.PlannedModel{Name: name, Plan: *p, Addrs: map[string]string{}, Names: map[string]string{}}
		for _, pool := range p.Pools {
			for _, stage := range pool.Stages {
				for _, mb := range stage.Members {
					if n := st.Nodes[mb.Node]; n != nil {
						pm.Names[mb.Node] = n.Name
						if n.RPCAddr != "" {
							pm.Addrs[mb.Node] = n.RPCAddr
						}
					}
				}
			}
		}
		mi := info(st, m)
		pm.Ready, pm.Status = mi.Status == coordinator.ModelReady, mi.Status
		if mi.Reason != "" {
			pm.Status += ": " + mi.Reason
		}
		if mc, ok := local(name); ok {
			pm.Threads = mc.Threads
		}
		pm.Queue, pm.Lookup = m.Queue, m.Lookup
		if spec, ok := draftSpec(m, p, parallel.DriverOf(p)); ok {
			pm.DraftKey, pm.DraftMax = shard.Key(spec), m.Draft.Max // 0: the scheduler's default
		}
		if o := old[name]; o != nil {
			pm.Prev = o.Version
			if n := st.Nodes[parallel.DriverOf(o)]; n != nil && allAlive(st, o.Nodes()) {
				pm.PrevDriver, pm.PrevHTTP, pm.Names[n.ID] = n.ID, n.HTTPAddr, n.Name
			}
		}
		pm.Prefill, pm.PrefillChunk = prefillRule(st, m, p)
		pm.PrefillFail = m.DisaggFailure == "fail"
		pm.Wire = wireFor(m)
		if n := st.Nodes[parallel.DriverOf(p)]; n != nil {
			pm.DriverHTTP = n.HTTPAddr
		}
		v.Models = append(v.Models, pm)
	}
	return v
}

// allAlive says whether every node of ids is alive.
func allAlive(st *coordinator.State, ids []string) bool {
	for _, id := range ids {
		if n := st.Nodes[id]; n == nil || n.Status != coordinator.StatusAlive {
			return false
		}
	}
	return true
}

// clusterRuns runs the admin API's cluster logits and benchmarks on the
// models this node drives (api.ClusterRunner over parallel.Reconciler),
// and reads what their schedulers measure.
type clusterRuns struct {
	par    *parallel.Reconciler
	driver string // this node's name
	pub    *publisher
	// plan gives the version and predicted ms/token of model's plan.
	plan func(model string) (version uint64, predicted float64, ok bool)
	// prefill gives the predicted prefill of a prompt of n tokens, in ms.
	prefill func(model string, n int) (ms float64, ok bool)
}

// ClusterMeasured implements api.ClusterRunner.
func (c clusterRuns) ClusterMeasured(ctx context.Context, name string) (*api.Measured, error) {
	c.pub.mu.Lock()
	sc := c.pub.scheds[name]
	c.pub.mu.Unlock()
	version, predicted, ok := c.plan(name)
	if sc == nil || !ok {
		if rt, routed := c.par.Route(name); routed && rt.NodeName != c.driver {
			return nil, transport.Errorf(http.StatusMisdirectedRequest, "model %q is driven by node %s", name, rt.NodeName)
		}
		return nil, transport.Errorf(http.StatusNotFound, "model %q is not driven here (see 'shoal model ls')", name)
	}
	st := sc.Stats()
	return &api.Measured{Model: name, Driver: c.driver, PlanVersion: version, PredictedMsPerToken: predicted,
		MeasuredMsPerToken: st.DecodeMs, DecodeSteps: st.DecodeSteps}, nil
}

// ClusterLogits implements api.ClusterRunner.
func (c clusterRuns) ClusterLogits(ctx context.Context, name string, tokens []int32) (*api.Logits, error) {
	l, err := c.par.Logits(ctx, name, tokens)
	if err != nil {
		return nil, err
	}
	return &api.Logits{NTokens: l.NTokens, NVocab: l.NVocab, Data: l.Data}, nil
}

// ClusterBench implements api.ClusterRunner.
func (c clusterRuns) ClusterBench(ctx context.Context, name string, req api.BenchRequest) (*api.BenchResult, error) {
	r, err := c.par.Bench(ctx, name, parallel.BenchRequest{Prompt: req.Prompt, Gen: req.Gen, Reps: req.Reps})
	if err != nil {
		return nil, err
	}
	out := &api.BenchResult{Model: r.Model, PlanVersion: r.PlanVersion, Strategy: r.Strategy, Nodes: r.Nodes, Stages: r.Stages,
		Driver: c.driver, Activations: r.Activations, PredictedMsPerToken: r.PredictedMsPerToken}
	if _, predicted, ok := c.plan(name); ok {
		out.PredictedMsPerToken = predicted // one sequence, on the figures measured now, as the tg rows run
	}
	for _, row := range r.Results {
		br := api.BenchRow{Test: row.Test, TokPerSec: row.TokPerSec, StdDev: row.StdDev, Samples: row.Samples,
			MsPerToken: row.MsPerToken, BytesPerToken: row.BytesPerToken, ComputeMs: row.ComputeMs}
		switch {
		case strings.HasPrefix(row.Test, "tg"):
			br.PredictedMsPerToken = out.PredictedMsPerToken
		case c.prefill != nil && strings.HasPrefix(row.Test, "pp") && row.Tokens > 0:
			if ms, ok := c.prefill(name, row.Tokens); ok {
				br.PredictedMsPerToken = ms / float64(row.Tokens)
			}
		}
		out.Results = append(out.Results, br)
	}
	return out, nil
}

var _ api.ClusterRunner = clusterRuns{}

// wireFor is the wire encoding of a model's activations and all-reduces:
// the model's own choice (model load --wire), else f32 for a model whose
// weights are f32 (its logits are held to the float tolerance, which f16
// activations exceed: max|Δ| 0.022 against 0.02 on the real stories260k
// f32 model in tensor parallel), else parallel.DefaultWire (f16).
func wireFor(m *coordinator.Model) transport.DType {
	if m.Wire != "" {
		if d, err := transport.ParseDType(m.Wire); err == nil { // the API checked it
			return d
		}
	}
	if m.Profile != nil {
		var bytes uint64
		var flops float64
		for _, l := range m.Profile.Layers {
			bytes += l.AttnBytes + l.FFNBytes + l.ExpertBytes
			flops += l.AttnFLOPs + l.FFNFLOPs + l.ExpertFLOPs
		}
		if flops > 0 && float64(bytes)/(flops/2) >= 3.5 { // 4 bytes a weight
			return transport.F32
		}
	}
	return parallel.DefaultWire
}
