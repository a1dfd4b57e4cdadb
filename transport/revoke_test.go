package transport

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// revokedSet is a revocation list a test can grow.
type revokedSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (r *revokedSet) add(id string) { r.mu.Lock(); r.ids[id] = true; r.mu.Unlock() }
func (r *revokedSet) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

// TestRevokedPeerRefused: once a node's ID is revoked, its open
// connections close, and it can neither connect nor be connected to;
// the refusal says why.
func TestRevokedPeerRefused(t *testing.T) {
	ca, _ := NewCA()
	server := newEndpoint(t, ca, "server", RoleServer)
	removed := newEndpoint(t, ca, "removed", RoleClient)
	other := newEndpoint(t, ca, "other", RoleClient)
	list := &revokedSet{ids: map[string]bool{}}
	server.SetRevoked(list.has)
	for _, ep := range []*Endpoint{server, removed, other} {
		rpc := NewRPCServer(ep, KindRPC, time.Second)
		rpc.Register("ping", func(context.Context, Peer, json.RawMessage) (any, error) { return "pong", nil })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(from, to *Endpoint) error {
		var out string
		return Call(ctx, from, to.Addr().String(), KindRPC, "ping", nil, &out)
	}
	if err := call(removed, server); err != nil {
		t.Fatal(err)
	}
	if err := call(server, removed); err != nil {
		t.Fatal(err)
	}

	list.add("removed")
	server.CloseRevoked()
	err := call(removed, server)
	if !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), "node removed is revoked") {
		t.Fatalf("the removed node calls the server: %v", err)
	}
	if err := call(server, removed); err == nil || !strings.Contains(err.Error(), "is revoked") {
		t.Fatalf("the server calls the removed node: %v", err)
	}
	if err := call(other, server); err != nil {
		t.Fatalf("another node: %v", err)
	}
	if err := call(server, other); err != nil {
		t.Fatalf("to another node: %v", err)
	}
}
