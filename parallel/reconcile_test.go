package parallel

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/placement"
	"shoal/placement/placementtest"
	"shoal/serve"
	"shoal/shard"
	"shoal/transport"
)

// testShards is a ShardSource over shards opened from a local file.
type testShards struct {
	path  string
	ready []shard.Ready
}

func (s *testShards) Ready() []shard.Ready            { return s.ready }
func (s *testShards) Meta(string) (*gguf.File, error) { return gguf.Open(s.path) }

// testPublisher records what a reconciler publishes.
type testPublisher struct {
	mu         sync.Mutex
	live       map[string]Servable
	log        []string
	onWithdraw func(name string)
	// busy, when set, makes the publisher a Retirer: it tells whether a
	// retired model's requests are still in flight; its stop calls
	// onWithdraw.
	busy func() bool
}

func (p *testPublisher) Retire(name string) (func() bool, func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy == nil || p.live[name].Engine == nil && p.live[name].Runner == nil {
		return nil, nil, false
	}
	delete(p.live, name)
	p.log = append(p.log, "retire "+name)
	hook := p.onWithdraw
	return p.busy, func() {
		if hook != nil {
			hook(name)
		}
	}, true
}

func (p *testPublisher) Publish(name string, s Servable) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live[name] = s
	p.log = append(p.log, "publish "+name)
	return nil
}

func (p *testPublisher) Withdraw(name string) {
	p.mu.Lock()
	delete(p.live, name)
	p.log = append(p.log, "withdraw "+name)
	hook := p.onWithdraw
	p.mu.Unlock()
	if hook != nil {
		hook(name) // the agent's publisher closes the model's scheduler here
	}
}

func (p *testPublisher) get(name string) (Servable, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.live[name]
	return s, ok
}

// reconcilers starts a reconciler per node of plan (named n0, n1, ...),
// each holding its shards of the model at path, and reconciles them all
// with the plan of model "m" twice (members first, then the driver). They
// do not replay (TestReconcilerReplays does).
func reconcilers(t *testing.T, path string, plan placement.Plan, nodes ...string) ([]*Reconciler, []*transport.Endpoint, []*testPublisher, View) {
	view := View{Models: []PlannedModel{{Name: "m", Plan: plan, Addrs: map[string]string{}, Names: map[string]string{},
		Ready: true, Status: "ready", DriverHTTP: "127.0.0.1:1"}}}
	var eps []*transport.Endpoint
	var recs []*Reconciler
	var pubs []*testPublisher
	for _, n := range nodes {
		ep := listen(t, n)
		eps = append(eps, ep)
		view.Models[0].Addrs[n], view.Models[0].Names[n] = ep.Addr().String(), "node-"+n[1:]
		src := &testShards{path: path}
		for _, spec := range shard.SpecsFor(plan, n, "") {
			sh, err := shard.Open(path, spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sh.Close() })
			src.ready = append(src.ready, shard.Ready{Key: fmt.Sprint(n, spec.Lo), Model: "m", Version: plan.Version, Spec: spec, Shard: sh})
		}
		pub := &testPublisher{live: map[string]Servable{}}
		pubs = append(pubs, pub)
		recs = append(recs, NewReconciler(ReconcilerConfig{Host: NewHost(ep, nil, nil), Node: n, Shards: src, Publisher: pub,
			Threads: 1, StepTimeout: 3 * time.Second, ReplayWait: -1}))
	}
	t.Cleanup(func() {
		for i := range recs {
			recs[i].Close()
			eps[i].Close()
		}
	})
	for range 2 {
		for _, r := range recs {
			r.Reconcile(view)
		}
	}
	return recs, eps, pubs, view
}

// A plan of one node holding every layer is published as a local runner
// over the weights its member holds; cluster logits still run through a
// session and match a single node's.
func TestReconcilerOneNode(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plan("m", placementtest.Stage{Lo: 0, Hi: ref.Config.NLayer, Parts: placementtest.Whole()})
	plan.Context = 64
	recs, _, pubs, _ := reconcilers(t, path, plan, "n0")
	pub, ok := pubs[0].get("m")
	if !ok || pub.Runner == nil || pub.Engine != nil || pub.Meta == nil {
		t.Fatalf("published %+v %v, want a local runner", pub, ok)
	}
	// The runner and the shard's member share one copy of the weights.
	recs[0].mu.Lock()
	for key, rm := range recs[0].members {
		if rm.m.cfg.Model != pub.Runner.Model() {
			t.Errorf("member %s loaded the weights a second time", key)
		}
	}
	recs[0].mu.Unlock()
	toks := []int32{1, 45, 496}
	l, err := recs[0].Logits(context.Background(), "m", toks)
	if err != nil {
		t.Fatal(err)
	}
	if err := enginetest.Compare(enginetest.Reference(t, ref, &enginetest.Case{Prompt: toks}), l.Data, ref.NVocab).Check(false); err != nil {
		t.Errorf("logits: %v", err)
	}
	recs[0].Reconcile(View{})
	if _, ok := pubs[0].get("m"); ok || len(recs[0].Routes()) != 0 {
		t.Error("a model no longer planned is still published or routed")
	}
}

// A two-stage plan through two reconcilers: the node of stage 0 drives
// and publishes the model, the other routes to it; cluster logits equal a
// single node's; a benchmark reports the activation dtype it ran with; a
// member that dies fails the served step, wakes the driver's owner, and
// the next Reconcile withdraws the model.
func TestReconcilerServesAPlan(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans("m").Get("pp2") // n0, n1
	plan.Version, plan.Context = 3, 64
	recs, eps, pubs, view := reconcilers(t, path, plan, "n0", "n1")
	pub, ok := pubs[0].get("m")
	eng := pub.Engine
	if _, other := pubs[1].get("m"); !ok || eng == nil || pub.Runner != nil || other {
		t.Fatalf("published on n0: %v, on n1: %v; want the model on the driver only", pubs[0].log, pubs[1].log)
	}
	rt, ok := recs[1].Route("m")
	if !ok || rt.Node != "n0" || rt.NodeName != "node-0" || !rt.Ready || rt.HTTPAddr != "127.0.0.1:1" {
		t.Fatalf("route on n1: %+v %v", rt, ok)
	}
	ctx := context.Background()
	if _, err := recs[1].Logits(ctx, "m", []int32{1, 2}); transport.StatusOf(err) != 421 {
		t.Errorf("logits on a node that does not drive: %v", err)
	}
	if _, err := recs[0].Logits(ctx, "nope", []int32{1}); transport.StatusOf(err) != 404 {
		t.Errorf("logits of an unknown model: %v", err)
	}

	toks := []int32{1, 45, 496, 173}
	l, err := recs[0].Logits(ctx, "m", toks)
	if err != nil {
		t.Fatal(err)
	}
	want := enginetest.Reference(t, ref, &enginetest.Case{Prompt: toks})
	if err := enginetest.Compare(want, l.Data, ref.NVocab).Check(false); err != nil || l.NTokens != len(toks) || l.NVocab != ref.NVocab {
		t.Errorf("cluster logits %dx%d: %v", l.NTokens, l.NVocab, err)
	}

	for _, dt := range []transport.DType{0, transport.F16} {
		res, err := recs[0].Bench(ctx, "m", BenchRequest{Prompt: []int{8}, Gen: []int{4}, Reps: 1, Activations: dt})
		if err != nil {
			t.Fatal(err)
		}
		wantDT := DefaultWire.String() // the model's: the default
		if dt != 0 {
			wantDT = dt.String()
		}
		if res.Activations != wantDT || len(res.Results) != 2 || res.PlanVersion != 3 || res.Nodes != 2 ||
			len(res.Stages) != 2 || res.Stages[0] != fmt.Sprintf("[0,%d) node-0", plan.Pools[0].Stages[0].Hi) {
			t.Errorf("bench with %v: %+v", dt, res)
		}
		for _, row := range res.Results {
			if row.TokPerSec <= 0 || row.BytesPerToken <= 0 {
				t.Errorf("bench row %+v", row)
			}
		}
	}

	// Stage 1 dies: the served step fails and wakes the owner.
	eps[1].Close()
	b := model.Batch{Tokens: toks[:1], Chunks: []model.Chunk{{Seq: 1, N: 1}}}
	if _, err := eng.Step(&b, []int{0}); err == nil {
		t.Fatal("a step with a dead member succeeded")
	}
	select {
	case <-recs[0].Wake():
	case <-time.After(time.Second):
		t.Fatal("a failed step did not wake the reconciler's owner")
	}
	recs[0].Reconcile(view)
	if _, ok := pubs[0].get("m"); ok {
		t.Errorf("the failed driver is still published: %v", pubs[0].log)
	}
	if _, err := recs[0].Logits(ctx, "m", toks); transport.StatusOf(err) != 503 {
		t.Errorf("logits after the driver failed: %v", err)
	}
}

// TestReconcilerReplays: a stream on a two-stage plan (n0, n1) goes on
// when n1 dies and the cluster re-plans stage 1 onto n2: the driver's
// engine waits, the reconciler opens a session over the new plan, the
// engine replays the sequence on it, and the request finishes with the
// tokens a single node gives. The model is never withdrawn.
func TestReconcilerReplays(t *testing.T) {
	ref, path := openRef(t)
	v3, v4 := stageOneMoves(ref)
	eps, recs, pub, viewOf := replayRig(t, path, 3, 20*time.Second, v3, v4)
	reconcile := func(v View, rs ...*Reconciler) {
		for range 2 {
			for _, r := range rs {
				r.Reconcile(v)
			}
		}
	}
	reconcile(viewOf(v3), recs...)
	served, ok := pub.get("m")
	if !ok || served.Engine == nil {
		t.Fatalf("n0 published %v", pub.log)
	}

	prompt := []int32{1, 450, 496, 173}
	const n = 12
	generate := func(e serve.Engine, after3 func()) ([]int32, error) {
		return generateGreedy(t, e, prompt, n, func(k int) {
			if k == 3 && after3 != nil {
				after3()
			}
		})
	}
	want := singleNode(t, ref, prompt, n)
	got, err := generate(served.Engine, func() {
		eps[1].Close() // n1 dies; the leader re-plans stage 1 onto n2
		go func() {
			<-recs[0].Wake()
			reconcile(viewOf(v4), recs[0], recs[2])
		}()
	})
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("generated %v (%v), a single node %v", got, err, want)
	}
	if n, pause := served.Engine.Replays(); n != 1 {
		t.Errorf("%d replays, want 1", n)
	} else {
		t.Logf("replayed on plan v4 after n1 died; the steps paused %v while replaying", pause.Round(time.Millisecond))
	}
	if len(pub.log) != 1 {
		t.Errorf("publisher: %v, want the model published once and never withdrawn", pub.log)
	}
	recs[0].mu.Lock()
	d := recs[0].drivers["m"]
	recs[0].mu.Unlock()
	if v := d.view(); v.version != 4 || d.err() != nil {
		t.Errorf("driver on plan v%d, err %v", v.version, d.err())
	}
}

// TestStopDriverWhileReplayWaits: a driver whose step failed (a member
// died) waits up to ReplayWait for a new session; when the next plan no
// longer has it drive the model, stopping it must not wait for that: the
// publisher's Withdraw closes the scheduler, whose loop is inside the
// failed step. It waited the whole ReplayWait (60 s by default), and the
// agent's serving loop with it: every model on the node stalled.
func TestStopDriverWhileReplayWaits(t *testing.T) {
	ref, path := openRef(t)
	v3 := shapeOf(&ref.Config).Plans("m").Get("pp2") // n0, n1
	v3.Version, v3.Context = 3, 64
	eps, recs, pub, viewOf := replayRig(t, path, 2, 30*time.Second, v3)
	view := viewOf(v3)
	for range 2 {
		for _, r := range recs {
			r.Reconcile(view)
		}
	}
	served, ok := pub.get("m")
	if !ok || served.Engine == nil {
		t.Fatalf("n0 published %v", pub.log)
	}
	sc, err := serve.NewEngine(served.Engine, func(int32) bool { return false }, serve.Options{MaxSeqs: 2, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	pub.mu.Lock()
	pub.onWithdraw = func(string) { sc.Close() }
	pub.mu.Unlock()
	ch, err := sc.Submit(context.Background(), serve.Request{Prompt: []int32{1, 450, 496, 173}, MaxTokens: 40, Sampling: sample.Params{}})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	ended := make(chan error, 1)
	go func() {
		var last error
		for ev := range ch {
			if ev.Err != nil {
				last = ev.Err
			}
			if !ev.Done {
				got++
				if got == 3 {
					eps[1].Close() // n1 dies: the next step fails and waits for a session
				}
			}
		}
		ended <- last
	}()
	select {
	case <-recs[0].Wake(): // the failed step told the reconciler
	case <-time.After(20 * time.Second):
		t.Fatal("the step did not fail after n1 died")
	}
	// The next plan does not have n0 drive the model.
	t0 := time.Now()
	done := make(chan struct{})
	go func() {
		recs[0].Reconcile(View{})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stopping the driver waits for the failed step's replay wait (30 s)")
	}
	t.Logf("driver stopped %v after the plan dropped it", time.Since(t0).Round(time.Millisecond))
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the request in flight ended without an error although its driver stopped")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request in flight did not end")
	}
}

// replayRig starts n reconcilers (nodes n0, n1, ...) holding their shards
// of every plan, n0 publishing to pub; viewOf makes the view of one plan.
func replayRig(t *testing.T, path string, n int, replayWait time.Duration, plans ...placement.Plan) (
	eps []*transport.Endpoint, recs []*Reconciler, pub *testPublisher, viewOf func(placement.Plan) View) {
	t.Helper()
	addrs, names := map[string]string{}, map[string]string{}
	var nodes []string
	for i := range n {
		node := fmt.Sprint("n", i)
		ep := listen(t, node)
		eps, nodes = append(eps, ep), append(nodes, node)
		addrs[node], names[node] = ep.Addr().String(), fmt.Sprint("node-", i)
	}
	viewOf = func(p placement.Plan) View {
		return View{Models: []PlannedModel{{Name: "m", Plan: p, Addrs: addrs, Names: names, Ready: true, Status: "ready", DriverHTTP: "127.0.0.1:1"}}}
	}
	pub = &testPublisher{live: map[string]Servable{}}
	for i, node := range nodes {
		src := &testShards{path: path}
		for _, p := range plans {
			for _, spec := range shard.SpecsFor(p, node, "") {
				sh, err := shard.Open(path, spec)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sh.Close() })
				src.ready = append(src.ready, shard.Ready{Key: fmt.Sprint(node, p.Version, spec.Lo), Model: "m", Version: p.Version, Spec: spec, Shard: sh})
			}
		}
		p := Publisher(&testPublisher{live: map[string]Servable{}})
		if i == 0 {
			p = pub
		}
		recs = append(recs, NewReconciler(ReconcilerConfig{Host: NewHost(eps[i], nil, nil), Node: node, Shards: src, Publisher: p,
			Threads: 1, StepTimeout: 3 * time.Second, ReplayWait: replayWait}))
	}
	t.Cleanup(func() {
		for i := range recs {
			recs[i].Close()
			eps[i].Close()
		}
	})
	return eps, recs, pub, viewOf
}

// TestReconcilerMakesBeforeBreak: a plan replaced while the model serves
// (stage 1 moves from n1 to n2, n1 alive) keeps serving on the old plan's
// session while the new one loads: tokens keep coming, then the driver
// moves at a step once the new plan is ready, and the text is a single
// node's. Without the old plan's members lingering (Prev), n1 would drop
// its member at once and the stream would stall until the new plan
// loaded.
func TestReconcilerMakesBeforeBreak(t *testing.T) {
	ref, path := openRef(t)
	v3, v4 := stageOneMoves(ref)
	_, recs, pub, viewOf := replayRig(t, path, 3, 20*time.Second, v3, v4)
	reconcile := func(v View) { reconcileAll(recs, v) }
	reconcile(viewOf(v3))
	served, ok := pub.get("m")
	if !ok || served.Engine == nil {
		t.Fatalf("n0 published %v", pub.log)
	}
	loading, ready := viewOf(v4), viewOf(v4)
	loading.Models[0].Ready, loading.Models[0].Prev, loading.Models[0].PrevDriver = false, 3, "n0"
	ready.Models[0].Prev, ready.Models[0].PrevDriver = 3, "n0"

	prompt := []int32{1, 450, 496, 173}
	const n = 12
	want := singleNode(t, ref, prompt, n)
	// The views change between steps: after the third token's step, v4
	// is committed and loads; after the sixth, it is loaded.
	got, err := generateGreedy(t, &steppedEngine{Engine: served.Engine, before: func(k int) {
		switch k {
		case 3:
			reconcile(loading)
			if rt, _ := recs[2].Route("m"); rt.Node != "n0" || !rt.Ready {
				t.Errorf("while v4 loads, n2 routes the model to %+v, want n0 ready (it serves v3)", rt)
			}
		case 6:
			reconcile(ready) // three steps ran on v3 meanwhile
		}
	}}, prompt, n, nil)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("generated %v (%v), a single node %v", got, err, want)
	}
	if n, _ := served.Engine.Replays(); n != 1 {
		t.Errorf("%d replays, want 1 (the move to v4)", n)
	}
	recs[0].mu.Lock()
	d := recs[0].drivers["m"]
	recs[0].mu.Unlock()
	if v := d.view(); v.version != 4 || d.err() != nil {
		t.Errorf("driver on plan v%d, err %v", v.version, d.err())
	}
	// Once the replaced plan stops lingering, its members go.
	reconcile(viewOf(v4))
	recs[1].mu.Lock()
	left := len(recs[1].members)
	recs[1].mu.Unlock()
	if left != 0 {
		t.Errorf("n1 runs %d members after v3 stopped lingering", left)
	}
}

// TestReconcilerRetiresMovedDriver: a plan that moves the driver to
// another node (n0 drained, say) lets the request in flight on the old
// driver finish there, on the replaced plan whose members linger, while
// the new driver serves: the request gets every token, the text a single
// node's, and no error; the old driver stops once it is idle. Before, the
// old driver stopped at once and the request ended with "the model
// stopped being served here".
func TestReconcilerRetiresMovedDriver(t *testing.T) {
	ref, path := openRef(t)
	v3, _ := stageOneMoves(ref)      // n0 drives stage 0, n1 stage 1
	v5 := stageMoved(v3, 0, 5, "n2") // the driver moves to n2
	_, recs, pub, viewOf := replayRig(t, path, 3, 20*time.Second, v3, v5)
	reconcile := func(v View) { reconcileAll(recs, v) }
	reconcile(viewOf(v3))
	served, ok := pub.get("m")
	if !ok || served.Engine == nil {
		t.Fatalf("n0 published %v", pub.log)
	}
	sc, err := serve.NewEngine(served.Engine, func(int32) bool { return false }, serve.Options{MaxSeqs: 2, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	stopped := make(chan struct{})
	pub.mu.Lock()
	pub.busy = func() bool { s := sc.Stats(); return s.Running+s.Waiting > 0 }
	pub.onWithdraw = func(string) { sc.Close(); close(stopped) }
	pub.mu.Unlock()

	moved := viewOf(v5)
	moved.Models[0].Prev = 3 // v3's members run on beside v5's
	prompt := []int32{1, 450, 496, 173}
	const n = 24
	want := singleNode(t, ref, prompt, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sc.Submit(ctx, serve.Request{Prompt: prompt, MaxTokens: n, Sampling: sample.Params{}})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	var last error
	for ev := range ch {
		if ev.Err != nil {
			last = ev.Err
		}
		if !ev.Done {
			got = append(got, ev.Token)
			if len(got) == 4 {
				reconcile(moved) // v5 is ready: n2 drives now
				if rt, _ := recs[1].Route("m"); rt.Node != "n2" {
					t.Errorf("after the move n1 routes the model to %+v, want n2", rt)
				}
				if _, ok := pub.get("m"); ok {
					t.Error("n0 still publishes the model to new requests after its driver moved")
				}
			}
		}
	}
	if last != nil || !slices.Equal(got, want) {
		t.Fatalf("the request in flight on the moved driver: %v (error %v), a single node gives %v", got, last, want)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the moved driver did not stop once its request finished")
	}
	recs[0].mu.Lock()
	d, left := recs[0].drivers["m"], len(recs[0].retiring)
	recs[0].mu.Unlock()
	if d != nil {
		t.Errorf("n0 still drives the model after it moved")
	}
	for range 100 {
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
		recs[0].mu.Lock()
		left = len(recs[0].retiring)
		recs[0].mu.Unlock()
	}
	if left != 0 {
		t.Errorf("%d drivers still retiring", left)
	}
}

// steppedEngine calls before(k) ahead of each step, k the steps run before.
type steppedEngine struct {
	*Engine
	before func(k int)
	k      int
}

func (e *steppedEngine) Step(b *model.Batch, rows []int) ([]float32, error) {
	e.before(e.k)
	e.k++
	return e.Engine.Step(b, rows)
}

func (e *steppedEngine) StepSampled(b *model.Batch, rows []int, reqs []sample.Request) ([]sample.Result, error) {
	e.before(e.k)
	e.k++
	return e.Engine.StepSampled(b, rows, reqs)
}

// stageOneMoves is the pp2 plan of ref's model on n0 and n1 (v3), and the
// same with stage 1 on n2 (v4).
func stageOneMoves(ref *model.Model) (v3, v4 placement.Plan) {
	v3 = shapeOf(&ref.Config).Plans("m").Get("pp2")
	v3.Version, v3.Context = 3, 64
	return v3, stageMoved(v3, 1, 4, "n2")
}

// stageMoved is p as version v with stage i on node.
func stageMoved(p placement.Plan, i int, v uint64, node string) placement.Plan {
	p.Version = v
	p.Pools = []placement.Pool{p.Pools[0]}
	p.Pools[0].Stages = slices.Clone(p.Pools[0].Stages)
	st := &p.Pools[0].Stages[i]
	st.Members = slices.Clone(st.Members)
	for j := range st.Members {
		st.Members[j].Node = node
	}
	return p
}

// reconcileAll has every reconciler take view v, twice (members first,
// then the driver).
func reconcileAll(recs []*Reconciler, v View) {
	for range 2 {
		for _, r := range recs {
			r.Reconcile(v)
		}
	}
}

// generateGreedy runs one greedy request of n tokens for prompt on e
// (within 15 s), calling at with the count of tokens received after each.
func generateGreedy(t *testing.T, e serve.Engine, prompt []int32, n int, at func(k int)) ([]int32, error) {
	t.Helper()
	sc, err := serve.NewEngine(e, func(int32) bool { return false }, serve.Options{MaxSeqs: 2, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ch, err := sc.Submit(ctx, serve.Request{Prompt: prompt, MaxTokens: n, Sampling: sample.Params{}})
	if err != nil {
		return nil, err
	}
	var out []int32
	var last error
	for ev := range ch {
		if ev.Err != nil {
			last = ev.Err
		}
		if !ev.Done {
			out = append(out, ev.Token)
			if at != nil {
				at(len(out))
			}
		}
	}
	return out, last
}

// singleNode is the greedy text of n tokens for prompt on ref alone.
func singleNode(t *testing.T, ref *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want, err := generateGreedy(t, serve.RunnerEngine{R: r}, prompt, n, nil)
	if err != nil {
		t.Fatal(err)
	}
	return want
}
