package parallel

import (
	"context"
	"testing"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
)

// TestMemberStepTimes: a cluster given Options.Times counts every step of
// each member node, with the engine's MemberSteps reporting them by name.
func TestMemberStepTimes(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	var times StepTimes
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second, Times: &times})
	times.SetNames(map[string]string{plan.Nodes()[0]: "first"})
	s, err := cl.drv.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	eng, err := NewEngine(s, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	const steps = 5
	for i := range steps {
		b := &model.Batch{Tokens: []int32{int32(1 + i)}, Chunks: []model.Chunk{{Seq: kv.SeqID(0), N: 1}}}
		if _, err := eng.Step(b, []int{0}); err != nil {
			t.Fatal(err)
		}
	}
	got := eng.MemberSteps()
	if len(got) != len(plan.Nodes()) {
		t.Fatalf("step times of %d nodes, the plan has %d: %+v", len(got), len(plan.Nodes()), got)
	}
	for _, m := range got {
		if m.Count != steps || m.Sum <= 0 || m.Buckets[len(m.Buckets)-1] != steps || (m.Node == plan.Nodes()[0]) != (m.Name == "first") {
			t.Errorf("node %s (%s): %d steps, %v in all, buckets %v", m.Node, m.Name, m.Count, m.Sum, m.Buckets)
		}
	}
}
