package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/internal/nodeaddr"
)

// memCaller routes calls in memory to the Client of the server at addr,
// through JSON as the RPC would, and records leave requests.
type memCaller struct {
	mu      sync.Mutex
	clients map[string]*Client
	left    []string
}

func (m *memCaller) Call(ctx context.Context, addr, method string, in, out any) error {
	_, addr = nodeaddr.Split(addr)
	m.mu.Lock()
	c := m.clients[addr]
	if method == MethodLeave {
		m.left = append(m.left, addr)
	}
	m.mu.Unlock()
	if method == MethodLeave {
		return nil
	}
	if c == nil {
		return errors.New("nobody at " + addr)
	}
	body, _ := json.Marshal(in)
	res, err := c.Handle(ctx, Peer{Role: RoleServer}, method, body)
	if err != nil || out == nil {
		return err
	}
	b, _ := json.Marshal(res)
	return json.Unmarshal(b, out)
}

// TestClientThroughLeader: writes from a follower and from a client agent
// reach the leader, reads see them, a second hop is refused, and a node
// removed through a follower is asked to leave.
func TestClientThroughLeader(t *testing.T) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		c.add(3)
	}
	leader := c.leader(10 * time.Second)
	// Every server knows the leader and the leader has registered every
	// node (with its address) in the state.
	waitFor(t, 10*time.Second, "a settled cluster", func() bool {
		for _, s := range c.servers {
			if _, addr := s.srv.Leader(); addr == "" {
				return false
			}
		}
		n := 0
		leader.srv.FSM().View(func(st *State) { n = len(st.Nodes) })
		return n == len(c.servers)
	})
	calls := &memCaller{clients: map[string]*Client{}}
	var follower *Client
	for _, s := range c.servers {
		cl := NewClient(s.srv, c.members, calls, zap.NewNop())
		calls.clients[s.addr] = cl
		if s != leader {
			follower = cl
		}
	}
	agent := NewClient(nil, c.members, calls, zap.NewNop()) // a client agent: no server of its own
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, cl := range []*Client{follower, agent} {
		id := "t-follower"
		if cl == agent {
			id = "t-agent"
		}
		if err := cl.Apply(ctx, TokenCreateType, TokenCreateRequest{Token: Token{ID: id, Kind: TokenJoin}}); err != nil {
			t.Fatalf("apply through %s: %v", id, err)
		}
		// A client agent reads from any server, which may apply the write
		// a moment after the leader.
		waitFor(t, 5*time.Second, "the token read through "+id, func() bool {
			st, err := cl.State(ctx)
			return err == nil && st.Tokens[id] != nil
		})
	}

	// A follower refuses to pass on what another server forwarded to it.
	// Asked of a server that does not lead when asked; one that took
	// over meanwhile (a loaded host ends terms) applies it, and the next
	// follower is asked.
	b, _ := json.Marshal(ApplyRequest{Type: TokenRevokeType, Body: json.RawMessage(`{"id":"t-agent"}`), Forwarded: true})
	for try := 0; ; try++ {
		var s *testServer
		for _, x := range c.servers {
			if !x.srv.IsLeader() {
				s = x
				break
			}
		}
		_, err := calls.clients[s.addr].Handle(ctx, Peer{Role: RoleServer}, MethodApply, b)
		if errors.Is(err, ErrNotLeader) {
			break
		}
		if !s.srv.IsLeader() || try == 10 {
			t.Fatalf("second hop: %v, want ErrNotLeader", err)
		}
	}
	if _, err := agent.Handle(ctx, Peer{Role: RoleServer}, MethodState, nil); StatusCode(err) != http.StatusBadRequest {
		t.Fatalf("a client agent answered a server method: %v", err)
	}

	var victim *testServer
	for _, s := range c.servers {
		if s != leader && calls.clients[s.addr] != follower {
			victim = s
		}
	}
	// The victim may have taken the leadership meanwhile: a leader is
	// not removed (409), so it hands it on first.
	if err := c.onLeader(func(l *testServer) error {
		if l == victim {
			if err := l.srv.TransferLeadership(leader.id); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := follower.RemoveNode(ctx, victim.id); err != nil {
		t.Fatal(err)
	}
	calls.mu.Lock()
	left := calls.left
	calls.mu.Unlock()
	if len(left) != 1 || left[0] != victim.addr {
		t.Fatalf("leave requests %v, want one to %s", left, victim.addr)
	}

	// A removal is finished by a second try whatever cut the first short
	// (under load the leader may lose its term between the steps, and the
	// client tries again on the next): removed and revoked, it is done; a
	// node still in the state though revoked is deleted; a node the
	// cluster never had is not found.
	if err := follower.RemoveNode(ctx, victim.id); err != nil {
		t.Fatalf("removing %s again: %v", victim.id, err)
	}
	l := c.leader(5 * time.Second).srv
	if err := l.Apply(RegisterNodeType, RegisterNodeRequest{Now: time.Now(), Node: Node{ID: "w", Name: "w", Role: RoleClient, Status: StatusAlive}}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(NodeRevokeType, NodeRevokeRequest{ID: "w", Now: time.Now()}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := follower.RemoveNode(ctx, "w"); err != nil {
		t.Fatalf("finishing the removal of a revoked node: %v", err)
	}
	var gone, revoked bool
	c.leader(5 * time.Second).srv.FSM().View(func(st *State) {
		_, in := st.Nodes["w"]
		_, revoked = st.RevokedNodes["w"]
		gone = !in
	})
	if !gone || !revoked {
		t.Fatalf("after the second try: deleted %v, revoked %v", gone, revoked)
	}
	if err := follower.RemoveNode(ctx, "nobody"); StatusCode(err) != http.StatusNotFound {
		t.Fatalf("removing a node the cluster never had: %v", err)
	}
}

// TestClientNodeWrites: a server answers a client node's state read
// without token hashes, applies the reports the node makes about itself,
// and refuses any other write or a node removal unless the node relays an
// admin key.
func TestClientNodeWrites(t *testing.T) {
	c := newTestCluster(t)
	c.add(1)
	leader := c.leader(10 * time.Second)
	cl := NewClient(leader.srv, c.members, &memCaller{clients: map[string]*Client{}}, zap.NewNop())
	cl.CheckAdmin = func(key string) error {
		if key != "admin-key" {
			return errors.New("not an admin key")
		}
		return nil
	}
	ctx := context.Background()
	if err := cl.Apply(ctx, TokenCreateType, TokenCreateRequest{Token: Token{ID: "t1", Kind: TokenAdmin, SecretHash: "hash"}}); err != nil {
		t.Fatal(err)
	}
	node := Peer{ID: "client-node", Role: RoleClient}
	apply := func(key string, t MessageType, req any) error {
		b, _ := json.Marshal(req)
		body, _ := json.Marshal(ApplyRequest{Type: t, Body: b, Key: key})
		_, err := cl.Handle(ctx, node, MethodApply, body)
		return err
	}
	st, err := cl.Handle(ctx, node, MethodState, nil)
	if err != nil || st.(*State).Tokens["t1"] == nil || st.(*State).Tokens["t1"].SecretHash != "" {
		t.Errorf("client read: %v, token %+v", err, st.(*State).Tokens["t1"])
	}
	if leader.srv.FSM().State().Tokens["t1"].SecretHash != "hash" {
		t.Error("redacting changed the state")
	}
	own := ShardStatusRequest{Shard: ShardStatus{Node: "client-node", Model: "m", State: ShardReady}}
	other := ShardStatusRequest{Shard: ShardStatus{Node: "someone-else", Model: "m", State: ShardReady}}
	token := TokenCreateRequest{Token: Token{ID: "t2", Kind: TokenAdmin, SecretHash: "h2"}}
	// A model another node offers, which a client must not take over.
	if err := cl.Apply(ctx, ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "theirs", SourceNode: "someone-else", Source: "/m.gguf", Digest: "d"}}); err != nil {
		t.Fatal(err)
	}
	model := func(name, source string, pin ...string) ModelUpsertRequest {
		return ModelUpsertRequest{Model: Model{Name: name, SourceNode: source, Source: "/x.gguf", Pin: pin}}
	}
	copyOf := func(node string) ModelHolderRequest {
		return ModelHolderRequest{Model: "theirs", Holder: ModelHolder{Node: node, Digest: "d", State: HolderReady}}
	}
	for _, x := range []struct {
		name   string
		key    string
		typ    MessageType
		req    any
		refuse bool
	}{
		{"own shard report", "", ShardStatusType, own, false},
		{"own links", "", LinkReportType | IgnoreUnknownTypeFlag, LinkReportRequest{Links: []LinkStat{{From: "client-node", To: "x"}}}, false},
		{"another node's shard report", "", ShardStatusType, other, true},
		{"another node's links", "", LinkReportType, LinkReportRequest{Links: []LinkStat{{From: "x", To: "client-node"}}}, true},
		{"a token", "", TokenCreateType, token, true},
		{"a token with a wrong key", "guess", TokenCreateType, token, true},
		{"a token with an admin key", "admin-key", TokenCreateType, token, false},
		{"a model file it holds", "", ModelUpsertType, model("mine", "client-node"), false},
		{"its model pinned to itself", "", ModelUpsertType, model("mine", "client-node", "client-node"), false},
		{"its model pinned to another node", "", ModelUpsertType, model("mine", "client-node", "someone-else"), true},
		{"a model of another node's", "", ModelUpsertType, model("other", "someone-else"), true},
		{"another node's model name", "", ModelUpsertType, model("theirs", "client-node"), true},
		{"its copy of a model file", "", ModelHolderType | IgnoreUnknownTypeFlag, copyOf("client-node"), false},
		{"another node's copy", "", ModelHolderType | IgnoreUnknownTypeFlag, copyOf("x"), true},
	} {
		err := apply(x.key, x.typ, x.req)
		if refused := StatusCode(err) == http.StatusForbidden; refused != x.refuse {
			t.Errorf("%s: %v", x.name, err)
		}
	}
	if h := leader.srv.FSM().State().Models["theirs"].Holders; len(h) != 1 || h["client-node"] == nil {
		t.Errorf("holders of theirs: %+v", h)
	}
	body, _ := json.Marshal(NodeRequest{ID: leader.id})
	if _, err := cl.Handle(ctx, node, MethodRemoveNode, body); StatusCode(err) != http.StatusForbidden {
		t.Errorf("node removal without a key: %v", err)
	}
	if _, err := cl.Handle(ctx, node, MethodTransferLeader, body); StatusCode(err) != http.StatusForbidden {
		t.Errorf("leadership transfer without a key: %v", err)
	}
}

// TestReadWhileCatchingUp: a server restarted without a leader to talk
// to holds only its last snapshot (here none: an empty state). A read on
// it waits for a leader and then fails with ErrCatchingUp instead of
// listing an empty cluster; once the others are back the read answers
// with the whole state. With a slow FSM, Raft's applied index passes the
// model's entry before the FSM has run it (a loaded host read an empty
// state just after CaughtUp, once in about 60 runs): caught up means the
// FSM has it too.
func TestReadWhileCatchingUp(t *testing.T) {
	for _, slow := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("fsm-%v", slow), func(t *testing.T) { readWhileCatchingUp(t, slow) })
	}
}

func readWhileCatchingUp(t *testing.T, slow time.Duration) {
	c := newTestCluster(t)
	for i := 0; i < 3; i++ {
		s := &testServer{id: fmt.Sprintf("node-%d", i), addr: "127.0.0.1:0", expect: 3, snaps: 1 << 20}
		s.dir = filepath.Join(c.base, s.id)
		c.addServer(s)
		c.start(s)
	}
	if err := c.onLeader(func(l *testServer) error {
		return l.srv.Apply(ModelUpsertType, ModelUpsertRequest{Model: Model{Name: "kept"}}, 5*time.Second)
	}); err != nil {
		t.Fatal(err)
	}
	first := c.servers[0]
	waitFor(t, 10*time.Second, "the model on every server", func() bool {
		for _, s := range c.servers {
			if s.srv.FSM().State().Models["kept"] == nil {
				return false
			}
		}
		return true
	})
	for _, s := range c.servers {
		c.stop(s)
	}
	first.slow = slow
	c.start(first)
	if first.srv.CaughtUp() {
		t.Fatal("a server restarted without a leader says it caught up")
	}
	cl := NewClient(first.srv, c.members, &memCaller{clients: map[string]*Client{}}, zap.NewNop())
	cl.LeaderWait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if st, err := cl.State(ctx); !errors.Is(err, ErrCatchingUp) {
		n := -1
		if st != nil {
			n = len(st.Models)
		}
		t.Fatalf("read before catching up: %d models, %v; want ErrCatchingUp", n, err)
	}
	for _, s := range c.servers[1:] {
		c.start(s)
	}
	waitFor(t, 15*time.Second, "the restarted server caught up", first.srv.CaughtUp)
	// Without a leader reachable through this caller, the read answers
	// from the server's own copy, now whole.
	st, err := cl.State(ctx)
	if err != nil || st.Models["kept"] == nil {
		t.Fatalf("read after catching up: %v, %v", st, err)
	}
}

// TestDeleteAfterLostLeadership: an unload whose first try reached a
// leader that lost its term while the delete was committing (it may have
// been applied) is sent again; the next leader finds no such model, and
// that means done (TestArchPlans under -race on a loaded host answered an
// unload of a loaded model with "not loaded"). A model that was never
// there is still not found.
func TestDeleteAfterLostLeadership(t *testing.T) {
	// As they cross the RPC from the server.
	lost := remoteErr{http.StatusServiceUnavailable, errLeadershipLost.Error()}
	missing := remoteErr{http.StatusNotFound, `model "m" not found`}
	for _, c := range []struct {
		name  string
		errs  []error
		calls int
		ok    bool
	}{
		{"the first try may have applied it", []error{lost, missing}, 2, true},
		{"never there", []error{missing}, 1, false},
		{"a lost try, then another error", []error{lost, errors.New("disk full")}, 2, false},
	} {
		sc := &scriptedCaller{errs: c.errs}
		cl := NewClient(nil, oneServer{}, sc, zap.NewNop())
		err := cl.Apply(context.Background(), ModelDeleteType, ModelDeleteRequest{Name: "m"})
		if (err == nil) != c.ok || int(sc.calls.Load()) != c.calls {
			t.Errorf("%s: %v after %d calls; want ok %v after %d", c.name, err, sc.calls.Load(), c.ok, c.calls)
		}
	}
}
