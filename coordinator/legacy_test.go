package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"shoal/placement"
)

// legacyPlan is a plan as the state stored it before it stored
// placement.Plan: a mirror of the pools and the predicted cost beside the
// planner's plan under "placement". %d is the version.
const legacyPlan = `{"version":%d,"model":"llama",
 "pools":[{"role":"shared","stages":[{"lo":0,"hi":16,"members":[{"node":"a","tp_rank":0,"tp_size":1}]},
                                     {"lo":16,"hi":32,"members":[{"node":"b","tp_rank":0,"tp_size":1}]}]}],
 "predicted_ms_per_token":12.5,
 "placement":{"version":%[1]d,"model":"llama","strategy":"pipeline","context":2048,"batch":1,"explain":["why"],
  "cost":{"ms_per_token":12.5,"compute_ms":5,"memory_ms":12,"network_ms":0.5,"bottleneck_ms":6.5},
  "pools":[{"role":"shared","cost":{"ms_per_token":12.5},"stages":[
   {"lo":0,"hi":16,"ms":6,"members":[{"node":"a","tp_rank":0,"tp_size":1,"head_lo":0,"head_hi":32,"ffn_lo":0,"ffn_hi":14336,"embedding":true,"mem_bytes":100,"ms":6}]},
   {"lo":16,"hi":32,"ms":6.5,"members":[{"node":"b","tp_rank":0,"tp_size":1,"head_lo":0,"head_hi":32,"ffn_lo":0,"ffn_hi":14336,"output":true,"mem_bytes":90,"ms":6}]}]}]},
 "moved":["b: nothing -> layers [16,32) (fetches 2.0 GiB)"],"moved_bytes":2147483648,
 "created_at":"2026-01-02T03:04:05Z"}`

// wantLegacy is what legacyPlan restores to.
func wantLegacy(version uint64) *placement.Plan {
	member := func(node string, embd, out bool, mem uint64) placement.Member {
		return placement.Member{Node: node, TPSize: 1, HeadHi: 32, FFNHi: 14336, Embedding: embd, Output: out, MemBytes: mem, Ms: 6}
	}
	return &placement.Plan{
		Version: version, Model: "llama", Strategy: "pipeline", Context: 2048, Batch: 1, Explain: []string{"why"},
		Cost: placement.Cost{MsPerToken: 12.5, ComputeMs: 5, MemoryMs: 12, NetworkMs: 0.5, BottleneckMs: 6.5},
		Pools: []placement.Pool{{Role: "shared", Cost: placement.Cost{MsPerToken: 12.5}, Stages: []placement.Stage{
			{Lo: 0, Hi: 16, Ms: 6, Members: []placement.Member{member("a", true, false, 100)}},
			{Lo: 16, Hi: 32, Ms: 6.5, Members: []placement.Member{member("b", false, true, 90)}},
		}}},
		Moved: []string{"b: nothing -> layers [16,32) (fetches 2.0 GiB)"}, MovedBytes: 2 << 30,
	}
}

// A snapshot written before the state stored placement.Plan restores: the
// plan under "placement" with the wrapper's moves; a wrapper without one
// (no placement) becomes a plan without pools. A PlanSet entry of the old
// shape in the log after it applies too.
func TestFSMRestoresLegacyPlans(t *testing.T) {
	snap := `{"nodes":{},"tokens":{},"shards":{},"index":7,
 "models":{"llama":{"name":"llama","source":"llama.gguf","created_at":"2026-01-02T03:04:05Z"},
           "bare":{"name":"bare","source":"bare.gguf","created_at":"2026-01-02T03:04:05Z"}},
 "plans":{"llama":` + fmt.Sprintf(legacyPlan, 3) + `,
          "bare":{"version":2,"model":"bare","predicted_ms_per_token":0,"created_at":"2026-01-02T03:04:05Z",
                  "pools":[{"role":"shared","stages":[{"lo":0,"hi":8,"members":[{"node":"a","tp_rank":0,"tp_size":1}]}]}]}}}`
	f := NewFSM()
	if err := f.Restore(io.NopCloser(strings.NewReader("\x01" + snap))); err != nil {
		t.Fatal(err)
	}
	s := f.State()
	want := map[string]*placement.Plan{"llama": wantLegacy(3), "bare": {Version: 2, Model: "bare"}}
	if !reflect.DeepEqual(s.Plans, want) {
		t.Fatalf("restored plans:\n%s\nwant:\n%s", jsonOf(s.Plans), jsonOf(want))
	}
	a := &applier{t: t, f: f, index: 7}
	a.ok(PlanSetType, json.RawMessage(`{"plan":`+fmt.Sprintf(legacyPlan, 4)+`}`))
	if got := f.State().Plans["llama"]; !reflect.DeepEqual(got, wantLegacy(4)) {
		t.Fatalf("applied legacy plan:\n%s\nwant:\n%s", jsonOf(got), jsonOf(wantLegacy(4)))
	}
	// What the state writes now reads back the same.
	snapNow, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snapNow.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sink.String(), "predicted_ms_per_token") || strings.Contains(sink.String(), `"placement"`) {
		t.Fatalf("snapshot still writes the old shape: %s", sink.String())
	}
	back, err := ReadSnapshot(bytes.NewReader(sink.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Plans, f.State().Plans) {
		t.Fatalf("round trip:\n%s\nwant:\n%s", jsonOf(back.Plans), jsonOf(f.State().Plans))
	}
}

func jsonOf(v any) string {
	b, _ := json.MarshalIndent(v, "", " ")
	return string(b)
}
