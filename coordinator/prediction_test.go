package coordinator

import (
	"fmt"
	"testing"

	"shoal/placement"
)

// TestDecodePrediction (issue #38: bench --cluster printed 0.77 ms/token
// predicted beside 52 measured, later 4.88 predicted beside 1.31): a plan
// made before any link was measured costs each hop at the default 1 ms,
// and for a step of its whole batch. What a driver's one-sequence decode
// steps are held against is that plan re-costed for one sequence on the
// figures the state holds now.
func TestDecodePrediction(t *testing.T) {
	f := NewFSM()
	must := (&applier{t: t, f: f}).ok
	ids := []string{"n1", "n2", "n3"}
	for i, id := range ids {
		must(RegisterNodeType, RegisterNodeRequest{Now: t0, Node: Node{ID: id, Name: id, Role: RoleServer, RPCAddr: fmt.Sprintf("10.0.0.%d:7947", i+1), Status: StatusAlive,
			Caps: Capabilities{MemTotal: 64 << 20, MemFree: 48 << 20, Cores: 8, GFLOPS: 100, MemGBps: 20}}})
	}
	must(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m", Source: "/m.gguf", Digest: "d", SourceNode: "n1", Profile: validProfile(6), Layers: 6,
		Ctx: 64, MaxSeqs: 4, Overhead: 1 << 20, Strategy: string(placement.Pipeline), Pin: ids}})
	st := f.State()
	if _, _, ok := DecodePrediction(st, "m"); ok {
		t.Fatal("a model without a plan has a prediction")
	}
	d := decidePlan(st, st.Models["m"], nil)
	if d.Unservable != "" || len(d.Plan.Nodes()) != 3 {
		t.Fatalf("plan: %q over %v", d.Unservable, d.Plan.Nodes())
	}
	must(PlanSetType, PlanSetRequest{Plan: d.Plan, Inputs: planInputs(st, st.Models["m"])})
	planned := d.Plan.Cost.MsPerToken

	// No link measured yet: the same links as the plan's, one sequence
	// instead of four.
	v, unmeasured, ok := DecodePrediction(f.State(), "m")
	if !ok || v != d.Plan.Version || unmeasured <= 0 || unmeasured > planned {
		t.Fatalf("before links: v%d %.3f ms (ok %v), the plan v%d %.3f ms", v, unmeasured, ok, d.Plan.Version, planned)
	}
	var links []LinkStat
	for _, a := range ids {
		for _, b := range ids {
			if a != b {
				links = append(links, LinkStat{From: a, To: b, Gbit: 10, LatencyMs: 0.02})
			}
		}
	}
	must(LinkReportType, LinkReportRequest{Links: links})
	_, now, ok := DecodePrediction(f.State(), "m")
	// Three hops (two between stages, the token back) of 1 ms each become
	// 0.02 ms each.
	if !ok || now > unmeasured-2.5 || now <= 0 {
		t.Fatalf("after links of 0.02 ms: %.3f ms, before %.3f (the plan's %.3f)", now, unmeasured, planned)
	}
	if p := f.State().Plans["m"]; p.Cost.MsPerToken != planned {
		t.Fatalf("the committed plan's cost changed: %.3f", p.Cost.MsPerToken)
	}
	t.Logf("plan %.3f ms/token (4 sequences, default links); one sequence: %.3f before links, %.3f after", planned, unmeasured, now)
}
