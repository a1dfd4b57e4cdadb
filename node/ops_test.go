package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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

func voterCounts(t *testing.T, c *tc.Cluster, i int) (v, nv int) {
	s, err := c.Client(i, "").Status(ctx(t))
	if err != nil {
		return -1, -1
	}
	for _, srv := range s.Servers {
		if srv.Voter {
			v++
		} else {
			nv++
		}
	}
	return
}

// Must-show 3: a fourth and fifth server join (with a join token) as
// non-voters and are promoted to keep an odd voter count; drain flags a
// node unschedulable; `node rm` removes a node from Raft and gossip.
func TestScaleOutDrainRemove(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{Description: "servers 4 and 5", TTL: "1h", Role: api.RoleServer})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Kind != api.TokenJoin || strings.Count(tok.Secret, ".") != 2 {
		t.Fatalf("join token %+v", tok)
	}
	if _, err := c.Add("server-3", true, tok.Secret); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 10*time.Second, "4th server as non-voter", func() bool { v, nv := voterCounts(t, c, 0); return v == 3 && nv == 1 })
	time.Sleep(time.Second) // well past stabilization: 4 voters would be even
	if v, nv := voterCounts(t, c, 0); v != 3 || nv != 1 {
		t.Fatalf("with 4 servers: %d voters, %d non-voters; want 3+1", v, nv)
	}
	if _, err := c.Add("server-4", true, tok.Secret); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c, 4, 5, 5, 15*time.Second)

	// Drain: the flag placement reads.
	cl := c.Client(3, "")
	if err := cl.Drain(ctx(t), "server-1", true); err != nil {
		t.Fatal(err)
	}
	nodes, _ := c.Client(0, "").Nodes(ctx(t))
	if n := nodeByName(t, nodes, "server-1"); n == nil || !n.Draining || n.Schedulable() {
		t.Fatalf("drained node: %+v", n)
	}
	if err := cl.Drain(ctx(t), "server-1", false); err != nil {
		t.Fatal(err)
	}
	nodes, _ = c.Client(0, "").Nodes(ctx(t))
	if n := nodeByName(t, nodes, "server-1"); n == nil || n.Draining || !n.Schedulable() {
		t.Fatalf("undrained node: %+v", n)
	}
	if err := cl.Drain(ctx(t), "nobody", true); transport.StatusOf(err) != http.StatusNotFound || !strings.Contains(err.Error(), `node "nobody" not found`) {
		t.Fatalf("drain unknown: %v", err)
	}

	// Remove a follower: out of Raft, state and gossip; its agent stops.
	li := c.Leader(5 * time.Second)
	victim := (li + 1) % len(c.Members)
	vid := c.Members[victim].Agent.ID()
	done := c.Members[victim].Agent.Done()
	if err := c.Client((li+2)%len(c.Members), "").RemoveNode(ctx(t), c.Members[victim].Cfg.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("removed agent did not stop")
	}
	c.Members[victim].Agent = nil
	var last *api.Status
	t.Cleanup(func() {
		if t.Failed() && last != nil {
			t.Logf("last status: %+v", *last)
		}
	})
	// Generous: under a loaded CI machine gossip suspicion can delay the
	// demotion that restores an odd voter count.
	tc.Eventually(t, 30*time.Second, "removal from raft, state and gossip with 3 voters left", func() bool {
		s, err := c.Client(li, "").Status(ctx(t))
		if err != nil {
			return false
		}
		last = s
		v := 0
		for _, srv := range s.Servers {
			if srv.ID == vid {
				return false
			}
			if srv.Voter {
				v++
			}
		}
		nodes, _ := c.Client(li, "").Nodes(ctx(t))
		for _, n := range nodes {
			if n.ID == vid {
				return false
			}
		}
		ms, _ := c.Client(li, "").Members(ctx(t))
		for _, m := range ms {
			if m.ID == vid && m.Status == api.StatusAlive {
				return false
			}
		}
		return v == 3
	})
}

// Must-show 4: stop every agent and start them again: nodes, tokens and
// flags are intact.
func TestFullRestartKeepsState(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	cl := c.Client(1, "")
	join, err := cl.CreateToken(ctx(t), api.TokenRequest{Description: "keep me"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Drain(ctx(t), "server-2", true); err != nil {
		t.Fatal(err)
	}
	before, _ := c.Client(0, "").Nodes(ctx(t))
	beforeTokens, _ := c.Client(0, "").Tokens(ctx(t))

	c.StopAll()
	start := time.Now()
	errs := make(chan error, 3)
	for i := range c.Members {
		go func(i int) {
			var err error
			c.Members[i].Agent, err = node.Start(context.Background(), c.Members[i].Cfg)
			errs <- err
		}(i)
	}
	for range c.Members {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitHealthy(t, c, 2, 3, 3, 20*time.Second)
	t.Logf("full restart: healthy %v after starting all agents", time.Since(start).Round(time.Millisecond))
	after, _ := c.Client(2, "").Nodes(ctx(t))
	if len(after) != len(before) {
		t.Fatalf("%d nodes after restart, want %d", len(after), len(before))
	}
	for i := range before {
		b, a := before[i], after[i]
		if a.ID != b.ID || a.Name != b.Name || a.Draining != b.Draining || !a.RegisteredAt.Equal(b.RegisteredAt) {
			t.Errorf("node %s changed: %+v -> %+v", b.Name, b, a)
		}
	}
	afterTokens, _ := c.Client(2, "").Tokens(ctx(t))
	if len(afterTokens) != len(beforeTokens) {
		t.Fatalf("%d tokens after restart, want %d", len(afterTokens), len(beforeTokens))
	}
	found := false
	for _, tk := range afterTokens {
		if strings.HasPrefix(join.Secret, tk.ID+".") && tk.Description == "keep me" && !tk.Revoked {
			found = true
		}
	}
	if !found {
		t.Fatal("join token lost in restart")
	}
	// The token still admits a node.
	if _, err := c.Add("client-after-restart", false, join.Secret); err != nil {
		t.Fatal(err)
	}
}

// Must-show 5: refusals, each with a clear message.
func TestRefusals(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)

	t.Run("join without a token", func(t *testing.T) {
		_, err := c.Add("no-token", false, "")
		if err == nil || !strings.Contains(err.Error(), "no cluster identity") || !strings.Contains(err.Error(), "--token") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("join with a revoked token", func(t *testing.T) {
		cl := c.Client(0, "")
		tok, err := cl.CreateToken(ctx(t), api.TokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.RevokeToken(ctx(t), tok.ID); err != nil {
			t.Fatal(err)
		}
		_, err = c.Add("revoked", false, tok.Secret)
		if err == nil || !strings.Contains(err.Error(), "token "+tok.ID+" is revoked") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("join with a forged secret", func(t *testing.T) {
		tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(tok.Secret, ".")
		forged := parts[0] + ".aaaaaaaaaaaaaaaa." + parts[2]
		_, err = c.Add("forged", false, forged)
		if err == nil || !strings.Contains(err.Error(), "invalid token") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("join with another cluster's CA hash", func(t *testing.T) {
		tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(tok.Secret, ".")
		wrong := parts[0] + "." + parts[1] + "." + strings.Repeat("ab", 32)
		t0 := time.Now()
		_, err = c.Add("wrong-ca", false, wrong)
		if err == nil || !strings.Contains(err.Error(), "does not match the CA hash in the join token") {
			t.Fatalf("got %v", err)
		}
		if took := time.Since(t0); took > 10*time.Second {
			t.Errorf("refused after %v: a wrong CA hash must fail at once, not retry", took)
		}
		t.Logf("refused in %v: %v", time.Since(t0).Round(time.Millisecond), err)
	})
	t.Run("join as a server with a client token", func(t *testing.T) {
		tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
		if err != nil || tok.Role != api.RoleClient {
			t.Fatalf("default join token %+v %v, want the client role", tok, err)
		}
		before, _ := c.Client(0, "").Nodes(ctx(t))
		_, err = c.Add("not-a-server", true, tok.Secret)
		if err == nil || !strings.Contains(err.Error(), "admits clients, not servers") {
			t.Fatalf("got %v", err)
		}
		after, _ := c.Client(0, "").Nodes(ctx(t))
		if len(after) != len(before) {
			t.Errorf("%d nodes after the refused join, %d before", len(after), len(before))
		}
		// The same token admits a client.
		if _, err := c.Add("a-client", false, tok.Secret); err != nil {
			t.Fatalf("client join: %v", err)
		}
	})
	t.Run("join with a live node's name or ID", func(t *testing.T) {
		tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		joinAs := func(name, nodeID string) error {
			dir := t.TempDir()
			if nodeID != "" {
				if err := os.WriteFile(filepath.Join(dir, "node-id"), []byte(nodeID), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			a, err := node.Start(ctx(t), node.Config{Name: name, DataDir: dir, Bind: "127.0.0.1",
				GossipPort: tc.FreeGossipPort(t), QUICPort: tc.FreeUDPPort(t), Token: tok.Secret, Version: "test", Tuning: tc.Tuning,
				Join: []string{fmt.Sprintf("127.0.0.1:%d", c.Members[0].Cfg.QUICPort)}})
			if err == nil {
				a.Shutdown(false)
			}
			return err
		}
		victim := c.Members[1]
		if err := joinAs(victim.Cfg.Name, ""); err == nil || !strings.Contains(err.Error(), "is taken by live node") {
			t.Errorf("same name: %v", err)
		}
		if err := joinAs("copied-data-dir", victim.Agent.ID()); err == nil || !strings.Contains(err.Error(), "is already a live member") {
			t.Errorf("same node ID: %v", err)
		}
		nodes, _ := c.Client(0, "").Nodes(ctx(t))
		for _, n := range nodes {
			if n.ID == victim.Agent.ID() && n.Name != victim.Cfg.Name {
				t.Errorf("the victim's entry changed: %+v", n)
			}
		}
	})
	t.Run("client node writes the state", func(t *testing.T) {
		// A node with a genuine client certificate of this cluster.
		server, err := transport.LoadIdentity(filepath.Join(c.Members[0].Cfg.DataDir, "tls"))
		if err != nil {
			t.Fatal(err)
		}
		ca := server.CA
		ident, _ := transport.SelfIssue(ca, "11111111-2222-3333-4444-555555555555", transport.RoleClient)
		ident.CA = &transport.CA{Cert: ca.Cert, DER: ca.DER}
		ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		call := func(method string, in, out any) error {
			return transport.Call(ctx(t), ep, c.Members[0].Agent.RPCAddr(), transport.KindRPC, method, in, out)
		}
		body, _ := json.Marshal(coordinator.TokenCreateRequest{Token: coordinator.Token{ID: "evil01", Kind: coordinator.TokenAdmin, SecretHash: "x"}})
		err = call(coordinator.MethodApply, coordinator.ApplyRequest{Type: coordinator.TokenCreateType, Body: body}, nil)
		if transport.StatusOf(err) != http.StatusForbidden {
			t.Errorf("a client node wrote an admin token: %v", err)
		}
		if err := call(coordinator.MethodRemoveNode, coordinator.NodeRequest{ID: c.Members[2].Agent.ID()}, nil); transport.StatusOf(err) != http.StatusForbidden {
			t.Errorf("a client node removed a server: %v", err)
		}
		// Asking an agent to register a file it holds is for servers (or
		// a client agent relaying an operator's admin key).
		load := api.LoadModelRequest{Path: writeModel(t), Name: "planted"}
		if err := call("Models.Load", load, nil); transport.StatusOf(err) != http.StatusForbidden {
			t.Errorf("a client node had a server register a model: %v", err)
		}
		if ms, _ := c.Client(0, "").Models(ctx(t)); len(ms) != 0 {
			t.Errorf("models after the refused load: %+v", ms)
		}
		var st coordinator.State
		if err := call(coordinator.MethodState, nil, &st); err != nil {
			t.Fatal(err)
		}
		for id, tok := range st.Tokens {
			if tok.SecretHash != "" {
				t.Errorf("a client node read the hash of token %s", id)
			}
		}
		toks, _ := c.Client(0, "").Tokens(ctx(t))
		for _, tok := range toks {
			if tok.ID == "evil01" {
				t.Error("the refused token is in the state")
			}
		}
		if s, err := c.Client(0, "").Status(ctx(t)); err != nil || s.Nodes < 3 {
			t.Errorf("cluster after the attempts: %+v %v", s, err)
		}
	})
	t.Run("gossip without the cluster key", func(t *testing.T) {
		for _, key := range [][]byte{nil, []byte("0123456789abcdef0123456789abcdef")} {
			mc := memberlist.DefaultLANConfig()
			mc.Name = "intruder"
			mc.BindAddr = "127.0.0.1"
			mc.BindPort = 0
			mc.SecretKey = key
			mc.LogOutput = testWriter{t}
			ml, err := memberlist.Create(mc)
			if err != nil {
				t.Fatal(err)
			}
			n, err := ml.Join([]string{c.Members[0].Agent.GossipAddr()})
			_ = ml.Shutdown()
			if n != 0 || err == nil {
				t.Fatalf("key %q: joined %d nodes", key, n)
			}
			t.Logf("refused: %v", err)
		}
		ms, _ := c.Client(0, "").Members(ctx(t))
		for _, m := range ms {
			if m.ID == "intruder" {
				t.Fatal("intruder in the gossip view")
			}
		}
	})
	t.Run("QUIC peer without a valid certificate", func(t *testing.T) {
		other, _ := transport.DeriveCA("some-other-cluster-secret")
		ident, _ := transport.SelfIssue(other, "00000000-0000-0000-0000-000000000000", transport.RoleServer)
		ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		var st coordinator.State
		err = transport.Call(ctx(t), ep, c.Members[0].Agent.RPCAddr(), transport.KindRPC, "Cluster.State", nil, &st)
		if err == nil {
			t.Fatal("foreign certificate read the cluster state")
		}
		t.Logf("refused: %v", err)
	})
	t.Run("admin call without the API key", func(t *testing.T) {
		_, err := api.NewClient(c.Members[0].Agent.HTTPAddr(), "-").Status(ctx(t))
		if transport.StatusOf(err) != http.StatusForbidden || !strings.Contains(err.Error(), "invalid API key") {
			t.Fatalf("wrong key: %v", err)
		}
		req, _ := http.NewRequest("GET", "http://"+c.Members[0].Agent.HTTPAddr()+"/v1/nodes", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("no key: %d", resp.StatusCode)
		}
		// A join token is not an API key.
		tok, _ := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
		_, err = api.NewClient(c.Members[0].Agent.HTTPAddr(), tok.Secret).Nodes(ctx(t))
		if err == nil || !strings.Contains(err.Error(), "is a join token") {
			t.Fatalf("join token as API key: %v", err)
		}
	})
	t.Run("bootstrap secret retires once admin keys exist", func(t *testing.T) {
		key, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{Kind: "admin"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client(1, key.Secret).Status(ctx(t)); err != nil {
			t.Fatalf("admin key: %v", err)
		}
		// Followers apply the new key within a heartbeat or so.
		tc.Eventually(t, 3*time.Second, "bootstrap secret refused on every server", func() bool {
			for i := range c.Members {
				_, err := c.Client(i, "").Status(ctx(t))
				if err == nil || !strings.Contains(err.Error(), "no longer an API key") {
					return false
				}
			}
			return true
		})
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { return len(p), nil }

// A client agent forwards reads and writes to the servers.
func TestClientAgentForwards(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Add("laptop", false, tok.Secret)
	if err != nil {
		t.Fatal(err)
	}
	ci := len(c.Members) - 1
	tc.Eventually(t, 10*time.Second, "client registered", func() bool {
		s, err := c.Client(ci, "").Status(ctx(t))
		return err == nil && s.NodesAlive == 4 && s.Role == "client" && s.Node == m.Agent.ID()
	})
	if err := c.Client(ci, "").Drain(ctx(t), "laptop", true); err != nil {
		t.Fatal(err)
	}
	// A model load on another node, asked of the client agent, goes
	// through a server with the operator's key.
	if _, err := c.Client(ci, "").LoadModel(ctx(t), api.LoadModelRequest{Path: writeModel(t), Node: "server-1"}); err != nil {
		t.Fatalf("load through the client agent: %v", err)
	}
	if ms, err := c.Client(0, "").Models(ctx(t)); err != nil || len(ms) != 1 || ms[0].SourceName != "server-1" {
		t.Fatalf("models: %+v %v", ms, err)
	}
	nodes, _ := c.Client(0, "").Nodes(ctx(t))
	if n := nodeByName(t, nodes, "laptop"); n == nil || n.Role != "client" || !n.Draining {
		t.Fatalf("client node: %+v", n)
	}
}
