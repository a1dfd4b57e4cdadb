package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

type oneServer struct{}

func (oneServer) Events() <-chan struct{} { return nil }

func (oneServer) Members() []Member {
	return []Member{{ID: "s1", Role: RoleServer, Status: StatusAlive, RPCAddr: "s1:1"}}
}

// scriptedCaller answers the first len(errs) calls with errs, then nil.
type scriptedCaller struct {
	errs  []error
	calls atomic.Int32
}

func (s *scriptedCaller) Call(ctx context.Context, addr, method string, in, out any) error {
	n := int(s.calls.Add(1))
	if n <= len(s.errs) {
		return s.errs[n-1]
	}
	return nil
}

// remoteErr is an error as it crosses the RPC (transport.RPCError).
type remoteErr struct {
	code int
	msg  string
}

func (e remoteErr) Error() string   { return e.msg }
func (e remoteErr) HTTPStatus() int { return e.code }

type unreachable struct{}

func (unreachable) Error() string     { return "dial s1:1: timeout" }
func (unreachable) Unreachable() bool { return true }

// TestWritesWaitForLeader: a write that finds no leader (the server says
// so, or the old leader cannot be reached) is sent again until a leader
// takes it, within LeaderWait; other errors return at once, and so does a
// write when the wait is over.
func TestWritesWaitForLeader(t *testing.T) {
	leaderless := []error{remoteErr{503, "not the leader"}, remoteErr{503, "no cluster leader"}, unreachable{}}
	sc := &scriptedCaller{errs: leaderless}
	c := NewClient(nil, oneServer{}, sc, zap.NewNop())
	if err := c.Apply(context.Background(), NodeDrainType, NodeDrainRequest{ID: "n"}); err != nil || sc.calls.Load() != 4 {
		t.Fatalf("apply through an election: %v after %d calls", err, sc.calls.Load())
	}
	sc = &scriptedCaller{errs: leaderless}
	c = NewClient(nil, oneServer{}, sc, zap.NewNop())
	if err := c.RemoveNode(context.Background(), "n"); err != nil || sc.calls.Load() != 4 {
		t.Fatalf("remove through an election: %v after %d calls", err, sc.calls.Load())
	}

	sc = &scriptedCaller{errs: []error{remoteErr{http.StatusForbidden, "needs an admin key"}}}
	c = NewClient(nil, oneServer{}, sc, zap.NewNop())
	if err := c.Apply(context.Background(), NodeDrainType, NodeDrainRequest{ID: "n"}); err == nil || sc.calls.Load() != 1 {
		t.Fatalf("a refused write: %v after %d calls", err, sc.calls.Load())
	}

	sc = &scriptedCaller{errs: make([]error, 1000)}
	for i := range sc.errs {
		sc.errs[i] = ErrNotLeader
	}
	c = NewClient(nil, oneServer{}, sc, zap.NewNop())
	c.LeaderWait = 300 * time.Millisecond
	start := time.Now()
	err := c.Apply(context.Background(), NodeDrainType, NodeDrainRequest{ID: "n"})
	if !errors.Is(err, ErrNotLeader) || time.Since(start) > time.Second {
		t.Fatalf("no leader for good: %v after %v", err, time.Since(start))
	}
}

// TestTokenCreateRepeated: a token create sent again (its first leader
// went away after applying it) succeeds; another token under the same ID
// is still refused.
func TestTokenCreateRepeated(t *testing.T) {
	s := NewState()
	tok := Token{ID: "t1", SecretHash: "h1", Kind: TokenAdmin}
	for i := 0; i < 2; i++ {
		if r := commands[TokenCreateType](s, 1, mustJSON(t, TokenCreateRequest{Token: tok})); r != nil {
			t.Fatalf("create %d: %v", i, r)
		}
	}
	tok.SecretHash = "h2"
	if r := commands[TokenCreateType](s, 1, mustJSON(t, TokenCreateRequest{Token: tok})); r == nil {
		t.Fatal("a different token under an existing ID was stored")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
