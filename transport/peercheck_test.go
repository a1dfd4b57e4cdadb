package transport

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"shoal/internal/nodeaddr"
)

// TestRaftDialChecksPeer: a Raft stream carries the log (token hashes, the
// HTTPS CA key), so the Raft layer opens one only to a peer whose
// certificate says server, and, when the address names a server, that
// server: an address gossip points at a client node, or at another server,
// gets nothing, not even the stream's kind byte.
func TestRaftDialChecksPeer(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	leader := newEndpoint(t, ca, "leader", RoleServer)
	client := newEndpoint(t, ca, "mallory", RoleClient)
	other := newEndpoint(t, ca, "s2", RoleServer)
	var got atomic.Int32
	for _, ep := range []*Endpoint{client, other} {
		ep.Handle(KindRaft, func(s *Stream) { got.Add(1); s.Close() })
	}
	layer := NewRaftLayer(leader, leader.Addr())
	for _, c := range []struct {
		name, addr string
		ok         bool
	}{
		{"a client node's address", client.Addr().String(), false},
		{"a client node's address under its own ID", nodeaddr.Tag("mallory", client.Addr().String()), false},
		{"a client node's address under a server's ID", nodeaddr.Tag("s2", client.Addr().String()), false},
		{"a server's address under another ID", nodeaddr.Tag("s9", other.Addr().String()), false},
		{"the server meant", nodeaddr.Tag("s2", other.Addr().String()), true},
	} {
		before := got.Load()
		conn, err := layer.Dial(raft.ServerAddress(c.addr), 3*time.Second)
		if c.ok {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
				continue
			}
			_, _ = conn.Write([]byte("x"))
			waitCount(t, &got, before+1)
			conn.Close()
			continue
		}
		if err == nil {
			conn.Close()
			t.Errorf("%s: dialed", c.name)
		} else if !errors.Is(err, ErrWrongPeer) {
			t.Errorf("%s: %v, want ErrWrongPeer", c.name, err)
		}
		time.Sleep(100 * time.Millisecond)
		if n := got.Load(); n != before {
			t.Errorf("%s: the peer received %d raft streams", c.name, n-before)
		}
	}
}

// TestCallAsChecksPeer: a call meant for a server, or for one node, is not
// sent to another: the request (it may carry a key) never leaves.
func TestCallAsChecksPeer(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	caller := newEndpoint(t, ca, "n1", RoleClient)
	rogue := newEndpoint(t, ca, "mallory", RoleClient)
	var asked atomic.Int32
	NewRPCServer(rogue, KindRPC, 2*time.Second).Register("Cluster.CheckKey", func(context.Context, Peer, json.RawMessage) (any, error) {
		asked.Add(1)
		return nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := rogue.Addr().String()
	if err := CallAs(ctx, caller, addr, KindRPC, "", RoleServer, "Cluster.CheckKey", "sk-secret", nil); !errors.Is(err, ErrWrongPeer) {
		t.Errorf("to a client node as a server: %v", err)
	}
	if err := CallAs(ctx, caller, addr, KindRPC, "s1", "", "Cluster.CheckKey", "sk-secret", nil); !errors.Is(err, ErrWrongPeer) {
		t.Errorf("to node s1 at mallory's address: %v", err)
	}
	if err := CallAs(ctx, caller, addr, KindRPC, "mallory", "", "Cluster.CheckKey", nil, nil); err != nil {
		t.Errorf("to mallory as mallory: %v", err)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the rogue was asked %d times, want 1 (the call meant for it)", n)
	}
	p, err := caller.PeerAt(ctx, addr)
	if err != nil || p.ID != "mallory" || p.Role != RoleClient {
		t.Errorf("PeerAt: %+v %v", p, err)
	}
}

func waitCount(t *testing.T, n *atomic.Int32, want int32) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for n.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("got %d streams, want %d", n.Load(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
