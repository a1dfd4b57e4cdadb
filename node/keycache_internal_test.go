package node

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
)

// oneServer is a gossip view with one live server.
type oneServer struct{}

func (oneServer) Members() []coordinator.Member {
	return []coordinator.Member{{ID: "s1", Role: coordinator.RoleServer, Status: coordinator.StatusAlive, RPCAddr: "127.0.0.1:1"}}
}
func (oneServer) Events() <-chan struct{} { return nil }

// keyServer answers key checks as told, counting them.
type keyServer struct {
	asked int
	grant keyGrant
	err   error
}

func (s *keyServer) Call(_ context.Context, _, method string, _, out any) error {
	if method != methodCheckKey {
		return errors.New("unexpected " + method)
	}
	s.asked++
	if s.err != nil {
		return s.err
	}
	*out.(*keyGrant) = s.grant
	return nil
}

// TestClientAgentKeyCache: a client agent asks a server about a key once
// per keyFresh, not once per request; a server's no is never kept and
// ends a kept yes; with no server answering, a yes of the last keyStale
// stands and an older one does not.
func TestClientAgentKeyCache(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	srv := &keyServer{grant: keyGrant{Kind: coordinator.TokenInference, Models: []string{"m"}}}
	b := &admin{cluster: coordinator.NewClient(nil, oneServer{}, srv, zap.NewNop()), call: srv}
	b.keys.Now = func() time.Time { return now }
	ctx := context.Background()
	check := func(want error, wantAsked int) {
		t.Helper()
		tok, err := b.grant(ctx, "k1", api.ScopeInference)
		if (err == nil) != (want == nil) {
			t.Fatalf("grant: %v, want %v", err, want)
		}
		if err == nil && (tok == nil || tok.Models[0] != "m") {
			t.Fatalf("grant: token %+v", tok)
		}
		if srv.asked != wantAsked {
			t.Fatalf("the server was asked %d times, want %d", srv.asked, wantAsked)
		}
	}
	check(nil, 1)
	for range 50 {
		check(nil, 1) // one request after another: kept
	}
	if _, err := b.grant(ctx, "k1", api.ScopeAdmin); err != nil || srv.asked != 2 {
		t.Fatalf("another scope is asked for on its own: %v, asked %d", err, srv.asked)
	}
	now = now.Add(keyFresh + time.Second)
	check(nil, 3) // asked again once fresh ran out

	// Revoked: the server's no ends the kept yes.
	now = now.Add(keyFresh + time.Second)
	srv.err = &coordinator.Error{Code: http.StatusForbidden, Msg: "token revoked"}
	check(srv.err, 4)
	srv.err = &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: "no leader"}
	check(srv.err, 5) // no server answers, and nothing is kept

	// No server answers: a yes of the last minute stands, an older not.
	srv.err = nil
	check(nil, 6)
	srv.err = errors.New("connection refused")
	now = now.Add(keyFresh + time.Second)
	check(nil, 7)
	now = now.Add(keyStale)
	check(srv.err, 8)

	// A key the server refused is never kept: each request asks.
	srv.err = &coordinator.Error{Code: http.StatusUnauthorized, Msg: "unknown key"}
	for i := range 3 {
		if _, err := b.grant(ctx, "nope", api.ScopeInference); err == nil || srv.asked != 9+i {
			t.Fatalf("unknown key: %v, asked %d", err, srv.asked)
		}
	}
}
