package parallel

import (
	"testing"
	"time"

	"shoal/engine/kv"
	"shoal/placement/placementtest"
	"shoal/shard"
)

// TestReconcilerDraft: a driver whose draft shard is not ready waits for
// it (DraftWait), then serves without it; with the draft ready it serves
// with a drafter over it, which drafts the draft model's greedy tokens
// and drafts nothing once the draft's shard is dropped (DropMember, before
// the shard's mapping goes) while the model goes on being served.
func TestReconcilerDraft(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plan("m", placementtest.Stage{Lo: 0, Hi: ref.Config.NLayer, Parts: placementtest.Whole()})
	plan.Context = 64
	ep := listen(t, "n0")
	src := &testShards{path: path}
	spec := shard.SpecsFor(plan, "n0", "")[0]
	sh, err := shard.Open(path, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	src.ready = []shard.Ready{{Key: "main", Model: "m", Version: plan.Version, Spec: spec, Shard: sh}}
	pub := &testPublisher{live: map[string]Servable{}}
	r := NewReconciler(ReconcilerConfig{Host: NewHost(ep, nil, nil), Node: "n0", Shards: src, Publisher: pub, Threads: 1, ReplayWait: -1, DraftWait: 300 * time.Millisecond})
	t.Cleanup(func() { r.Close(); ep.Close() })
	view := View{Models: []PlannedModel{{Name: "m", Plan: plan, Addrs: map[string]string{"n0": ep.Addr().String()}, Names: map[string]string{"n0": "node-0"},
		Ready: true, Status: "ready", DraftKey: "draft", DraftMax: 3}}}

	r.Reconcile(view)
	r.Reconcile(view)
	if _, ok := pub.get("m"); ok {
		t.Fatal("published before the draft's shard was ready or the wait passed")
	}
	time.Sleep(350 * time.Millisecond)
	r.Reconcile(view)
	sv, ok := pub.get("m")
	if !ok || sv.Draft != nil {
		t.Fatalf("after the wait: published %v, draft %v; want served without a draft", ok, sv.Draft)
	}

	// The draft's shard is ready (the same file whole, a draft that always
	// agrees): a driver started again takes it up.
	dsh, err := shard.Open(path, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dsh.Close() })
	src.ready = append(src.ready, shard.Ready{Key: "draft", Model: "m#draft", Version: plan.Version, Spec: spec, Shard: dsh})
	r.Reconcile(View{})
	r.Reconcile(view)
	sv, ok = pub.get("m")
	if !ok || sv.Draft == nil || sv.DraftMax != 3 {
		t.Fatalf("with the draft ready: published %v, draft %v (max %d)", ok, sv.Draft, sv.DraftMax)
	}
	// A model no longer planned forgets its wait: loaded again, it waits
	// for its draft again.
	r.mu.Lock()
	r.draftSince["gone"] = time.Now().Add(-time.Hour)
	r.mu.Unlock()
	r.Reconcile(view)
	r.mu.Lock()
	_, kept := r.draftSince["gone"]
	r.mu.Unlock()
	if kept {
		t.Error("the draft wait of a model no longer planned was kept")
	}
	prompt := []int32{1, 45, 496}
	got := sv.Draft.Draft(kv.SeqID(1), prompt, 3, nil)
	want := singleNode(t, ref, prompt, 3)
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("drafted %v, the model's greedy tokens %v", got, want)
	}
	r.DropMember("draft")
	if d := sv.Draft.Draft(kv.SeqID(1), prompt, 3, nil); len(d) != 0 {
		t.Errorf("a dropped draft still drafts %v", d)
	}
	if _, ok := pub.get("m"); !ok {
		t.Error("dropping the draft withdrew the model")
	}
}
