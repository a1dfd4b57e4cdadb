package parallel

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/transport"
)

// TestStepTimeoutDefault: a model served across nodes fails a step whose
// member stopped answering within 10 s (a paused or partitioned member
// turns into an error, or a replay, that soon).
func TestStepTimeoutDefault(t *testing.T) {
	r := NewReconciler(ReconcilerConfig{})
	if r.cfg.StepTimeout != 10*time.Second || DefaultStepTimeout != 10*time.Second {
		t.Fatalf("step timeout %v, default %v; want 10s", r.cfg.StepTimeout, DefaultStepTimeout)
	}
}

// TestStepFailsOnSilentMember: a member whose connection stays up but
// whose step never answers (a wedged process) fails the driver's step
// within the step timeout, with an error that names it.
func TestStepFailsOnSilentMember(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	const timeout = time.Second
	cl := startCluster(t, path, plan, Options{Timeout: timeout})
	drv, err := cl.extraHost(t).NewCluster(plan, cl.addrs(), Options{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := drv.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	toks := enginetest.Tokens(9, ref.Config.NVocab, 4)
	step := func(tok []int32) error {
		b := model.Batch{Tokens: tok, Chunks: []model.Chunk{{Seq: 1, N: len(tok)}}}
		_, err := s.Step(ctx, &b, []int{len(tok) - 1})
		return err
	}
	if err := step(toks[:3]); err != nil {
		t.Fatal(err)
	}
	// The second stage's RPC server now holds every step.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	silent := transport.NewRPCServer(cl.eps[1], transport.KindRPC, time.Minute)
	silent.Register(methodStep, func(ctx context.Context, _ transport.Peer, _ json.RawMessage) (any, error) {
		<-release
		return nil, nil
	})
	start := time.Now()
	err = step(toks[3:4])
	elapsed := time.Since(start)
	t.Logf("step against a silent member failed after %v: %v", elapsed.Round(time.Millisecond), err)
	if err == nil {
		t.Fatal("a step with a silent member succeeded")
	}
	if elapsed > timeout+timeout/2 {
		t.Errorf("the step failed after %v, want within about %v", elapsed, timeout)
	}
	if node := cl.members[1].me.Node; !strings.Contains(err.Error(), node) && !strings.Contains(err.Error(), "no reply within") {
		t.Errorf("the error names neither node %s nor the timeout", node)
	}
}

// TestCloseReachesLiveMembers: a session whose other members are gone is
// still closed on the member that holds it (and its KV): one member's
// "no such member" answer must not cancel the close sent to another.
func TestCloseReachesLiveMembers(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans("dense").Get("pp3")
	for try := range 5 {
		cl := startCluster(t, path, plan, Options{Timeout: 5 * time.Second})
		ctx := context.Background()
		s, err := cl.drv.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b := model.Batch{Tokens: []int32{1, 2, 3}, Chunks: []model.Chunk{{Seq: 1, N: 3}}}
		if _, err := s.Step(ctx, &b, []int{2}); err != nil {
			t.Fatal(err)
		}
		for _, m := range cl.members[1:] {
			m.Close()
		}
		_ = s.Close(ctx)
		if n := cl.members[0].Sessions(); n != 0 {
			t.Fatalf("try %d: the live member still holds %d session(s) after Close", try, n)
		}
	}
}
