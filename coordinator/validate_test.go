package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"shoal/placement"
)

// validProfile is a small complete profile of n layers.
func validProfile(n int) *placement.ModelProfile {
	p := &placement.ModelProfile{Name: "m", Arch: "llama", NLayer: n, NEmbd: 256, NHead: 4, NHeadKV: 4, HeadDim: 64, NVocab: 512,
		FFNDim: 768, HeadUnit: 1, FFNUnit: 32, KVBytesPerToken: 2048}
	for range n {
		p.Layers = append(p.Layers, placement.LayerProfile{AttnBytes: 512 << 10, FFNBytes: 1536 << 10, AttnFLOPs: 2 << 20, FFNFLOPs: 4 << 20})
	}
	return p
}

// bombProfile is the profile of issue #33: n_expert = 2^40.
func bombProfile() *placement.ModelProfile {
	p := validProfile(8)
	p.NExpert, p.NExpertUsed = 1<<40, 8
	for i := range p.Layers {
		p.Layers[i].ExpertBytes = 1 << 10
	}
	return p
}

// TestValidateCommands: for every command type, a valid request passes
// and each bound's violation fails, before the log (ValidateCommand) and
// where it is applied (FSM.Apply: the state unchanged), with one line
// that names the field.
func TestValidateCommands(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	node := func() RegisterNodeRequest {
		return RegisterNodeRequest{Now: t0, Node: Node{ID: "n1", Name: "n1", Role: RoleServer, Addr: "10.0.0.1:7946", RPCAddr: "10.0.0.1:7947",
			HTTPAddr: "10.0.0.1:8080", Version: "v0.1.0", Status: StatusAlive,
			Caps: Capabilities{MemTotal: 64 << 30, MemFree: 60 << 30, Cores: 16, GFLOPS: 900, MemGBps: 100, Accel: "metal"}}}
	}
	token := func() TokenCreateRequest {
		return TokenCreateRequest{Token: Token{ID: "t1", Kind: TokenInference, Models: []string{"m"}, SecretHash: "abc123", Description: "the CI", CreatedAt: t0}}
	}
	model := func() ModelUpsertRequest {
		return ModelUpsertRequest{Model: Model{Name: "m", Source: "/models/m.gguf", Digest: "d1", Layers: 8, Bytes: 1 << 30, SourceNode: "n1",
			Ctx: 4096, MaxSeqs: 4, Queue: 16, Strategy: "pipeline", Disagg: "auto", Wire: "f16", Pin: []string{"n1"}, Profile: validProfile(8),
			Replicas: 2, Status: ModelPlanned, Hub: &HubFile{Repo: "org/m-GGUF", File: "m.gguf", SHA256: "ab", Size: 1 << 30}}}
	}
	plan := func() PlanSetRequest {
		m := func(id string, embd, out bool) placement.Member {
			return placement.Member{Node: id, TPSize: 1, Embedding: embd, Output: out, MemBytes: 1 << 30, Ms: 2}
		}
		return PlanSetRequest{Inputs: "sig", Plan: placement.Plan{Version: 2, Model: "m", Strategy: "pipeline", Cost: placement.Cost{MsPerToken: 5},
			Pools: []placement.Pool{{Role: placement.RoleShared, Stages: []placement.Stage{
				{Lo: 0, Hi: 4, Members: []placement.Member{m("n1", true, false)}}, {Lo: 4, Hi: 8, Members: []placement.Member{m("n2", false, true)}}}}}}}
	}
	shard := func() ShardStatusRequest {
		return ShardStatusRequest{Shard: ShardStatus{Node: "n1", Model: "m", Lo: 0, Hi: 4, State: ShardReady, Bytes: 1 << 30, Done: 1 << 30, PlanVersion: 2, Source: "local"}}
	}
	links := func() LinkReportRequest {
		return LinkReportRequest{Links: []LinkStat{{From: "n1", To: "n2", Gbit: 10, LatencyMs: 0.2, ProbeGbit: 9, RTTMs: 0.4, Source: "probe", Iface: "eth0", Telemetry: "quic"}}}
	}
	holder := func() ModelHolderRequest {
		return ModelHolderRequest{Model: "m", Holder: ModelHolder{Node: "n2", Digest: "d1", State: HolderReady, UpdatedAt: t0}}
	}
	ca := func() HTTPSCASetRequest {
		return HTTPSCASetRequest{CA: HTTPSCA{CertPEM: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", KeyPEM: "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n"}}
	}
	type bad struct {
		field string
		req   any
	}
	with := func(base func() RegisterNodeRequest, f func(*RegisterNodeRequest)) any { r := base(); f(&r); return r }
	withTok := func(f func(*TokenCreateRequest)) any { r := token(); f(&r); return r }
	withModel := func(f func(*Model)) any { r := model(); f(&r.Model); return r }
	withPlan := func(f func(*placement.Plan)) any { r := plan(); f(&r.Plan); return r }
	withShard := func(f func(*ShardStatus)) any { r := shard(); f(&r.Shard); return r }
	withLink := func(f func(*LinkStat)) any { r := links(); f(&r.Links[0]); return r }
	withHolder := func(f func(*ModelHolderRequest)) any { r := holder(); f(&r); return r }
	pins := make([]string, MaxListLen+1)
	for i := range pins {
		pins[i] = "n" + strings.Repeat("1", i%50+1)
	}
	tooMany := make([]LinkStat, MaxListLen+1)
	for i := range tooMany {
		tooMany[i] = links().Links[0]
	}
	cases := []struct {
		typ   MessageType
		valid any
		bad   []bad
	}{
		{RegisterNodeType, node(), []bad{
			{"node.id", with(node, func(r *RegisterNodeRequest) { r.Node.ID = "" })},
			{"node.id", with(node, func(r *RegisterNodeRequest) { r.Node.ID = long(MaxIDLen + 1) })},
			{"node.id", with(node, func(r *RegisterNodeRequest) { r.Node.ID = "a/b" })},
			{"node.name", with(node, func(r *RegisterNodeRequest) { r.Node.Name = "two words" })},
			{"node.name", with(node, func(r *RegisterNodeRequest) { r.Node.Name = long(MaxNodeNameLen + 1) })},
			{"node.role", with(node, func(r *RegisterNodeRequest) { r.Node.Role = "root" })},
			{"node.addr", with(node, func(r *RegisterNodeRequest) { r.Node.Addr = long(MaxAddrLen + 1) })},
			{"node.rpc_addr", with(node, func(r *RegisterNodeRequest) { r.Node.RPCAddr = "a b" })},
			{"node.version", with(node, func(r *RegisterNodeRequest) { r.Node.Version = "v1\x1b[2J" })},
			{"node.status", with(node, func(r *RegisterNodeRequest) { r.Node.Status = "zombie" })},
			{"node.caps.mem_total", with(node, func(r *RegisterNodeRequest) { r.Node.Caps.MemTotal = 1 << 60 })},
			{"node.caps.cores", with(node, func(r *RegisterNodeRequest) { r.Node.Caps.Cores = -1 })},
			{"node.caps.gflops", with(node, func(r *RegisterNodeRequest) { r.Node.Caps.GFLOPS = -5 })},
			{"node.caps.mem_gbps", with(node, func(r *RegisterNodeRequest) { r.Node.Caps.MemGBps = 1e300 })},
			{"node.caps.accel", with(node, func(r *RegisterNodeRequest) { r.Node.Caps.Accel = "\x1b[31mred" })},
			{"node.caps.serves", with(node, func(r *RegisterNodeRequest) { r.Node.Caps.Serves = "both" })},
		}},
		{DeregisterNodeType, DeregisterNodeRequest{ID: "n1"}, []bad{{"id", DeregisterNodeRequest{}}, {"id", DeregisterNodeRequest{ID: long(MaxIDLen + 1)}}}},
		{NodeRevokeType, NodeRevokeRequest{ID: "n1", Now: t0}, []bad{{"id", NodeRevokeRequest{}}, {"id", NodeRevokeRequest{ID: long(MaxIDLen + 1)}}}},
		{NodeStatusType, NodeStatusRequest{ID: "n1", Status: StatusFailed, Now: t0}, []bad{{"id", NodeStatusRequest{Status: StatusFailed}}, {"status", NodeStatusRequest{ID: "n1", Status: "gone"}}}},
		{NodeDrainType, NodeDrainRequest{ID: "n1", Drain: true}, []bad{{"id", NodeDrainRequest{}}}},
		{TokenCreateType, token(), []bad{
			{"token.id", withTok(func(r *TokenCreateRequest) { r.Token.ID = "" })},
			{"token.id", withTok(func(r *TokenCreateRequest) { r.Token.ID = "a b" })},
			{"token.kind", withTok(func(r *TokenCreateRequest) { r.Token.Kind = "root" })},
			{"token.role", withTok(func(r *TokenCreateRequest) { r.Token.Role = "admin" })},
			{"token.secret_hash", withTok(func(r *TokenCreateRequest) { r.Token.SecretHash = long(MaxShortLen + 1) })},
			{"token.description", withTok(func(r *TokenCreateRequest) { r.Token.Description = long(MaxTextLen + 1) })},
			{"token.models", withTok(func(r *TokenCreateRequest) { r.Token.Models = make([]string, MaxListLen+1) })},
			{"token.models[0]", withTok(func(r *TokenCreateRequest) { r.Token.Models = []string{""} })},
		}},
		{TokenRevokeType, TokenRevokeRequest{ID: "t1", Now: t0}, []bad{{"id", TokenRevokeRequest{}}}},
		{TokenRotateType, TokenRotateRequest{ID: "t1", SecretHash: "def", Now: t0}, []bad{{"id", TokenRotateRequest{SecretHash: "x"}}, {"secret_hash", TokenRotateRequest{ID: "t1", SecretHash: "a b"}}}},
		{ModelUpsertType, model(), []bad{
			{"model.name", withModel(func(m *Model) { m.Name = "" })},
			{"model.name", withModel(func(m *Model) { m.Name = "a/b" })},
			{"model.name", withModel(func(m *Model) { m.Name = "-m" })},
			{"model.name", withModel(func(m *Model) { m.Name = long(MaxModelNameLen + 1) })},
			{"n_expert", withModel(func(m *Model) { m.Profile = bombProfile(); m.Layers = 8 })},
			{"n_layer", withModel(func(m *Model) { m.Profile.NLayer = 9 })},
			{"layers", withModel(func(m *Model) { m.Layers = 7 })},
			{"layers", withModel(func(m *Model) { m.Profile, m.Layers = nil, placement.MaxLayers+1 })},
			{"source", withModel(func(m *Model) { m.Source = long(MaxPathLen + 1) })},
			{"digest", withModel(func(m *Model) { m.Digest = "two words" })},
			{"bytes", withModel(func(m *Model) { m.Bytes = placement.MaxBytes + 1 })},
			{"source_node", withModel(func(m *Model) { m.SourceNode = "a;b" })},
			{"ctx", withModel(func(m *Model) { m.Ctx = -1 })},
			{"ctx", withModel(func(m *Model) { m.Ctx = placement.MaxContext + 1 })},
			{"overhead", withModel(func(m *Model) { m.Overhead = 1 << 62 })},
			{"max_seqs", withModel(func(m *Model) { m.MaxSeqs = -3 })},
			{"max_seqs", withModel(func(m *Model) { m.MaxSeqs = placement.MaxBatch + 1 })},
			{"queue", withModel(func(m *Model) { m.Queue = MaxQueue + 1 })},
			{"strategy", withModel(func(m *Model) { m.Strategy = "fastest" })},
			{"disagg", withModel(func(m *Model) { m.Disagg = "maybe" })},
			{"wire", withModel(func(m *Model) { m.Wire = "f 16" })},
			{"pin", withModel(func(m *Model) { m.Pin = pins })},
			{"pin", withModel(func(m *Model) { m.Pin = []string{"n1", "n1"} })},
			{"pin[1]", withModel(func(m *Model) { m.Pin = []string{"n1", ""} })},
			{"replicas", withModel(func(m *Model) { m.Replicas = -1 })},
			{"replicas", withModel(func(m *Model) { m.Replicas = MaxReplicas + 1 })},
			{"holders", withModel(func(m *Model) { m.Holders = map[string]*ModelHolder{"n2": {Node: "n3"}} })},
			{"status", withModel(func(m *Model) { m.Status = "serving" })},
			{"reason", withModel(func(m *Model) { m.Reason = long(MaxTextLen + 1) })},
			{"hub.size", withModel(func(m *Model) { m.Hub.Size = -1 })},
			{"hub.repo", withModel(func(m *Model) { m.Hub.Repo = long(MaxPathLen + 1) })},
		}},
		{ModelDeleteType, ModelDeleteRequest{Name: "m"}, []bad{{"name", ModelDeleteRequest{}}, {"name", ModelDeleteRequest{Name: long(MaxModelNameLen + 1)}}}},
		{ProtocolSetType, ProtocolSetRequest{Protocol: 2}, []bad{{"protocol", ProtocolSetRequest{}}, {"protocol", ProtocolSetRequest{Protocol: 256}}}},
		{ModelHolderType, holder(), []bad{
			{"model", withHolder(func(r *ModelHolderRequest) { r.Model = "" })},
			{"holder: node", withHolder(func(r *ModelHolderRequest) { r.Holder.Node = "" })},
			{"holder: state", withHolder(func(r *ModelHolderRequest) { r.Holder.State = "stolen" })},
			{"holder: error", withHolder(func(r *ModelHolderRequest) { r.Holder.Error = long(MaxTextLen + 1) })},
		}},
		{PlanSetType, plan(), []bad{
			{"plan.model", withPlan(func(p *placement.Plan) { p.Model = "" })},
			{"plan.version", withPlan(func(p *placement.Plan) { p.Version = 0 })},
			{"stages must tile", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[1].Lo = 5 })},
			{"stages must tile", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[1].Hi = placement.MaxLayers + 1 })},
			{"tp_size", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[0].Members[0].TPSize = 2 })},
			{"role", withPlan(func(p *placement.Plan) { p.Pools[0].Role = "all" })},
			{"ms", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[0].Members[0].Ms = -1 })},
			{"mem_bytes", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[0].Members[0].MemBytes = 1 << 62 })},
			{"expert", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[0].Members[0].Experts = []int{-1} })},
			{"members", withPlan(func(p *placement.Plan) { p.Pools[0].Stages[0].Members = nil })},
		}},
		{ShardStatusType, shard(), []bad{
			{"shard.node", withShard(func(s *ShardStatus) { s.Node = "" })},
			{"shard.model", withShard(func(s *ShardStatus) { s.Model = "" })},
			{"shard.state", withShard(func(s *ShardStatus) { s.State = "done" })},
			{"shard layers", withShard(func(s *ShardStatus) { s.Lo, s.Hi = 4, 2 })},
			{"shard layers", withShard(func(s *ShardStatus) { s.Hi = placement.MaxLayers + 1 })},
			{"shard.bytes", withShard(func(s *ShardStatus) { s.Bytes = 1 << 62 })},
			{"shard.error", withShard(func(s *ShardStatus) { s.Error = long(MaxTextLen + 1) })},
			{"shard.refetched", withShard(func(s *ShardStatus) { s.Refetched = -1 })},
		}},
		{LinkReportType, links(), []bad{
			{"links", LinkReportRequest{Links: tooMany}},
			{"links[0]: from", withLink(func(l *LinkStat) { l.From = "" })},
			{"links[0]: to", withLink(func(l *LinkStat) { l.To = "a b" })},
			{"the same node", withLink(func(l *LinkStat) { l.To = l.From })},
			{"links[0]: gbit", withLink(func(l *LinkStat) { l.Gbit = -1 })},
			{"links[0]: gbit", withLink(func(l *LinkStat) { l.Gbit = MaxGbit * 2 })},
			{"links[0]: latency_ms", withLink(func(l *LinkStat) { l.LatencyMs = MaxLatencyMs * 2 })},
			{"links[0]: rtt_ms", withLink(func(l *LinkStat) { l.RTTMs = -0.5 })},
			{"links[0]: iface", withLink(func(l *LinkStat) { l.Iface = "eth0\x00" })},
		}},
		{HTTPSCASetType, ca(), []bad{
			{"ca.key_pem", HTTPSCASetRequest{CA: HTTPSCA{CertPEM: "x"}}},
			{"ca.cert_pem", HTTPSCASetRequest{CA: HTTPSCA{CertPEM: long(MaxPEMLen + 1), KeyPEM: "k"}}},
		}},
	}
	if n := jsonValues([]byte(`{"a":"{[,\"{","b":[1,{"c":[]}]}`)); n != 6 {
		t.Errorf("jsonValues counted %d, want 6", n)
	}
	covered := map[MessageType]bool{}
	// The state the commands apply to: nodes n1 and n2, model m of 8
	// layers with its file hashed, token t1.
	base := func() *FSM {
		f := NewFSM()
		a := &applier{t: t, f: f}
		a.ok(RegisterNodeType, node())
		n2 := node()
		n2.Node.ID, n2.Node.Name = "n2", "n2"
		a.ok(RegisterNodeType, n2)
		a.ok(TokenCreateType, TokenCreateRequest{Token: Token{ID: "t1", Kind: TokenAdmin, SecretHash: "abc"}})
		a.ok(ModelUpsertType, model())
		return f
	}
	for _, tc := range cases {
		covered[tc.typ] = true
		name := CommandName(tc.typ)
		body, err := json.Marshal(tc.valid)
		if err != nil {
			t.Fatal(err)
		}
		if err := ValidateCommand(tc.typ, body); err != nil {
			t.Errorf("%s: the valid request: %v", name, err)
		}
		f := base()
		if r := f.Apply(&raft.Log{Index: 100, Type: raft.LogCommand, Data: append([]byte{byte(tc.typ)}, body...)}); r != nil && tc.typ != TokenCreateType {
			t.Errorf("%s: the valid request applied: %v", name, r)
		}
		extra := []bad{{"decode command", []byte(`{"x":`)}, {"limit", []byte(`"` + long(MaxCommandBytes) + `"`)},
			{"JSON values", []byte(`{"x":[` + strings.Repeat("{},", MaxCommandValues) + `{}]}`)}}
		for _, b := range append(tc.bad, extra...) {
			body, ok := b.req.([]byte)
			if !ok {
				if body, err = json.Marshal(b.req); err != nil {
					t.Fatal(err)
				}
			}
			err = ValidateCommand(tc.typ, body)
			if StatusCode(err) != http.StatusBadRequest || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), b.field) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s, %s: got %v, want a 400 naming the field on one line", name, b.field, err)
				continue
			}
			f := base()
			before := f.State()
			r := f.Apply(&raft.Log{Index: 100, Type: raft.LogCommand, Data: append([]byte{byte(tc.typ)}, body...)})
			if e, ok := r.(*Error); !ok || e.Msg != err.Error() {
				t.Errorf("%s, %s: FSM.Apply answered %v, ValidateCommand %v", name, b.field, r, err)
			}
			if after := f.State(); !reflect.DeepEqual(before, after) {
				t.Errorf("%s, %s: the refused command changed the state", name, b.field)
			}
		}
	}
	for typ := range commandTable {
		if !covered[typ] {
			t.Errorf("command %s has no case in this test", CommandName(typ))
		}
	}

	// Checked against the state where applied: a plan must tile its
	// model's layers, a shard report name a model the state holds.
	f := base()
	a := &applier{t: t, f: f, index: 100}
	short := plan()
	short.Plan.Pools[0].Stages[1].Hi = 6
	if e, ok := a.apply(PlanSetType, short).(*Error); !ok || e.Code != http.StatusBadRequest || !strings.Contains(e.Msg, "stages end at layer 6, the model has 8") {
		t.Errorf("a plan short of the model's layers: %v", e)
	}
	other := shard()
	other.Shard.Model = "gone"
	if e, ok := a.apply(ShardStatusType, other).(*Error); !ok || e.Code != http.StatusNotFound {
		t.Errorf("a shard of no model: %v", e)
	}
	a.ok(PlanSetType, plan())
}

// TestCrashProfileRefused is issue #33's crash: a client node upserts
// its model with n_expert = 2^40, which the leader's planner allocated
// for until it ran out of memory, on every leader after every restart.
// The client RPC path refuses it (400, naming the field); forced into the
// log anyway, Apply skips it on every server, the state unchanged, and the
// planner lives on, also across a restart of the cluster.
func TestCrashProfileRefused(t *testing.T) {
	c := newTestCluster(t)
	s := c.add(1)
	for _, id := range []string{"w1", "w2", "w3"} {
		c.members.set(Member{ID: id, Name: id, Role: RoleClient, Status: StatusAlive,
			Caps: Capabilities{MemTotal: 16 << 20, MemFree: 16 << 20, Cores: 2, GFLOPS: 100, MemGBps: 10}})
	}
	l := c.leader(10 * time.Second)
	waitFor(t, 10*time.Second, "the workers registered", func() bool { return len(l.srv.FSM().State().Nodes) == 4 })
	bomb := ModelUpsertRequest{Model: Model{Name: "bomb", Source: "/m.gguf", SourceNode: "w1", Digest: "d", Layers: 8, Profile: bombProfile()}}
	refused := func(what string, err error) {
		t.Helper()
		if StatusCode(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "n_expert 1099511627776 is outside [0, 4096]") {
			t.Fatalf("%s: %v, want a 400 naming n_expert", what, err)
		}
		if m := l.srv.FSM().State().Models["bomb"]; m != nil {
			t.Fatalf("%s: the model is in the state", what)
		}
	}

	// The client node's own report, as it sends it over the RPC.
	cl := NewClient(l.srv, c.members, nil, zap.NewNop())
	b, _ := json.Marshal(bomb)
	body, _ := json.Marshal(ApplyRequest{Type: ModelUpsertType, Body: b})
	_, err := cl.Handle(context.Background(), Peer{ID: "w1", Role: RoleClient}, MethodApply, body)
	refused("Handle of a client node", err)
	refused("Client.Apply", cl.Apply(context.Background(), ModelUpsertType, bomb))
	refused("Server.Apply", l.srv.Apply(ModelUpsertType, bomb, time.Second))

	// Forced into the log (a server that predates the checks took it).
	entry, _ := Encode(ModelUpsertType, bomb)
	fut := l.srv.Raft().Apply(entry, 2*time.Second)
	if err := fut.Error(); err != nil {
		t.Fatal(err)
	}
	resp, _ := fut.Response().(error)
	refused("the entry in the log", resp)
	if n := logEntries(t, l.srv, func(d []byte) bool { return bytes.Contains(d, []byte(`"name":"bomb"`)) }); n != 1 {
		t.Fatalf("%d entries of the bomb in the log, want the one forced", n)
	}
	// The planner's own entry point refuses the profile too.
	bm := bomb.Model
	if d := decidePlan(l.srv.FSM().State(), &bm, nil); !strings.Contains(d.Unservable, "n_expert") {
		t.Fatalf("decidePlan: %+v", d)
	}

	// The planner is alive: a model loaded after it is planned.
	upsertTwoNodeModel(t, l)
	planned := func(l *testServer) bool {
		st := l.srv.FSM().State()
		p := st.Plans["m"]
		return p != nil && len(p.Pools) > 0 && st.Models["m"].Status == ModelPlanned && st.Models["bomb"] == nil
	}
	waitFor(t, 10*time.Second, "the model planned after the bomb", func() bool { return planned(l) })

	// Every server restarted replays the log, the bomb included, and a
	// leader plans again.
	c.stop(s)
	c.start(s)
	l = c.leader(10 * time.Second)
	waitFor(t, 10*time.Second, "the model planned after a restart", func() bool { return planned(l) })
	m2 := *validProfile(8)
	if err := l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "m2", Digest: "d2", Profile: &m2, Ctx: 64, MaxSeqs: 1, Overhead: 1 << 20}}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the planner deciding a model after the restart", func() bool {
		m := l.srv.FSM().State().Models["m2"]
		return m != nil && (m.Status == ModelPlanned || m.Status == ModelUnservable)
	})
}

// TestRestoreDropsInvalid: a snapshot that holds what no command could
// have written (the #33 model, a plan of no model or past its model's
// layers, entries under another key, nil ones) restores without them,
// the rest intact, rather than failing to start or crashing a reader.
func TestRestoreDropsInvalid(t *testing.T) {
	f := NewFSM()
	populate(t, f)
	st := f.State()
	good := st.Clone()
	st.Models["bomb"] = &Model{Name: "bomb", Profile: bombProfile()}
	st.Plans["bomb"] = &placement.Plan{Version: 1, Model: "bomb"}
	st.Plans["ghost"] = &placement.Plan{Version: 1, Model: "ghost"}
	st.Models["short"] = &Model{Name: "short", Layers: 8}
	st.Plans["short"] = &placement.Plan{Version: 1, Model: "short", Pools: []placement.Pool{{Role: "shared", Stages: []placement.Stage{
		{Lo: 0, Hi: 16, Members: []placement.Member{{Node: "mac-1-id", TPSize: 1}}}}}}}
	st.Nodes["alias"] = &Node{ID: "mac-1-id", Name: "mac-1", Role: RoleServer, Status: StatusAlive}
	st.Nodes["nil"] = nil
	st.Tokens["bad"] = &Token{ID: "bad", Kind: "root"}
	st.Links = map[string]*LinkStat{"a>b": {From: "a", To: "b", Gbit: -1}, "x>y": {From: "x", To: "z"}}
	st.Shards["x/y"] = nil
	var buf bytes.Buffer
	buf.WriteByte(snapshotVersion)
	if err := json.NewEncoder(&buf).Encode(st); err != nil {
		t.Fatal(err)
	}
	g := NewFSM()
	if err := g.Restore(io.NopCloser(&buf)); err != nil {
		t.Fatal(err)
	}
	got := g.State()
	if len(got.Links) == 0 {
		got.Links = nil // both dropped
	}
	good.Models["short"] = &Model{Name: "short", Layers: 8} // valid; its plan is not
	if !reflect.DeepEqual(got, good) {
		b1, _ := json.MarshalIndent(good, "", " ")
		b2, _ := json.MarshalIndent(got, "", " ")
		t.Fatalf("restored:\n%s\nwant:\n%s", b2, b1)
	}
}
