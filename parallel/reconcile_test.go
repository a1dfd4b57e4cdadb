package parallel

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/placement"
	"shoal/placement/placementtest"
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
	mu   sync.Mutex
	live map[string]Servable
	log  []string
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
	defer p.mu.Unlock()
	delete(p.live, name)
	p.log = append(p.log, "withdraw "+name)
}

func (p *testPublisher) get(name string) (Servable, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.live[name]
	return s, ok
}

// reconcilers starts a reconciler per node of plan (named n0, n1, ...),
// each holding its shards of the model at path, and reconciles them all
// with the plan of model "m" twice (members first, then the driver).
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
			Threads: 1, StepTimeout: 3 * time.Second}))
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
		wantDT := "f32"
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
