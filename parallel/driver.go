package parallel

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"shoal/engine/device"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/placement"
	"shoal/shard"
	"shoal/transport"
)

// driver serves one model from this node over its plan.
type driver struct {
	name    string
	version uint64
	plan    placement.Plan
	addrs   map[string]string
	names   map[string]string
	ctx     int // KV positions of every member
	meta    *gguf.File
	cluster *Cluster
	sess    *Session
	eng     *Engine
	// prefill is the session over the plan's prefill pool (nil for a
	// plan without one); rule says which prompts go there.
	prefill     *Session
	rule        func(n int, now Load) bool
	failPrefill bool            // PlannedModel.PrefillFail
	chunk       int             // PlannedModel.PrefillChunk
	wire        transport.DType // PlannedModel.Wire
	// prefillAt and prefillVersion are the last attempt to open the
	// prefill session and the plan version it was for.
	prefillAt      time.Time
	prefillVersion uint64
	runner         *model.Runner // a plan of this node alone
	times          StepTimes     // the member step times of every session
	pub            bool          // published

	run sync.Mutex // one logits or benchmark run at a time

	mu     sync.Mutex // guards failed, and the plan fields above once the driver serves (moveDriver)
	failed error
}

// planView is the plan a driver runs, as of one moment: a move to a new
// session replaces it.
type planView struct {
	version      uint64
	plan         placement.Plan
	addrs, names map[string]string
	wire         transport.DType
}

func (d *driver) view() planView {
	d.mu.Lock()
	defer d.mu.Unlock()
	return planView{version: d.version, plan: d.plan, addrs: d.addrs, names: d.names, wire: d.wire}
}

func (d *driver) fail(err error) {
	d.mu.Lock()
	if d.failed == nil {
		d.failed = err
	}
	d.mu.Unlock()
}

func (d *driver) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// startDriver opens a session over the plan and publishes the model.
func (r *Reconciler) startDriver(pm *PlannedModel) (*driver, error) {
	meta, err := r.cfg.Shards.Meta(pm.Name)
	if err != nil {
		return nil, err
	}
	d := &driver{name: pm.Name, version: pm.Plan.Version, plan: pm.Plan, addrs: pm.Addrs, names: pm.Names, ctx: CacheTokens(&pm.Plan), meta: meta,
		rule: pm.Prefill, failPrefill: pm.PrefillFail, chunk: pm.PrefillChunk, wire: pm.Wire}
	ok := false
	defer func() {
		if !ok {
			r.stopDriver(d)
		}
	}()
	if s, ok := r.wholeShard(pm); ok {
		mdl, err := r.shardModel(s)
		if err != nil {
			return nil, err
		}
		if err := d.startLocal(mdl, r.threads(pm), r.cfg.Device); err != nil {
			return nil, err
		}
	} else if err := r.startSession(d); err != nil {
		return nil, err
	}
	sv := Servable{Engine: d.eng, Runner: d.runner, Meta: meta, Seqs: max(pm.Plan.Batch, 1), SeqTokens: d.ctx / max(pm.Plan.Batch, 1), Queue: pm.Queue, Lookup: pm.Lookup}
	if pm.DraftKey != "" {
		if g := r.openDraft(pm, d.ctx, d.nVocab()); g != nil {
			sv.Draft, sv.DraftMax = g, pm.DraftMax
		}
	}
	if err := r.cfg.Publisher.Publish(d.name, sv); err != nil {
		if g, ok := sv.Draft.(*draftModel); ok {
			g.Close()
		}
		return nil, err
	}
	d.pub = true
	ok = true
	r.log.Info("serving model", zap.String("model", d.name), zap.Uint64("version", d.version),
		zap.String("strategy", d.plan.Strategy), zap.Int("nodes", len(d.addrs)), zap.Bool("local", d.runner != nil), zap.Int("ctx", d.ctx),
		zap.Float64("predicted_ms_per_token", d.plan.Cost.MsPerToken))
	return d, nil
}

// nVocab is the served model's vocabulary size.
func (d *driver) nVocab() int {
	if d.runner != nil {
		return d.runner.Model().NVocab
	}
	return d.eng.NVocab()
}

// options are the cluster options of d's sessions on pool.
func (d *driver) options(r *Reconciler, pool string) Options {
	w := d.view().wire
	return Options{Pool: pool, Timeout: r.cfg.StepTimeout, Times: &d.times, Activations: w, Collectives: w}
}

// startSession opens a session over d's plan and wraps it in an Engine
// whose failed steps fail d and wake the owner.
func (r *Reconciler) startSession(d *driver) error {
	var err error
	d.times.SetNames(d.names)
	if d.cluster, err = r.cfg.Host.NewCluster(d.plan, d.addrs, d.options(r, "")); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d.sess, err = d.cluster.Open(ctx)
	cancel()
	if err != nil {
		return err
	}
	if d.eng, err = NewEngine(d.sess, d.ctx, 0); err != nil {
		return err
	}
	d.sess = nil // the engine owns its sessions
	if r.cfg.ReplayWait > 0 {
		d.eng.ReplayWait, d.eng.MaxReplays = r.cfg.ReplayWait, r.cfg.MaxReplays
	}
	d.eng.onFail = func(err error) error {
		d.fail(err)
		r.wakeUp()
		return fmt.Errorf("model %s runs across nodes and a step failed (it is served again once every node of its plan answers, or the cluster has re-planned): %w", d.name, err)
	}
	r.openPrefill(d)
	return nil
}

// prefillRetry is the pause between attempts to open a prefill session.
const prefillRetry = 5 * time.Second

// openPrefill opens a session over the prefill pool of d's plan, when it
// has one, and gives it to d's engine with the plan's routing rule. A
// failure is logged: prompts are then prefilled by the decode pool, and
// the next reconcile tries again.
func (r *Reconciler) openPrefill(d *driver) {
	v := d.view()
	if !v.plan.Disaggregated() || d.eng == nil {
		return
	}
	if d.prefill != nil && d.prefill.Err() == nil && d.prefill.c.lay.Version == v.version {
		return
	}
	// An unreachable prefill pool is tried again every few seconds, not
	// on every reconcile pass (each attempt may wait for its timeout).
	if d.prefill == nil && !d.prefillAt.IsZero() && time.Since(d.prefillAt) < prefillRetry && d.prefillVersion == v.version {
		return
	}
	d.prefillAt, d.prefillVersion = time.Now(), v.version
	old := d.prefill
	d.prefill = nil
	c, err := r.cfg.Host.NewCluster(v.plan, v.addrs, d.options(r, placement.RolePrefill))
	var s *Session
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err = c.Open(ctx)
		cancel()
	}
	if err != nil {
		d.eng.SetRemotePrefill(nil)
		r.log.Info("prefill pool not reachable; the decode pool prefills every prompt meanwhile", zap.String("model", d.name), zap.Error(err))
	} else {
		d.prefill = s
		var lastErr atomic.Pointer[string]
		observe := func(tokens int, _ time.Duration, err error) {
			// a failed remote prefill falls back to the decode pool: say
			// why once per distinct reason, not once per prompt
			if err == nil {
				return
			}
			msg := err.Error()
			if old := lastErr.Swap(&msg); old == nil || *old != msg {
				r.log.Warn("remote prefill failed; the decode pool prefilled the prompt", zap.String("model", d.name), zap.Int("tokens", tokens), zap.Error(err))
			}
		}
		d.eng.SetRemotePrefill(&RemotePrefill{Session: s, Remote: d.rule, Fail: d.failPrefill, Chunk: d.chunk, Observe: observe})
		r.log.Info("prefill pool ready: long prompts are prefilled there", zap.String("model", d.name), zap.Uint64("version", v.version))
	}
	if old != nil {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = old.Close(ctx)
			cancel()
		}()
	}
}

// canMove tells whether d can go on over pm's plan on a new session, its
// engine replaying the running sequences: d runs a session (not a local
// runner), pm's plan is not this node alone, and its KV capacity holds
// what the engine admitted.
func (r *Reconciler) canMove(d *driver, pm *PlannedModel) bool {
	if r.cfg.ReplayWait <= 0 || d.eng == nil || d.runner != nil {
		return false
	}
	if _, whole := r.wholeShard(pm); whole {
		return false
	}
	return CacheTokens(&pm.Plan) >= d.eng.Capacity()
}

// moveDriver opens a session over pm's plan and offers it to d's engine,
// which replays its sequences on it at its next step.
func (r *Reconciler) moveDriver(d *driver, pm *PlannedModel) error {
	d.times.SetNames(pm.Names)
	opt := d.options(r, "")
	opt.Activations, opt.Collectives = pm.Wire, pm.Wire
	c, err := r.cfg.Host.NewCluster(pm.Plan, pm.Addrs, opt)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	sess, err := c.Open(ctx)
	cancel()
	if err != nil {
		return err
	}
	if !d.eng.Offer(sess) {
		return fmt.Errorf("model %s stopped being served here", d.name)
	}
	why := "its session failed"
	if d.version != pm.Plan.Version {
		why = fmt.Sprintf("plan v%d replaces v%d", pm.Plan.Version, d.version)
	}
	d.mu.Lock()
	d.version, d.plan, d.addrs, d.names, d.cluster, d.failed, d.wire = pm.Plan.Version, pm.Plan, pm.Addrs, pm.Names, c, nil, pm.Wire
	d.mu.Unlock()
	d.rule, d.failPrefill, d.chunk = pm.Prefill, pm.PrefillFail, pm.PrefillChunk
	r.openPrefill(d)
	r.mu.Lock()
	delete(r.logged, d.name)
	r.mu.Unlock()
	r.log.Info("moving distributed serving to a new session; running sequences replay on it", zap.String("model", d.name),
		zap.Uint64("version", pm.Plan.Version), zap.String("why", why), zap.Int("nodes", len(pm.Addrs)))
	return nil
}

// wholeShard returns the ready shard of pm's plan when the plan is this
// node alone holding every layer (TP size 1).
func (r *Reconciler) wholeShard(pm *PlannedModel) (shard.Ready, bool) {
	if len(pm.Addrs) > 1 || len(pm.Plan.Pools) != 1 || len(pm.Plan.Pools[0].Stages) != 1 {
		return shard.Ready{}, false
	}
	st := pm.Plan.Pools[0].Stages[0]
	if len(st.Members) != 1 || st.Members[0].Node != r.cfg.Node || st.Members[0].TPSize > 1 {
		return shard.Ready{}, false
	}
	for _, s := range r.cfg.Shards.Ready() {
		if s.Model == pm.Name && s.Version == pm.Plan.Version && s.Spec.Lo == 0 && s.Spec.Hi == st.Hi && st.Lo == 0 {
			return s, true
		}
	}
	return shard.Ready{}, false
}

// shardModel is the loaded model of a ready shard: the one its member
// runs, so that the weights are in memory once, or a new load when the
// shard has no member.
func (r *Reconciler) shardModel(s shard.Ready) (*model.Model, error) {
	r.mu.Lock()
	rm := r.members[s.Key]
	r.mu.Unlock()
	if rm != nil && rm.version == s.Version {
		return rm.m.cfg.Model, nil
	}
	return s.Shard.Model()
}

// startLocal runs d's model on a local runner over the node's shard.
func (d *driver) startLocal(mdl *model.Model, threads int, dev device.Device) error {
	if st := d.plan.Pools[0].Stages[0]; st.Hi != mdl.NLayer {
		return fmt.Errorf("parallel: a one-node plan of layers [%d,%d) of a %d-layer model", st.Lo, st.Hi, mdl.NLayer)
	}
	kt, err := KVType(&d.plan)
	if err != nil {
		return err
	}
	d.runner, err = model.NewRunner(mdl, model.Options{Threads: threads, CacheTokens: d.ctx, Device: dev, KVType: kt})
	return err
}

func (r *Reconciler) threads(pm *PlannedModel) int {
	if pm.Threads > 0 {
		return pm.Threads
	}
	return r.cfg.Threads
}

// stopDriver stops serving d's model: requests in flight end with an
// error, the session closes on every member.
func (r *Reconciler) stopDriver(d *driver) {
	r.mu.Lock()
	if r.drivers[d.name] == d {
		delete(r.drivers, d.name)
	}
	r.mu.Unlock()
	// Close the engine first: a step that failed may be waiting for a
	// session to replay on (ReplayWait), and Withdraw closes the scheduler,
	// which waits for that step. Closed, the engine ends the wait and the
	// step fails at once.
	if d.eng != nil {
		d.eng.Close()
	}
	if d.pub {
		r.cfg.Publisher.Withdraw(d.name)
	}
	if d.runner != nil {
		d.runner.Close()
	}
	if d.sess != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = d.sess.Close(ctx)
		cancel()
	}
	if d.prefill != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = d.prefill.Close(ctx)
		cancel()
	}
	if d.meta != nil {
		_ = d.meta.Close()
	}
}

// driverStartWait bounds how long a logits or bench request for a model
// whose plan is ready and driven here waits for its driver to start: the
// plan's status turns ready before the driver's session is open, and a
// caller that saw "ready" should be answered, not refused.
const driverStartWait = 15 * time.Second

// localDriver returns the driver of model on this node, or an error that
// says where the model is or why it is not served. When the plan is ready
// and driven here but its driver has not started (or is moving to a new
// session), it waits for it: at most driverStartWait, or until ctx ends.
func (r *Reconciler) localDriver(ctx context.Context, model string) (*driver, error) {
	deadline := time.Now().Add(driverStartWait)
	for {
		r.mu.Lock()
		d := r.drivers[model]
		rt, planned := r.routes[model]
		r.mu.Unlock()
		switch {
		case d != nil && d.err() == nil:
			return d, nil
		case !planned:
			return nil, transport.Errorf(http.StatusNotFound, "model %q is not loaded on the cluster (see 'shoal model ls')", model)
		case rt.Node != r.cfg.Node:
			return nil, transport.Errorf(http.StatusMisdirectedRequest, "model %q is driven by node %s", model, rt.NodeName)
		case rt.Ready && time.Now().Before(deadline): // starting, or moving to a new session
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
				continue
			}
		}
		return nil, transport.Errorf(http.StatusServiceUnavailable, "model %q is not served yet (%s)", model, rt.Status)
	}
}

// retireIdle is how long a retiring driver must be idle before it stops.
const retireIdle = 250 * time.Millisecond

// retireDriver stops driver d, whose model is now driven by another node,
// without cutting its requests in flight: they finish on d's session over
// the replaced plan, whose members run on LingerAfterLoad, for up to
// RetireMax, while new requests go to the new driver (the route names it,
// and the model is no longer published here). Before, a driver that moved
// ended every stream it carried with an error: a drained driver, and so
// each step of a rolling upgrade, cut its clients off.
func (r *Reconciler) retireDriver(d *driver) {
	rt, ok := r.cfg.Publisher.(Retirer)
	if !ok || !d.pub {
		r.log.Info("stopping distributed serving: driven elsewhere now", zap.String("model", d.name))
		r.stopDriver(d)
		return
	}
	busy, stop, ok := rt.Retire(d.name)
	if !ok {
		r.stopDriver(d)
		return
	}
	r.mu.Lock()
	if r.drivers[d.name] == d {
		delete(r.drivers, d.name)
	}
	d.pub = false // retired from the publisher: stopDriver must not withdraw a newer driver's model
	if r.retiring == nil {
		r.retiring = map[*driver]func(){}
	}
	quit := make(chan struct{})
	var once sync.Once
	r.retiring[d] = func() { once.Do(func() { close(quit) }) }
	r.mu.Unlock()
	r.log.Info("the model is driven elsewhere now: finishing the requests in flight here first", zap.String("model", d.name), zap.Uint64("version", d.version))
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		t0 := time.Now()
		idle := awaitIdle(busy, quit, RetireMax)
		if idle {
			r.log.Info("the moved driver finished its requests in flight; stopping it", zap.String("model", d.name), zap.Duration("took", time.Since(t0)))
		} else {
			r.log.Warn("stopping the moved driver with requests still in flight", zap.String("model", d.name), zap.Duration("after", time.Since(t0)))
		}
		stop()
		r.stopDriver(d)
		r.mu.Lock()
		delete(r.retiring, d)
		r.mu.Unlock()
	}()
}

// awaitIdle waits until busy has been false for retireIdle (a request that
// found the model just before it was retired may not have reached the
// scheduler yet), and reports true; false when limit passes or quit closes
// first.
func awaitIdle(busy func() bool, quit <-chan struct{}, limit time.Duration) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	var idleSince time.Time
	for time.Now().Before(deadline) {
		switch {
		case busy():
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) >= retireIdle:
			return true
		}
		select {
		case <-quit:
			return false
		case <-tick.C:
		}
	}
	return false
}
