package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"shoal/placement"
)

// Budget of one fuzz input: the command through the door and the FSM,
// then the planner over the resulting state.
const (
	fuzzTime  = 20 * time.Second
	fuzzAlloc = 1 << 30
)

// fuzzRoles are the callers of Cluster.Apply: a client node (its own
// reports only), a client node relaying an operator's admin key, a server
// (the leader's own loops, a follower forwarding).
var fuzzRoles = []struct {
	peer Peer
	key  string
}{
	{Peer{ID: "w1", Role: RoleClient}, ""},
	{Peer{ID: "w1", Role: RoleClient}, "admin-key"},
	{Peer{ID: "n1", Role: RoleServer}, ""},
}

// fuzzBase is the state every fuzz input starts from: two servers and a
// client node, tokens, a planned model whose file w1 and n2 hold, links.
func fuzzBase(t testing.TB) *State {
	f := NewFSM()
	index := uint64(0)
	must := func(typ MessageType, req any) {
		index++
		if r := f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: mustEncode(typ, req)}); r != nil {
			t.Fatalf("base %s: %v", CommandName(typ), r)
		}
	}
	for i, id := range []string{"n1", "n2", "w1"} {
		role := RoleServer
		if id == "w1" {
			role = RoleClient
		}
		must(RegisterNodeType, RegisterNodeRequest{Now: t0, Node: Node{ID: id, Name: id, Role: role, RPCAddr: fmt.Sprintf("10.0.0.%d:7947", i+1), Status: StatusAlive,
			Caps: Capabilities{MemTotal: 64 << 20, MemFree: uint64(48+8*i) << 20, Cores: 8, GFLOPS: 100 * float64(i+1), MemGBps: 20}}})
	}
	must(TokenCreateType, TokenCreateRequest{Token: Token{ID: "adm", Kind: TokenAdmin, SecretHash: "h", CreatedAt: t0}})
	must(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m", Source: "/m.gguf", Digest: "d", SourceNode: "w1", Profile: validProfile(8), Layers: 8, Ctx: 64, Overhead: 1 << 20}})
	must(ModelHolderType, ModelHolderRequest{Model: "m", Holder: ModelHolder{Node: "n2", Digest: "d", State: HolderReady, UpdatedAt: t0}})
	must(LinkReportType, LinkReportRequest{Links: []LinkStat{{From: "n1", To: "n2", Gbit: 10, LatencyMs: 0.1}, {From: "w1", To: "n1", Gbit: 1, LatencyMs: 1}}})
	st := f.State()
	d := decidePlan(st, st.Models["m"], nil)
	if d.Unservable != "" {
		t.Fatalf("base plan: %s", d.Unservable)
	}
	must(PlanSetType, PlanSetRequest{Plan: d.Plan, Inputs: planInputs(st, st.Models["m"])})
	must(ShardStatusType, ShardStatusRequest{Shard: ShardStatus{Node: "w1", Model: "m", Lo: 0, Hi: 8, State: ShardReady, Bytes: 1 << 20}})
	return f.State()
}

// fuzzSeeds are bodies of every command type, valid ones and hostile ones.
func fuzzSeeds() []struct {
	typ  MessageType
	body any
} {
	bomb := bombProfile()
	negative := validProfile(8)
	negative.NLayer, negative.NHead, negative.FFNUnit = -8, -4, -1
	huge := strings.Repeat("\u00e9", 300) // past every name's bound; small enough to minimize fast
	prof := validProfile(8)
	return []struct {
		typ  MessageType
		body any
	}{
		{RegisterNodeType, RegisterNodeRequest{Now: t0, Node: Node{ID: "n9", Name: "n9", Role: RoleClient, Status: StatusAlive, Caps: Capabilities{MemFree: 1 << 30, GFLOPS: 10}}}},
		{RegisterNodeType, RegisterNodeRequest{Node: Node{ID: "n9", Name: huge, Role: "x", Status: "dead", Caps: Capabilities{Cores: -1, GFLOPS: 1e300, MemFree: math.MaxUint64}}}},
		{DeregisterNodeType, DeregisterNodeRequest{ID: "n2"}},
		{NodeStatusType, NodeStatusRequest{ID: "n1", Status: StatusFailed}},
		{NodeDrainType, NodeDrainRequest{ID: "n2", Drain: true}},
		{TokenCreateType, TokenCreateRequest{Token: Token{ID: "t9", Kind: TokenRead, SecretHash: "x"}}},
		{TokenCreateType, TokenCreateRequest{Token: Token{ID: huge, Kind: "god", Models: make([]string, 5000)}}},
		{TokenRevokeType, TokenRevokeRequest{ID: "adm"}},
		{ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "mine", Source: "/x.gguf", SourceNode: "w1", Digest: "e", Profile: prof, Ctx: 64, Overhead: 1 << 20}}},
		{ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "bomb", Source: "/x.gguf", SourceNode: "w1", Digest: "e", Profile: bomb}}},
		{ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "neg", SourceNode: "w1", Digest: "e", Profile: negative, Ctx: -1, MaxSeqs: -9, Replicas: -3}}},
		{ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m", Source: "/m.gguf", SourceNode: "w1", Digest: "d", Profile: prof, Pin: []string{"w1", "w1"}, Strategy: "tensor", Ctx: 1 << 30}}},
		{ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m", Source: "/m.gguf", SourceNode: "w1", Digest: "d", Profile: prof, Ctx: 64, Overhead: 1 << 20,
			Draft: &DraftFile{Source: "/d.gguf", Digest: "f", Manifest: "g", Bytes: 1 << 20, Layers: 1, KVBytesPerToken: 64, Max: 4}}}},
		{ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m", Source: "/m.gguf", SourceNode: "w1", Digest: "d", Profile: prof,
			Draft: &DraftFile{Source: huge, Bytes: math.MaxUint64, Layers: -1, KVBytesPerToken: math.MaxUint64, Max: 99}}}},
		{ShardStatusType, ShardStatusRequest{Shard: ShardStatus{Node: "w1", Model: DraftShardModel("m"), Lo: 0, Hi: 1, State: ShardReady}}},
		{ModelDeleteType, ModelDeleteRequest{Name: "m"}},
		{PlanSetType, PlanSetRequest{Plan: placement.Plan{Version: 9, Model: "m", Pools: []placement.Pool{{Role: "shared", Stages: []placement.Stage{
			{Lo: 0, Hi: 8, Members: []placement.Member{{Node: "n1", TPSize: 1, Embedding: true, Output: true}}}}}}}}},
		{PlanSetType, PlanSetRequest{Plan: placement.Plan{Version: 9, Model: "m", Pools: []placement.Pool{{Role: "shared", Stages: []placement.Stage{
			{Lo: 0, Hi: 1 << 30, Members: []placement.Member{{Node: "n1", TPSize: -1, HeadHi: -5, Experts: []int{1 << 40}}}}}}}}}},
		{ShardStatusType, ShardStatusRequest{Shard: ShardStatus{Node: "w1", Model: "m", Lo: 0, Hi: 8, State: ShardFailed, Error: "disk"}}},
		{ShardStatusType, ShardStatusRequest{Shard: ShardStatus{Node: "w1", Model: huge, Lo: -1, Hi: -9, State: "x"}}},
		{LinkReportType | IgnoreUnknownTypeFlag, LinkReportRequest{Links: []LinkStat{{From: "w1", To: "n2", Gbit: 0.5, LatencyMs: 3}}}},
		{LinkReportType, LinkReportRequest{Links: []LinkStat{{From: "w1", To: "w1", Gbit: -1, LatencyMs: 1e300}}}},
		{HTTPSCASetType, HTTPSCASetRequest{CA: HTTPSCA{CertPEM: "c", KeyPEM: "k"}}},
		{NodeRevokeType, NodeRevokeRequest{ID: "n2"}},
		{TokenRotateType, TokenRotateRequest{ID: "adm", SecretHash: "h2"}},
		{ModelHolderType | IgnoreUnknownTypeFlag, ModelHolderRequest{Model: "m", Holder: ModelHolder{Node: "w1", Digest: "d", State: HolderCopying}}},
		{ModelHolderType, ModelHolderRequest{Model: "m", Holder: ModelHolder{Node: "n1", Digest: "d", State: "x", Error: huge}}},
		{ProtocolSetType | IgnoreUnknownTypeFlag, ProtocolSetRequest{Protocol: 2}},
		{ProtocolSetType, ProtocolSetRequest{Protocol: -4}},
		{99, json.RawMessage(`{}`)},
		{IgnoreUnknownTypeFlag | 99, json.RawMessage(`{"anything":1}`)},
	}
}

// FuzzFSMCommands sends any command (type byte and body) from any role
// through the door a caller of that role uses (admitApply: the FSM's
// checks, then a client node's own report or an admin key), applies it to
// an FSM (also when the door refused it: a server that predates the
// checks may have written it to the log), then runs the leader's planner
// entry (decidePlan) on every model of the resulting state. Within a time
// and allocation budget: no panic (none recovered in Apply either), a
// command the checks refuse is refused by Apply with the same error and
// the state unchanged, and every plan the planner decides is one the FSM
// takes.
func FuzzFSMCommands(f *testing.F) {
	start := newFuzzStart(fuzzBase(f))
	for _, s := range fuzzSeeds() {
		b, err := json.Marshal(s.body)
		if err != nil {
			f.Fatal(err)
		}
		for r := range fuzzRoles {
			f.Add(uint8(r), uint8(s.typ), b)
		}
	}
	f.Fuzz(func(t *testing.T, role, typ uint8, body []byte) {
		fuzzBudget(t, func() error { return fuzzOne(start, role, typ, body) })
	})
}

// fuzzStart is the state every input starts from: pristine for reads, as
// JSON to copy it from, and a scratch copy the refused inputs share.
type fuzzStart struct {
	state   *State
	json    []byte
	scratch *State
}

func newFuzzStart(st *State) *fuzzStart {
	b, err := json.Marshal(st)
	if err != nil {
		panic(err)
	}
	return &fuzzStart{state: st, json: b, scratch: st.Clone()}
}

func (s *fuzzStart) copy() *State {
	c := NewState()
	if err := json.Unmarshal(s.json, c); err != nil {
		panic(err)
	}
	return c
}

// fuzzOne is one fuzz input: see FuzzFSMCommands.
func fuzzOne(start *fuzzStart, role, typ uint8, body []byte) error {
	caller := fuzzRoles[int(role)%len(fuzzRoles)]
	before := start.state
	req := ApplyRequest{Type: MessageType(typ), Body: body, Key: caller.key}
	checked := ValidateCommand(req.Type, req.Body)
	admitted := admitApply(caller.peer, req, func() *State { return before }, func(key string) bool { return key == "admin-key" })
	if admitted == nil && checked != nil {
		return fmt.Errorf("the door let through what the checks refuse: %v", checked)
	}
	fsm := NewFSM()
	if checked != nil {
		// Refused: applied to the shared scratch copy, which it must
		// leave as it was (checked below, byte for byte).
		fsm.state = start.scratch
	} else {
		fsm.state = start.copy()
	}
	res := fsm.Apply(&raft.Log{Index: before.Index + 1, Type: raft.LogCommand, Data: append([]byte{typ}, body...)})
	if e, ok := res.(*Error); ok && e.Code == http.StatusInternalServerError {
		return fmt.Errorf("apply panicked: %v", e)
	}
	after := fsm.state // no one else holds the FSM
	if checked != nil {
		if e, ok := res.(*Error); !ok || e.Msg != checked.Error() {
			return fmt.Errorf("apply answered %v where the checks said %v", res, checked)
		}
		if b, err := json.Marshal(after); err != nil || !bytes.Equal(b, start.json) {
			start.scratch = start.state.Clone()
			return fmt.Errorf("a refused command (%v) changed the state", checked)
		}
		return nil
	}
	if reflect.DeepEqual(before, after) {
		return nil // the planner over the base state is the seeds' run
	}
	// The leader's planner over what the state now holds.
	names := make([]string, 0, len(after.Models))
	for n := range after.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		m := after.Models[name]
		if m.Profile == nil {
			continue
		}
		d := decidePlan(after, m, after.Plans[name])
		if d.Keep {
			continue
		}
		// What the planner would commit, the FSM takes.
		probe := NewFSM()
		probe.state = after.Clone()
		if r := probe.Apply(&raft.Log{Index: after.Index + 1, Type: raft.LogCommand, Data: mustEncode(PlanSetType, PlanSetRequest{Plan: d.Plan, Inputs: planInputs(after, m)})}); r != nil {
			return fmt.Errorf("the FSM refused the planner's plan of %s: %v\n%s", name, r, &d.Plan)
		}
	}
	return nil
}

func mustEncode(t MessageType, req any) []byte {
	b, err := Encode(t, req)
	if err != nil {
		panic(err)
	}
	return b
}

// fuzzBudget runs fn, failing t when it errs, panics, runs past fuzzTime
// or allocates more than fuzzAlloc bytes.
func fuzzBudget(t *testing.T, fn func() error) {
	t.Helper()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("panic: %v", p)
			}
		}()
		done <- fn()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(fuzzTime):
		t.Fatalf("still running after %v", fuzzTime)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if a := after.TotalAlloc - before.TotalAlloc; a > fuzzAlloc {
		t.Fatalf("allocated %d MiB, budget %d MiB", a>>20, fuzzAlloc>>20)
	}
}
