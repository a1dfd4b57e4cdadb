package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"shoal/api"
	"shoal/coordinator"
	"shoal/node"
	tc "shoal/node/nodetest"
	"shoal/transport"
)

// TestRemovedNodeCannotReconnect: `shoal node rm` revokes the node's
// certificate: restarted from its data dir it is refused on QUIC and in
// gossip and stops with a clear log; with a new join token but its old
// node ID it is refused at join; the cluster keeps serving.
func TestRemovedNodeCannotReconnect(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The waits below are for what a loaded host (CI running packages
	// side by side, -race) may take with the harness's 200 ms Raft
	// timeouts: leadership there moved every second or two, and once no
	// leader held for 20 s, the harness's join timeout.
	m, err := c.AddWith("laptop", false, tok.Secret, func(cfg *node.Config) { cfg.Tuning.JoinTimeout = node.Duration(time.Minute) })
	if err != nil {
		t.Fatal(err)
	}
	li := len(c.Members) - 1
	id := m.Agent.ID()
	tc.Eventually(t, 30*time.Second, "laptop registered", func() bool {
		s, err := c.Client(0, "").Status(ctx(t))
		return err == nil && s.NodesAlive == 4
	})
	if err := c.Client(0, "").RemoveNode(ctx(t), "laptop"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Agent.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the removed node did not stop")
	}
	c.Stop(li, false)
	for _, s := range c.Members[:3] {
		tc.Eventually(t, 15*time.Second, "the revocation on "+s.Cfg.Name, func() bool {
			_, gone := s.Agent.Server().FSM().State().RevokedNodes[id]
			return gone
		})
	}

	// Its certificate is refused on QUIC.
	ident, err := transport.LoadIdentity(filepath.Join(m.Cfg.DataDir, "tls"))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	var st coordinator.State
	err = transport.Call(ctx(t), ep, c.Members[1].Agent.RPCAddr(), transport.KindRPC, coordinator.MethodState, nil, &st)
	if !errors.Is(err, transport.ErrRevoked) {
		t.Fatalf("the removed node's certificate on QUIC: %v", err)
	}

	// And in gossip, though it holds the gossip key.
	key, err := os.ReadFile(filepath.Join(m.Cfg.DataDir, "tls", "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name, mc.BindAddr, mc.BindPort, mc.SecretKey = id, "127.0.0.1", 0, key
	mc.LogOutput = testWriter{t}
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Shutdown()
	// (memberlist answers a join before its merge delegate refuses it, so
	// what counts is the members' view, not Join's count.)
	_, _ = ml.Join([]string{c.Members[0].Agent.GossipAddr()})
	time.Sleep(time.Second)
	for i := range c.Members[:3] {
		ms, _ := c.Client(i, "").Members(ctx(t))
		for _, mem := range ms {
			if mem.ID == id && mem.Status == string(coordinator.StatusAlive) {
				t.Fatalf("the removed node is alive in %s's gossip view again", c.Members[i].Cfg.Name)
			}
		}
	}
	_ = ml.Shutdown()

	// Restarted from its data dir, it stops by itself.
	a, err := node.Start(context.Background(), m.Cfg)
	if err == nil {
		select {
		case <-a.Done():
		case <-time.After(30 * time.Second):
			a.Shutdown(false)
			t.Fatal("the removed node kept running after a restart")
		}
	} else if !strings.Contains(err.Error(), "removed") {
		t.Fatalf("restart: %v", err)
	}

	// A new join token with its old node ID is refused at join.
	if err := os.RemoveAll(filepath.Join(m.Cfg.DataDir, "tls")); err != nil {
		t.Fatal(err)
	}
	tok2, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.Cfg
	cfg.Token = tok2.Secret
	if a, err := node.Start(context.Background(), cfg); err == nil {
		a.Shutdown(false)
		t.Fatal("the removed node ID joined again")
	} else if !strings.Contains(err.Error(), "was removed from the cluster") {
		t.Fatalf("join with the removed ID: %v", err)
	}

	nodes, err := c.Client(1, "").Nodes(ctx(t))
	if err != nil || len(nodes) != 3 {
		t.Fatalf("nodes after: %d %v", len(nodes), err)
	}
}

// TestTokenRotate: a rotated token's old secret stops working at once and
// the new one works; the bootstrap secret and revoked tokens are not
// rotated.
func TestTokenRotate(t *testing.T) {
	c := tc.New(t, 1)
	waitHealthy(t, c, 0, 1, 1, 15*time.Second)
	admin := c.Client(0, "")
	join, err := admin.CreateToken(ctx(t), api.TokenRequest{Description: "laptops"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := admin.CreateToken(ctx(t), api.TokenRequest{Kind: api.TokenRead})
	if err != nil {
		t.Fatal(err)
	}
	newJoin, err := admin.RotateToken(ctx(t), join.ID)
	if err != nil {
		t.Fatal(err)
	}
	if newJoin.ID != join.ID || newJoin.Secret == join.Secret || newJoin.Description != "laptops" || newJoin.RotatedAt == nil ||
		strings.Count(newJoin.Secret, ".") != 2 {
		t.Fatalf("rotated join token: %+v", newJoin)
	}
	if _, err := c.Add("old-secret", false, join.Secret); err == nil || !strings.Contains(err.Error(), "invalid token") {
		t.Fatalf("join with the old secret: %v", err)
	}
	if _, err := c.Add("new-secret", false, newJoin.Secret); err != nil {
		t.Fatalf("join with the new secret: %v", err)
	}
	newKey, err := admin.RotateToken(ctx(t), key.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client(0, key.Secret).Nodes(ctx(t)); statusOf(err) != 403 {
		t.Fatalf("old read key: %v", err)
	}
	if _, err := c.Client(0, newKey.Secret).Nodes(ctx(t)); err != nil {
		t.Fatalf("new read key: %v", err)
	}
	if _, err := admin.RotateToken(ctx(t), "bootstrap"); statusOf(err) != 400 {
		t.Fatalf("rotate the bootstrap secret: %v", err)
	}
	if err := admin.RevokeToken(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RotateToken(ctx(t), key.ID); statusOf(err) != 409 {
		t.Fatalf("rotate a revoked key: %v", err)
	}
	if _, err := c.Client(0, newKey.Secret).Nodes(ctx(t)); err == nil {
		t.Fatal("the revoked key still works")
	}
}

func statusOf(err error) int {
	var e *api.APIError
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// TestClusterNamesNodes: a joining node gets its ID from the cluster (not
// the one its data dir proposes) in a certificate that also binds its
// name; a data dir naming a known node that is down is refused at join,
// and a certificate is not reused under another --name.
func TestClusterNamesNodes(t *testing.T) {
	c := tc.New(t, 1)
	waitHealthy(t, c, 0, 1, 1, 15*time.Second)
	tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(c.Members[0].Cfg.DataDir)
	const proposed = "00000000-1111-2222-3333-444444444444"
	if err := os.MkdirAll(filepath.Join(base, "laptop"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "laptop", "node-id"), []byte(proposed), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := c.Add("laptop", false, tok.Secret)
	if err != nil {
		t.Fatal(err)
	}
	li := len(c.Members) - 1
	id := m.Agent.ID()
	saved, _ := os.ReadFile(filepath.Join(m.Cfg.DataDir, "node-id"))
	ident, err := transport.LoadIdentity(filepath.Join(m.Cfg.DataDir, "tls"))
	if err != nil {
		t.Fatal(err)
	}
	if id == proposed || string(saved) != id || ident.ID != id || ident.Name != "laptop" || ident.Role != transport.RoleClient {
		t.Fatalf("proposed %s, got ID %s, node-id file %s, certificate %s %q %s", proposed, id, saved, ident.ID, ident.Name, ident.Role)
	}
	tc.Eventually(t, 10*time.Second, "laptop alive", func() bool {
		s, err := c.Client(0, "").Status(ctx(t))
		return err == nil && s.NodesAlive == 2
	})
	c.Stop(li, false) // a crash: the node stays in the state, down

	cfg := m.Cfg
	cfg.Name = "desktop"
	if a, err := node.Start(context.Background(), cfg); err == nil {
		a.Shutdown(false)
		t.Fatal("the laptop's certificate started under another name")
	} else if !strings.Contains(err.Error(), `certificate names the node "laptop"`) {
		t.Fatalf("another name: %v", err)
	}

	tc.Eventually(t, 15*time.Second, "laptop down", func() bool {
		nodes, err := c.Client(0, "").Nodes(ctx(t))
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.ID == id {
				return n.Status != api.StatusAlive && n.Status != "suspect"
			}
		}
		return false
	})
	copyDir := filepath.Join(base, "copy")
	if err := os.MkdirAll(copyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(copyDir, "node-id"), []byte(id), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = m.Cfg
	cfg.Name, cfg.DataDir, cfg.Token = "copy", copyDir, tok.Secret
	if a, err := node.Start(context.Background(), cfg); err == nil {
		a.Shutdown(false)
		t.Fatal("a data dir naming the down laptop joined")
	} else if !strings.Contains(err.Error(), "belongs to node laptop") {
		t.Fatalf("join as the down laptop: %v", err)
	}
}
