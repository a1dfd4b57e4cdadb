package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"shoal/placement"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type applier struct {
	t     *testing.T
	f     *FSM
	index uint64
}

func (a *applier) apply(typ MessageType, req any) any {
	a.t.Helper()
	b, err := Encode(typ, req)
	if err != nil {
		a.t.Fatal(err)
	}
	a.index++
	return a.f.Apply(&raft.Log{Index: a.index, Type: raft.LogCommand, Data: b})
}

func (a *applier) ok(typ MessageType, req any) {
	a.t.Helper()
	if r := a.apply(typ, req); r != nil {
		a.t.Fatalf("command %d: %v", typ, r)
	}
}

// populate applies one of every command.
func populate(t *testing.T, f *FSM) *applier {
	a := &applier{t: t, f: f}
	for i, name := range []string{"mac-1", "mac-2", "linux"} {
		a.ok(RegisterNodeType, RegisterNodeRequest{Now: t0, Node: Node{
			ID: name + "-id", Name: name, Role: RoleServer, Addr: "10.0.0.1:7946", RPCAddr: "10.0.0.1:7947",
			Status: StatusAlive, Caps: Capabilities{MemTotal: uint64(i+1) << 34, Cores: 8, GFLOPS: 100.5, MemGBps: 50},
		}})
	}
	a.ok(NodeDrainType, NodeDrainRequest{ID: "mac-2-id", Drain: true})
	a.ok(NodeStatusType, NodeStatusRequest{ID: "linux-id", Status: StatusFailed, Now: t0.Add(time.Minute)})
	exp := t0.Add(24 * time.Hour)
	a.ok(TokenCreateType, TokenCreateRequest{Token: Token{ID: "abc123", Kind: TokenJoin, SecretHash: "h1", CreatedAt: t0, ExpiresAt: &exp}})
	a.ok(TokenCreateType, TokenCreateRequest{Token: Token{ID: "def456", Kind: TokenAdmin, SecretHash: "h2", CreatedAt: t0}})
	a.ok(TokenRevokeType, TokenRevokeRequest{ID: "abc123", Now: t0.Add(time.Hour)})
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "llama", Source: "llama.gguf", Layers: 32, CreatedAt: t0, Digest: "d1", SourceNode: "mac-1-id"}})
	a.ok(ModelHolderType|IgnoreUnknownTypeFlag, ModelHolderRequest{Model: "llama", Holder: ModelHolder{Node: "mac-2-id", Digest: "d1", State: HolderReady, UpdatedAt: t0}})
	a.ok(PlanSetType, PlanSetRequest{Plan: placement.Plan{Version: 1, Model: "llama", Cost: placement.Cost{MsPerToken: 12.5}, Pools: []placement.Pool{{
		Role: "shared", Stages: []placement.Stage{{Lo: 0, Hi: 16, Members: []placement.Member{{Node: "mac-1-id", TPSize: 1, Embedding: true}}},
			{Lo: 16, Hi: 32, Members: []placement.Member{{Node: "linux-id", TPSize: 1, Output: true}}}},
	}}}})
	a.ok(ShardStatusType, ShardStatusRequest{Shard: ShardStatus{Node: "mac-1-id", Model: "llama", Lo: 0, Hi: 16, State: "ready", Bytes: 1 << 30, UpdatedAt: t0}})
	return a
}

func TestFSMCommands(t *testing.T) {
	f := NewFSM()
	a := populate(t, f)
	s := f.State()
	if len(s.Nodes) != 3 || !s.Nodes["mac-2-id"].Draining || s.Nodes["mac-2-id"].Schedulable() {
		t.Fatalf("drain: %+v", s.Nodes["mac-2-id"])
	}
	if !s.Nodes["mac-1-id"].Schedulable() || s.Nodes["linux-id"].Schedulable() {
		t.Fatal("schedulable flags wrong")
	}
	if !s.Tokens["abc123"].Revoked || s.Tokens["abc123"].Valid(t0) || !s.Tokens["def456"].Valid(t0) {
		t.Fatal("token revocation")
	}
	if s.Index != a.index {
		t.Fatalf("index %d, want %d", s.Index, a.index)
	}
	// Re-registering keeps the drain flag and registration time.
	a.ok(RegisterNodeType, RegisterNodeRequest{Now: t0.Add(time.Hour), Node: Node{ID: "mac-2-id", Name: "mac-2", Status: StatusAlive}})
	n := f.State().Nodes["mac-2-id"]
	if !n.Draining || !n.RegisteredAt.Equal(t0) {
		t.Fatalf("re-register lost fields: %+v", n)
	}
	// Errors come back as responses with codes.
	for _, tc := range []struct {
		typ  MessageType
		req  any
		code int
		msg  string
	}{
		{NodeDrainType, NodeDrainRequest{ID: "nope"}, 404, `node "nope" not found`},
		{TokenRevokeType, TokenRevokeRequest{ID: "nope"}, 404, `token "nope" not found`},
		{TokenCreateType, TokenCreateRequest{Token: Token{ID: "def456", Kind: TokenAdmin, SecretHash: "h3"}}, 409, `token "def456" exists`},
		{PlanSetType, PlanSetRequest{Plan: placement.Plan{Version: 1, Model: "llama"}}, 409, "not newer"},
		{PlanSetType, PlanSetRequest{Plan: placement.Plan{Version: 1, Model: "missing"}}, 404, "not found"},
	} {
		r := a.apply(tc.typ, tc.req)
		e, ok := r.(*Error)
		if !ok || e.Code != tc.code || !strings.Contains(e.Msg, tc.msg) {
			t.Errorf("command %d: got %v, want %d %q", tc.typ, r, tc.code, tc.msg)
		}
	}
	// Deleting a model drops its plan and shards; deregistering a node its shards.
	a.ok(ModelDeleteType, ModelDeleteRequest{Name: "llama"})
	s = f.State()
	if len(s.Plans) != 0 || len(s.Shards) != 0 {
		t.Fatalf("model delete left %d plans %d shards", len(s.Plans), len(s.Shards))
	}
	a.ok(DeregisterNodeType, DeregisterNodeRequest{ID: "linux-id"})
	if _, ok := f.State().Nodes["linux-id"]; ok {
		t.Fatal("deregistered node still present")
	}
}

// TestFSMModelHolders: a node's copy of a model file is recorded for the
// model's current file only, survives the model's other upserts while the
// file stays the same, and goes with the file, the node or the model.
func TestFSMModelHolders(t *testing.T) {
	f := NewFSM()
	a := &applier{t: t, f: f}
	a.ok(RegisterNodeType, RegisterNodeRequest{Now: t0, Node: Node{ID: "b", Name: "b", Status: StatusAlive}})
	m := Model{Name: "m", SourceNode: "a", Source: "/m.gguf", Status: ModelHashing}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: m})
	holder := func(node, digest, state string) ModelHolderRequest {
		return ModelHolderRequest{Model: "m", Holder: ModelHolder{Node: node, Digest: digest, State: state, UpdatedAt: t0}}
	}
	holders := func() map[string]*ModelHolder { return f.State().Models["m"].Holders }
	for _, tc := range []struct {
		name string
		req  ModelHolderRequest
		code int
	}{
		{"before the file is hashed", holder("b", "d1", HolderReady), 409},
		{"no model", ModelHolderRequest{Model: "nope", Holder: ModelHolder{Node: "b", State: HolderReady}}, 404},
	} {
		if e, ok := a.apply(ModelHolderType, tc.req).(*Error); !ok || e.Code != tc.code {
			t.Errorf("%s: got %v, want %d", tc.name, e, tc.code)
		}
	}
	m.Digest, m.Status = "d1", ""
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: m})
	a.ok(ModelHolderType, holder("b", "d1", HolderReady))
	a.ok(ModelHolderType, holder("c", "d1", HolderNoRoom))
	for _, tc := range []struct {
		name string
		req  ModelHolderRequest
		code int
	}{
		{"another file", holder("b", "d0", HolderReady), 409},
		{"the source", holder("a", "d1", HolderReady), 400},
		{"no node", holder("", "d1", HolderReady), 400},
	} {
		if e, ok := a.apply(ModelHolderType, tc.req).(*Error); !ok || e.Code != tc.code {
			t.Errorf("%s: got %v, want %d", tc.name, e, tc.code)
		}
	}
	if h := holders(); len(h) != 2 || h["b"].State != HolderReady || h["c"].State != HolderNoRoom {
		t.Fatalf("holders %+v", h)
	}
	// The planner's status upserts (and anything else) keep them; holders
	// in an upsert are ignored.
	m.Status = ModelPlanned
	m.Holders = map[string]*ModelHolder{"x": {Node: "x", Digest: "d1", State: HolderReady}}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: m})
	if h := holders(); len(h) != 2 || h["x"] != nil {
		t.Fatalf("after an upsert: %+v", h)
	}
	m.Holders = nil
	// Forgotten on request, with the node, and when the file changes.
	a.ok(ModelHolderType, holder("c", "d1", ""))
	if h := holders(); len(h) != 1 || h["b"] == nil {
		t.Fatalf("after forgetting c: %+v", h)
	}
	a.ok(DeregisterNodeType, DeregisterNodeRequest{ID: "b"})
	if h := holders(); len(h) != 0 {
		t.Fatalf("after b left: %+v", h)
	}
	a.ok(ModelHolderType, holder("c", "d1", HolderReady))
	m.Digest, m.Status = "", ModelHashing // loaded again: hashing keeps them
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: m})
	if len(holders()) != 1 {
		t.Fatalf("hashing dropped the holders: %+v", holders())
	}
	m.Digest, m.Status = "d2", ""
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: m})
	if len(holders()) != 0 {
		t.Fatalf("a new file kept the old copies: %+v", holders())
	}

	for _, tc := range []struct {
		m    Model
		want int
	}{{Model{}, DefaultReplicas}, {Model{Replicas: 1}, 1}, {Model{Replicas: 3}, 3}, {Model{Replicas: 3, Pin: []string{"a"}}, 1}} {
		if got := tc.m.WantReplicas(); got != tc.want {
			t.Errorf("%+v: want %d replicas, got %d", tc.m, tc.want, got)
		}
	}
}

// TestUnknownCommandSkipped: a command of a type this server does not
// know, with IgnoreUnknownTypeFlag or without, is skipped with an error
// response and an error log, never a panic (issue #33: type 99 relayed
// with an admin key stopped every server on every restart); the state is
// unchanged and later commands apply.
func TestUnknownCommandSkipped(t *testing.T) {
	f := NewFSM()
	a := &applier{t: t, f: f}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m"}})
	before := f.State()
	for _, typ := range []MessageType{99, IgnoreUnknownTypeFlag | 99, 100, IgnoreUnknownTypeFlag | 100, 127, 255} {
		a.index++
		r := f.Apply(&raft.Log{Index: a.index, Type: raft.LogCommand, Data: []byte{byte(typ), '{', '}'}})
		e, ok := r.(*Error)
		if !ok || e.Code != http.StatusBadRequest || !strings.Contains(e.Msg, fmt.Sprintf("unknown command type %d", typ&^IgnoreUnknownTypeFlag)) {
			t.Fatalf("type %d: response %v", typ, r)
		}
		if after := f.State(); !reflect.DeepEqual(before, after) {
			t.Fatalf("type %d changed the state", typ)
		}
	}
	// A known type with the flag still applies, and so do later commands.
	a.ok(IgnoreUnknownTypeFlag|ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "flagged"}})
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "later"}})
	if st := f.State(); st.Models["flagged"] == nil || st.Models["later"] == nil || st.Index != a.index {
		t.Fatalf("later commands: %+v at index %d", st.Models, st.Index)
	}
	if err := ValidateCommand(99, []byte("{}")); StatusCode(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "unknown command type 99") {
		t.Fatalf("ValidateCommand: %v", err)
	}

	// Refused before it is written: by Server.Apply, and by Handle for a
	// client node relaying an admin key or a server forwarding it.
	c := newTestCluster(t)
	c.add(1)
	l := c.leader(10 * time.Second)
	cl := NewClient(l.srv, c.members, nil, zap.NewNop())
	cl.CheckAdmin = func(key string) error {
		if key != "admin-key" {
			return errors.New("not an admin key")
		}
		return nil
	}
	for _, typ := range []MessageType{99, IgnoreUnknownTypeFlag | 99} {
		if err := l.srv.Apply(typ, struct{}{}, time.Second); StatusCode(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "unknown command type 99") {
			t.Errorf("Server.Apply of type %d: %v", typ, err)
		}
		for _, peer := range []Peer{{ID: "w1", Role: RoleClient}, {ID: "node-1", Role: RoleServer}} {
			body, _ := json.Marshal(ApplyRequest{Type: typ, Body: json.RawMessage(`{}`), Key: "admin-key"})
			if _, err := cl.Handle(context.Background(), peer, MethodApply, body); StatusCode(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "unknown command type 99") {
				t.Errorf("Handle of type %d from a %s: %v", typ, peer.Role, err)
			}
		}
	}
	if n := logEntries(t, l.srv, func(d []byte) bool { return d[0]&^byte(IgnoreUnknownTypeFlag) == 99 }); n != 0 {
		t.Errorf("%d entries of type 99 in the log", n)
	}
	if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "after"}}, time.Second); err != nil {
		t.Fatal(err)
	}
}

// logEntries counts the commands of s's Raft log that match.
func logEntries(t *testing.T, s *Server, match func(data []byte) bool) int {
	t.Helper()
	first, err := s.store.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := max(first, 1); i <= last; i++ {
		var e raft.Log
		if err := s.store.GetLog(i, &e); err != nil {
			continue // compacted away
		}
		if e.Type == raft.LogCommand && len(e.Data) > 0 && match(e.Data) {
			n++
		}
	}
	return n
}

// TestApplyRecoversPanic: a handler that panics is recovered as the last
// line of defense: an error response naming the index, the next command
// applies.
func TestApplyRecoversPanic(t *testing.T) {
	old := commandTable[NodeDrainType]
	commandTable[NodeDrainType] = command{check: old.check, apply: func(*State, uint64, any) any { panic("boom") }}
	defer func() { commandTable[NodeDrainType] = old }()
	f := NewFSM()
	a := &applier{t: t, f: f}
	r := a.apply(NodeDrainType, NodeDrainRequest{ID: "x"})
	if e, ok := r.(*Error); !ok || e.Code != http.StatusInternalServerError || !strings.Contains(e.Msg, "at index 1 panicked: boom") {
		t.Fatalf("response %v", r)
	}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m"}})
}

type memSink struct {
	bytes.Buffer
	cancelled bool
}

func (m *memSink) ID() string    { return "mem" }
func (m *memSink) Cancel() error { m.cancelled = true; return nil }
func (m *memSink) Close() error  { return nil }

func TestFSMSnapshotRestore(t *testing.T) {
	f := NewFSM()
	populate(t, f)
	before := f.State()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Changes after the snapshot must not leak into it.
	a := &applier{t: t, f: f, index: 100}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "later"}})
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()

	g := NewFSM()
	a2 := &applier{t: t, f: g}
	a2.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "stale"}}) // replaced by Restore
	changed := g.Changed()
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("restore did not signal a change")
	}
	after := g.State()
	if !reflect.DeepEqual(before, after) {
		b1, _ := json.MarshalIndent(before, "", " ")
		b2, _ := json.MarshalIndent(after, "", " ")
		t.Fatalf("restored state differs:\n%s\nvs\n%s", b1, b2)
	}
	if _, ok := after.Models["later"]; ok {
		t.Fatal("snapshot saw a later command")
	}
	// A future snapshot version is refused with a clear error.
	bad := append([]byte{9}, sink.Bytes()[1:]...)
	if err := g.Restore(io.NopCloser(bytes.NewReader(bad))); err == nil || !strings.Contains(err.Error(), "snapshot version 9") {
		t.Fatalf("bad version: %v", err)
	}
}

// TestFSMModelStatusOnly: the planner's status-only upsert sets the status
// and reason of the registration it planned, while that status is the one
// it read; the rest of the model stays as the state has it, and a model
// loaded again since (another CreatedAt), or whose status changed, or
// that is gone, is left alone.
func TestFSMModelStatusOnly(t *testing.T) {
	f := NewFSM()
	a := &applier{t: t, f: f}
	m := Model{Name: "m", SourceNode: "a", Source: "/m.gguf", Digest: "d1", Pin: []string{"a", "b"}, CreatedAt: t0}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: m})
	planned := m
	planned.Status = ModelPlanned
	mine := m
	mine.Pin = []string{"a"}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: mine}) // the same registration, its pin changed
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: planned, StatusOnly: true, FromStatus: ""})
	if got := f.State().Models["m"]; got.Status != ModelPlanned || !slices.Equal(got.Pin, []string{"a"}) {
		t.Fatalf("status-only upsert: status %q, pin %v", got.Status, got.Pin)
	}
	again := m
	again.CreatedAt = t0.Add(time.Second) // unloaded and loaded again
	a.ok(ModelDeleteType, ModelDeleteRequest{Name: "m"})
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: again})
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: planned, StatusOnly: true, FromStatus: ""})
	if got := f.State().Models["m"]; got.Status != "" {
		t.Fatalf("the status planned for the earlier registration landed on the new one: %q", got.Status)
	}
	planned.CreatedAt = again.CreatedAt
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: planned, StatusOnly: true, FromStatus: ModelUnservable})
	if got := f.State().Models["m"]; got.Status != "" {
		t.Fatalf("a status written from another than the state's: %q", got.Status)
	}
	a.ok(ModelDeleteType, ModelDeleteRequest{Name: "m"})
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: planned, StatusOnly: true, FromStatus: ""})
	if got := f.State().Models["m"]; got != nil {
		t.Fatalf("a status-only upsert made a model: %+v", got)
	}
}

// TestShardReportsOutOfOrder: a node's shard reports leave it from more
// than one goroutine and may be applied out of order; the older one that
// comes last does not replace the newer (TestDiskFullMoves once read a
// stale "fetching" report in place of the "no room" failure after it).
func TestShardReportsOutOfOrder(t *testing.T) {
	f := NewFSM()
	a := populate(t, f)
	report := func(state string, noRoom bool, at time.Time) {
		a.ok(ShardStatusType, ShardStatusRequest{Shard: ShardStatus{Node: "mac-2-id", Model: "llama", Lo: 16, Hi: 32, State: state, NoRoom: noRoom, UpdatedAt: at}})
	}
	report("failed", true, t0.Add(2*time.Second))
	report("fetching", false, t0.Add(time.Second)) // sent first, applied last
	sh := f.State().Shards[ShardKey("mac-2-id", "llama")]
	if sh == nil || sh.State != "failed" || !sh.NoRoom {
		t.Fatalf("after an older report applied last: %+v", sh)
	}
	report("fetching", true, t0.Add(3*time.Second)) // the retry
	if sh := f.State().Shards[ShardKey("mac-2-id", "llama")]; sh.State != "fetching" {
		t.Fatalf("a newer report did not replace the held one: %+v", sh)
	}
}

// TestDraftShardReports: the driver's report of a model's draft shard
// (DraftShardModel) is kept while the model has a draft and goes with
// the model; a draft report of a model without one is refused.
func TestDraftShardReports(t *testing.T) {
	f := NewFSM()
	a := populate(t, f)
	draftReport := ShardStatusRequest{Shard: ShardStatus{Node: "mac-1-id", Model: DraftShardModel("llama"), Lo: 0, Hi: 2, State: "ready", Bytes: 1 << 20, UpdatedAt: t0}}
	if r := a.apply(ShardStatusType, draftReport); r == nil {
		t.Fatal("a draft shard of a model without a draft was kept")
	}
	a.ok(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "llama", Source: "llama.gguf", Layers: 32, CreatedAt: t0, Digest: "d1", SourceNode: "mac-1-id",
		Draft: &DraftFile{Source: "small.gguf", Digest: "d2", Manifest: "m2", Bytes: 1 << 20, Layers: 2, KVBytesPerToken: 1024}}})
	if r := a.apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "bad", Source: "x.gguf", Layers: 2, CreatedAt: t0, Draft: &DraftFile{Layers: 2}}}); r == nil {
		t.Error("a draft without a source was kept")
	}
	a.ok(ShardStatusType, draftReport)
	if sh := f.State().Shards[ShardKey("mac-1-id", DraftShardModel("llama"))]; sh == nil || sh.State != "ready" {
		t.Fatalf("the draft's shard report: %+v", sh)
	}
	if o := modelOptions(f.State().Models["llama"]); o.DriverBytes != 1<<20 || o.DriverKVBytesPerToken != 1024 {
		t.Errorf("the planner holds %d bytes and %d a position on the driver, want the draft's 1 MiB and 1024", o.DriverBytes, o.DriverKVBytesPerToken)
	}
	a.ok(ModelDeleteType, ModelDeleteRequest{Name: "llama"})
	if len(f.State().Shards) != 0 {
		t.Errorf("shards left after the model went: %v", f.State().Shards)
	}
}
