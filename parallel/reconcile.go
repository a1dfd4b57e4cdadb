package parallel

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/engine/device"
	"shoal/engine/gguf"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/placement"
	"shoal/serve"
	"shoal/shard"
	"shoal/transport"
)

// The reconciler is a node's distributed runtime, in the shape of a Nomad
// client's alloc runners: given the committed plans (a View), the shards
// this node holds ready (a ShardSource) and somewhere to publish a servable
// model (a Publisher), it runs a Member for every ready shard of a current
// plan and, on the node that drives a plan (stage 0, rank 0 of its first
// pool: it holds the embedding), a driver: a Session over the plan wrapped
// in an Engine, published once every shard is ready. A plan with one node
// runs the same way, so one code path serves every plan.
//
// A failed step (a member died or timed out) fails the requests in flight
// with the step's error, marks the driver failed and wakes the reconciler's
// owner (Wake), whose next Reconcile tears the session down and opens a new
// one as soon as the plan's members answer, or after the leader re-planned
// and the new shards are ready. A new plan version tears down the members
// and the driver of the old one.

// DefaultReplayWait is how long a failed step waits for a session to
// replay on: time for gossip to declare a member failed, the leader to
// re-plan and the new shards to load.
const DefaultReplayWait = 60 * time.Second

// RunTimeout bounds one step of the sessions opened for cluster logits and
// benchmarks (prefill steps of up to PrefillStep tokens); an RPC server that
// runs steps must allow a little more.
const RunTimeout = 2 * time.Minute

// View is the committed state the reconciler acts on: every model with a
// plan. The owner builds it from the cluster state.
type View struct {
	Models []PlannedModel
}

// PlannedModel is one model's committed plan and what the node needs to
// run and route it.
type PlannedModel struct {
	Name string
	Plan placement.Plan // Plan.Version is the committed version
	// Addrs maps the plan's nodes to their endpoint addresses, Names to
	// their names (for logs and benchmark reports).
	Addrs map[string]string
	Names map[string]string
	// Ready says every shard of the plan is ready; Status is the model's
	// status (with its reason) for routes.
	Ready  bool
	Status string
	// DriverHTTP is the HTTP address of the node that drives the plan.
	DriverHTTP string
	// Threads overrides the reconciler's worker threads for this model's
	// members and local runner (0: the reconciler's).
	Threads int
	// Queue is how many requests may wait for one of the plan's Batch
	// running places (0: the publisher's default).
	Queue int
	// Lookup is the model's prompt-lookup drafting (Servable.Lookup).
	Lookup int
	// DraftKey is the shard key of the model's draft model, which the
	// driver's node holds whole ("": none); DraftMax the most tokens it
	// drafts a step (Servable.DraftMax).
	DraftKey string
	DraftMax int
	// Prefill, for a plan with a prefill pool, says which prompts (by
	// their tokens) the driver prefills there (nil: every prompt);
	// PrefillFail ends a request whose prefill there failed instead of
	// prefilling it on the decode pool.
	Prefill     func(n int, now Load) bool
	PrefillFail bool
	// PrefillChunk is the prompt tokens of one handoff step
	// (DefaultHandoffChunk if 0).
	PrefillChunk int
	// Wire encodes the plan's activations and all-reduces (DefaultWire
	// if 0; see Options).
	Wire transport.DType
	// Prev is the version of a plan this one replaces whose members keep
	// running here while this one loads (0: none). Make-before-break: the
	// driver's session over the old plan serves until it moves to the new
	// one, at a step.
	Prev uint64
	// PrevDriver, when set, drives the Prev plan, every node of which is
	// alive: it serves the model until this plan is Ready (routes name
	// it meanwhile), so that requests and streams move once, to a driver
	// that serves. PrevHTTP is its HTTP address.
	PrevDriver, PrevHTTP string
}

// ShardSource is what the node holds: shards ready to run and the model's
// GGUF metadata. shard.Manager implements it.
type ShardSource interface {
	Ready() []shard.Ready
	Meta(model string) (*gguf.File, error)
}

// Publisher serves a model whose driver runs here: Publish makes s
// servable under name; Withdraw stops serving it, ending requests in
// flight with an error.
type Publisher interface {
	Publish(name string, s Servable) error
	Withdraw(name string)
}

// Retirer is a Publisher that can let a model's requests in flight finish
// while new ones go elsewhere: Retire stops new requests for name from
// reaching what it published (this node routes them to the model's new
// driver), and returns busy, which tells whether requests are still in
// flight, and stop, which ends what is left (with an error) and releases
// it. ok is false when name is not published.
type Retirer interface {
	Retire(name string) (busy func() bool, stop func(), ok bool)
}

// RetireMax bounds how long a driver whose model moved to another node
// serves its requests in flight on the replaced plan (whose members run
// LingerAfterLoad after the new plan loaded) before it stops; what is
// still running then ends with an error.
const RetireMax = 25 * time.Second

// Servable is a model a driver publishes: a session over its plan wrapped
// in an Engine or, when the plan is this node alone with every layer, a
// local Runner over the node's shard (no session, no step over the
// endpoint), and the model's metadata (tokenizer, chat template).
type Servable struct {
	Engine *Engine
	Runner *model.Runner
	Meta   *gguf.File
	// Seqs and SeqTokens are what the plan reserved KV cache for: Seqs
	// sequences (its Batch) of SeqTokens tokens (its Context); the
	// publisher runs at most Seqs at once, each up to SeqTokens, and
	// queues up to Queue more (0: its default).
	Seqs, SeqTokens, Queue int
	// Lookup drafts up to that many tokens a step by prompt lookup
	// (serve.Options.Lookup; 0: off).
	Lookup int
	// Draft, when set, drafts with the model's draft model, up to
	// DraftMax tokens a step (serve.Options.Draft): the scheduler closes
	// it.
	Draft    serve.Drafter
	DraftMax int
}

// Route says which node drives a planned model.
type Route struct {
	Model    string
	Node     string
	NodeName string
	HTTPAddr string
	Ready    bool   // every shard of the plan is ready
	Status   string // the model's status
}

// DefaultStepTimeout bounds a step of a served model: a member that stops
// answering (a paused process, a partition) fails the step within it, and
// the driver replays its sequences or fails them. A prefill step of the
// node's token budget (64 tokens) fits well inside it.
const DefaultStepTimeout = 10 * time.Second

// ReconcilerConfig wires a Reconciler.
type ReconcilerConfig struct {
	Host      *Host
	Node      string // this node's ID
	Shards    ShardSource
	Publisher Publisher
	// Threads is each member's worker threads (all cores if 0);
	// StepTimeout bounds a step of a served model (DefaultStepTimeout if
	// 0).
	Threads     int
	StepTimeout time.Duration
	// Device runs this node's members and drivers (the CPU if nil).
	Device device.Device
	// ReplayWait bounds how long a failed step of a model driven here
	// waits for a new session (its members answering again, or a new
	// plan) to replay its running sequences on (DefaultReplayWait if 0,
	// no replay if negative); MaxReplays bounds the replays in a row
	// (3 if 0).
	ReplayWait time.Duration
	MaxReplays int
	// DraftWait bounds how long a driver whose plan is loaded waits for
	// its draft model's shard (DefaultDraftWait if 0).
	DraftWait time.Duration
	Log       *zap.Logger
}

// Reconciler keeps the node's members, drivers and routes in line with a
// View.
type Reconciler struct {
	cfg  ReconcilerConfig
	log  *zap.Logger
	rec  sync.Mutex // serializes Reconcile and Close
	wake chan struct{}

	mu      sync.Mutex
	closed  bool
	members map[string]*runMember // by shard key
	drivers map[string]*driver    // by model
	routes  map[string]Route      // by model
	logged  map[string]string     // the last driver error logged, by model
	// retiring are the drivers whose model moved to another node, while
	// their requests in flight finish (retireDriver).
	retiring map[*driver]func()
	bg       sync.WaitGroup
	// drafts are the drafters open over draft shards (by shard key), and
	// draftSince when each model's driver began waiting for its draft.
	drafts     map[string][]*draftModel
	draftSince map[string]time.Time
}

type runMember struct {
	version uint64
	m       *Member
}

// lingerMark ends the key of a member of a plan a newer one replaces
// (PlannedModel.Prev), which runs on beside the newer plan's member of the
// same shard.
const lingerMark = "~prev"

// NewReconciler makes a reconciler; it runs nothing until Reconcile.
func NewReconciler(cfg ReconcilerConfig) *Reconciler {
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = DefaultStepTimeout
	}
	if cfg.ReplayWait == 0 {
		cfg.ReplayWait = DefaultReplayWait
	}
	if cfg.MaxReplays <= 0 {
		cfg.MaxReplays = 3
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Reconciler{cfg: cfg, log: cfg.Log, wake: make(chan struct{}, 1), members: map[string]*runMember{},
		drivers: map[string]*driver{}, routes: map[string]Route{}, logged: map[string]string{},
		drafts: map[string][]*draftModel{}, draftSince: map[string]time.Time{}}
}

// Wake receives when a driver failed and the owner should reconcile.
func (r *Reconciler) Wake() <-chan struct{} { return r.wake }

func (r *Reconciler) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// DriverOf is the node that drives a plan: stage 0, rank 0 of its first
// pool, which holds the embedding.
func DriverOf(p *placement.Plan) string {
	if len(p.Pools) == 0 || len(p.Pools[0].Stages) == 0 || len(p.Pools[0].Stages[0].Members) == 0 {
		return ""
	}
	return p.Pools[0].Stages[0].Members[0].Node
}

// KVType is the KV cache type of plan p's runners.
func KVType(p *placement.Plan) (quant.Type, error) { return kv.ParseType(p.KVType) }

// CacheTokens is the KV capacity every member of a plan gets: the context
// the planner reserved memory for, times its batch.
func CacheTokens(p *placement.Plan) int {
	c := p.Context
	if c <= 0 {
		c = placement.DefaultContext
	}
	return c * max(p.Batch, 1)
}

// Reconcile brings the members, drivers and routes in line with v.
func (r *Reconciler) Reconcile(v View) {
	r.rec.Lock()
	defer r.rec.Unlock()
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return
	}
	planned := map[string]*PlannedModel{}
	for i := range v.Models {
		planned[v.Models[i].Name] = &v.Models[i]
	}
	r.reconcileMembers(planned)
	r.mu.Lock()
	for name := range r.draftSince {
		if planned[name] == nil || planned[name].DraftKey == "" {
			delete(r.draftSince, name) // a model loaded again waits for its draft again
			delete(r.logged, name+"#draft")
		}
	}
	r.mu.Unlock()
	routes := map[string]Route{}
	for name, pm := range planned {
		drv := DriverOf(&pm.Plan)
		if drv == "" {
			continue
		}
		rt := Route{Model: name, Node: drv, NodeName: drv, HTTPAddr: pm.DriverHTTP, Ready: pm.Ready, Status: pm.Status}
		if !pm.Ready && pm.PrevDriver != "" && r.servesPrev(pm) {
			rt.Node, rt.NodeName, rt.HTTPAddr, rt.Ready = pm.PrevDriver, pm.PrevDriver, pm.PrevHTTP, true
		}
		if n := pm.Names[rt.Node]; n != "" {
			rt.NodeName = n
		}
		routes[name] = rt
		if drv == r.cfg.Node {
			r.reconcileDriver(pm)
		}
	}
	r.mu.Lock()
	var stale []*driver
	for name, d := range r.drivers {
		if rt, ok := routes[name]; !ok || rt.Node != r.cfg.Node {
			stale = append(stale, d)
		}
	}
	r.routes = routes
	r.mu.Unlock()
	for _, d := range stale {
		if _, planned := routes[d.name]; planned {
			r.retireDriver(d)
			continue
		}
		r.log.Info("stopping distributed serving: no longer planned here", zap.String("model", d.name))
		r.stopDriver(d)
	}
}

// reconcileDriver moves the driver of pm to a new session when its plan
// changed or its session failed (its engine replays the running
// sequences), stops it when it cannot move, and starts one when the plan
// is ready.
func (r *Reconciler) reconcileDriver(pm *PlannedModel) {
	name := pm.Name
	r.mu.Lock()
	d := r.drivers[name]
	r.mu.Unlock()
	if d != nil && d.version == pm.Plan.Version && d.err() == nil {
		r.openPrefill(d) // again, when the prefill pool's session failed
	}
	if d != nil && (d.version != pm.Plan.Version || d.err() != nil) && r.canMove(d, pm) {
		if !pm.Ready {
			return // the engine waits (ReplayWait) for the new plan's shards
		}
		if err := r.moveDriver(d, pm); err != nil {
			r.mu.Lock()
			if r.logged[name] != err.Error() {
				r.logged[name] = err.Error()
				r.log.Info("cannot move the distributed model to a new session yet; retrying", zap.String("model", name), zap.Error(err))
			}
			r.mu.Unlock()
		}
		return
	}
	if d != nil && (d.version != pm.Plan.Version || d.err() != nil) {
		why := fmt.Sprintf("plan v%d", pm.Plan.Version)
		if err := d.err(); err != nil {
			why = err.Error()
		}
		r.log.Info("stopping distributed serving", zap.String("model", name), zap.Uint64("version", d.version), zap.String("why", why))
		r.stopDriver(d)
		d = nil
	}
	if d != nil || !pm.Ready || r.awaitDraft(pm) {
		return
	}
	d, err := r.startDriver(pm)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.logged[name] != err.Error() {
			r.logged[name] = err.Error()
			r.log.Info("cannot serve the distributed model yet; retrying", zap.String("model", name), zap.Error(err))
		}
		return
	}
	delete(r.logged, name)
	r.drivers[name] = d
}

// servesPrev says whether pm's replaced plan is served by its driver: by
// this node's driver of it, when this node drives it; elsewhere, as far as
// this node can tell (its driver's node is alive: PrevDriver).
func (r *Reconciler) servesPrev(pm *PlannedModel) bool {
	if pm.PrevDriver != r.cfg.Node {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.drivers[pm.Name]
	return d != nil && d.version == pm.Prev && d.err() == nil
}

// reconcileMembers runs a Member for every ready shard of a current plan
// and closes the others.
func (r *Reconciler) reconcileMembers(planned map[string]*PlannedModel) {
	keep := map[string]bool{}
	// The members of a replaced plan run on under a key of their own, so
	// that the new plan's members of the same shards start beside them.
	r.mu.Lock()
	for key, rm := range r.members {
		pm := planned[rm.m.cfg.Plan.Model]
		if pm == nil || pm.Prev == 0 || rm.version != pm.Prev {
			continue
		}
		if !strings.HasSuffix(key, lingerMark) {
			delete(r.members, key)
			key += lingerMark
			r.members[key] = rm
		}
		keep[key] = true
	}
	r.mu.Unlock()
	for _, s := range r.cfg.Shards.Ready() {
		pm := planned[s.Model]
		if pm == nil || pm.Plan.Version != s.Version {
			continue
		}
		// A shard runs a member in every pool of the plan that gives the
		// node that part (a disaggregated plan has two pools).
		for _, pool := range poolsOf(&pm.Plan, r.cfg.Node, pm.Addrs, s.Spec) {
			key := s.Key
			if len(pm.Plan.Pools) > 1 {
				key += "@" + pool
			}
			keep[key] = true
			r.mu.Lock()
			old := r.members[key]
			r.mu.Unlock()
			if old != nil && old.version == s.Version {
				continue
			}
			if old != nil {
				r.dropMembers(func(k string) bool { return k == key })
			}
			mdl, err := r.shardModelFor(s)
			if err != nil {
				r.log.Warn("shard cannot run", zap.String("model", s.Model), zap.Error(err))
				continue
			}
			m, err := r.cfg.Host.AddMember(MemberConfig{Plan: pm.Plan, Pool: pool, Node: r.cfg.Node, Addrs: pm.Addrs, Spec: s.Spec,
				Model: mdl, Threads: r.threads(pm), CacheTokens: poolCacheTokens(&pm.Plan, pool), Device: r.cfg.Device})
			if err != nil {
				r.log.Warn("shard cannot join its plan", zap.String("model", s.Model), zap.Uint64("version", s.Version), zap.String("pool", pool), zap.Error(err))
				continue
			}
			r.mu.Lock()
			r.members[key] = &runMember{version: s.Version, m: m}
			r.mu.Unlock()
			r.log.Info("shard serving its plan", zap.String("model", s.Model), zap.Uint64("version", s.Version), zap.String("pool", pool),
				zap.Int("lo", s.Spec.Lo), zap.Int("hi", s.Spec.Hi), zap.Int("tp_rank", s.Spec.TPRank), zap.Int("tp_size", s.Spec.TPSize), zap.String("device", r.deviceName()))
		}
	}
	r.mu.Lock()
	var drop []string
	for key := range r.members {
		if !keep[key] {
			drop = append(drop, key)
		}
	}
	r.mu.Unlock()
	r.dropMembers(func(k string) bool { return slices.Contains(drop, k) })
}

// poolsOf lists the roles of the plan's pools in which node runs the part
// spec describes ("" for a plan of one pool).
func poolsOf(p *placement.Plan, node string, addrs map[string]string, spec shard.ShardSpec) []string {
	if len(p.Pools) <= 1 {
		return []string{""}
	}
	var out []string
	for _, pool := range p.Pools {
		lay, err := newLayout(*p, pool.Role, addrs)
		if err != nil {
			continue
		}
		if m, err := lay.locate(node, spec.Lo, spec.Hi, spec.TPRank); err == nil && lay.checkSpec(m, spec) == nil {
			out = append(out, pool.Role)
		}
	}
	return out
}

// poolCacheTokens is the KV capacity of a member of pool: the plan's
// (CacheTokens), or the context of one prompt in a prefill pool.
func poolCacheTokens(p *placement.Plan, pool string) int {
	if pool == placement.RolePrefill {
		if p.Context > 0 {
			return p.Context
		}
		return placement.DefaultContext
	}
	return CacheTokens(p)
}

// shardModelFor is the loaded model of a shard: one load serves the
// members of both pools.
func (r *Reconciler) shardModelFor(s shard.Ready) (*model.Model, error) {
	r.mu.Lock()
	for key, rm := range r.members {
		if (key == s.Key || strings.HasPrefix(key, s.Key+"@")) && rm.version == s.Version {
			r.mu.Unlock()
			return rm.m.cfg.Model, nil
		}
	}
	r.mu.Unlock()
	return s.Shard.Model()
}

// DropMember closes the member running shard key (waiting for its steps);
// call it before the shard's mapping goes away.
// Every member of the shard goes: in each pool ("@pool") and of a replaced
// plan (lingerMark).
func (r *Reconciler) DropMember(key string) {
	r.dropDrafts(key)
	r.dropMembers(func(k string) bool {
		return k == key || strings.HasPrefix(k, key+"@") || strings.HasPrefix(k, key+lingerMark)
	})
}

// dropMembers closes the members whose keys match.
func (r *Reconciler) dropMembers(match func(key string) bool) {
	r.mu.Lock()
	var ms []*runMember
	for k, m := range r.members {
		if match(k) {
			ms = append(ms, m)
			delete(r.members, k)
		}
	}
	r.mu.Unlock()
	for _, m := range ms {
		m.m.Close()
	}
}

// Close stops every driver and member (before the shards unmap); later
// Reconciles do nothing.
func (r *Reconciler) Close() {
	r.rec.Lock()
	defer r.rec.Unlock()
	r.mu.Lock()
	r.closed = true
	var ds []*driver
	for _, d := range r.drivers {
		ds = append(ds, d)
	}
	var keys []string
	for k := range r.members {
		keys = append(keys, k)
	}
	var retiring []func()
	for _, stop := range r.retiring {
		retiring = append(retiring, stop)
	}
	r.mu.Unlock()
	for _, stop := range retiring {
		stop()
	}
	r.bg.Wait()
	for _, d := range ds {
		r.stopDriver(d)
	}
	for _, k := range keys {
		r.DropMember(k)
	}
}

// Route returns where model's driver runs, if it is planned.
func (r *Reconciler) Route(model string) (Route, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[model]
	return rt, ok
}

// Routes lists every planned model's route, by model name.
func (r *Reconciler) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Route, 0, len(r.routes))
	for _, rt := range r.routes {
		out = append(out, rt)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// failedStep reports whether err from a step failed the session (a full
// cache is the scheduler's business, not a failure).
func failedStep(err error) bool { return err != nil && !errors.Is(err, kv.ErrFull) }

// deviceName names the device the node's members and drivers run on.
func (r *Reconciler) deviceName() string {
	if r.cfg.Device == nil {
		return "cpu"
	}
	return r.cfg.Device.Name()
}
