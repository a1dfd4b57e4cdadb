//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"shoal/cmd/shoal/integration/attacker/report"
	"shoal/transport"
)

// TestAttacks runs each attack of issues #20 and #33 as its own process, with the
// credential an attacker would hold (a client or server join token, an
// admin, inference or read key, a revoked token, a client node's
// certificate, a wrong or revoked bootstrap secret, a rotated join token,
// the data dir of a removed node), against two servers (one serving a tiny
// model), one client agent and the attacker's client node, each in its own
// network namespace (refused agents and CLI calls run in a fifth one, the
// nodes the last subtests admit and remove in three more). Every attack
// must be refused with a clear message (or bounded), leave the nodes and
// tokens as they were (or as the subtest changed them on purpose), and
// leave the cluster serving. The attacks of #33 (a member gossiped with the
// cluster's key, by a client node or a removed one; writes, floods and
// requests of an admitted node) follow those of #20, and the last subtest
// restarts both servers from their data dirs.
func TestAttacks(t *testing.T) {
	e := setup(t, 8)
	server, client, mallory, box, server2 := e.nodes[0], e.nodes[1], e.nodes[2], e.nodes[3], e.nodes[4]
	server.name, client.name, mallory.name, box.name, server2.name = "n0", "n1", "mallory", "box", "s1"
	// Namespaces for the agents the later subtests admit, then remove.
	victim, joiner, holder := e.nodes[5], e.nodes[6], e.nodes[7]
	victim.name, joiner.name, holder.name = "victim", "joiner", "holder"
	a := &attackEnv{env: e, server: server, server2: server2, client: client, box: box, key: secret}

	attacker := filepath.Join(e.dir, "attacker")
	build := exec.Command("go", "build", "-o", attacker, "shoal/cmd/shoal/integration/attacker")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build attacker: %v\n%s", err, out)
	}
	a.attacker = attacker
	model := filepath.Join(e.dir, "tiny.gguf")
	if out, err := exec.Command(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "64", "--n-layer", "2",
		"--n-head", "4", "--n-ff", "128", "--vocab-size", "512", "--ctx", "256", "-q", "--out", model).CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	a.model = "tiny"

	t0 := time.Now()
	server.args = []string{"agent", "--server", "--bootstrap-expect", "1", "--name", server.name, "--data-dir", server.dir,
		"--bind", server.ip, "--token", secret, "--model", model, "--threads", "1", "--log-level", "info"}
	e.start(server)
	a.waitAlive(t, 1, 30*time.Second)

	// The operator's credentials. Once an admin key exists the bootstrap
	// secret is no longer an API key: the admin key is used from here on.
	admin := a.createToken(t, "--kind", "admin", "--description", "operator")
	a.key = admin.Secret
	join := a.createToken(t, "--description", "client join token")
	serverJoin := a.createToken(t, "--role", "server", "--description", "server join token")
	inference := a.createToken(t, "--kind", "inference", "--description", "app")
	read := a.createToken(t, "--kind", "read", "--description", "dashboard")
	limited := a.createToken(t, "--kind", "inference", "--model", a.model, "--description", "tiny only")
	otherModel := a.createToken(t, "--kind", "inference", "--model", "other-model", "--description", "other model only")
	revoked := a.createToken(t, "--description", "revoked before use")
	if _, err := a.shoal(t, a.key, "token", "revoke", revoked.ID); err != nil {
		t.Fatal(err)
	}
	a.inferenceKey = inference.Secret

	client.args = []string{"agent", "--name", client.name, "--data-dir", client.dir, "--bind", client.ip,
		"--token", join.Secret, "--join", server.ip, "--threads", "1", "--log-level", "info"}
	mallory.args = []string{"agent", "--name", mallory.name, "--data-dir", mallory.dir, "--bind", mallory.ip,
		"--token", join.Secret, "--join", server.ip, "--threads", "1", "--log-level", "info"}
	server2.args = []string{"agent", "--server", "--name", server2.name, "--data-dir", server2.dir, "--bind", server2.ip,
		"--token", serverJoin.Secret, "--join", server.ip, "--threads", "1", "--log-level", "info"}
	e.start(server2)
	e.start(client)
	e.start(mallory)
	a.waitAlive(t, 4, 30*time.Second)
	a.waitServing(t, 60*time.Second)
	t.Logf("cluster up in %v: servers n0 (serving %q) and s1, client agent n1, attacker's client node mallory", time.Since(t0).Round(time.Millisecond), a.model)

	base := a.view(t)
	server2ID, clientID := base.id(t, server2.name), base.id(t, client.name)
	// The attacker program loads the certificate mallory's agent got for
	// the client join token (the agent keeps running), as the owner of a
	// client machine could.
	malloryTLS := filepath.Join(mallory.dir, "tls")
	servers := []string{server.ip + ":7947", server2.ip + ":7947"} // the leader, and a follower that would forward
	a.checkServing(t)
	// want is the state the cluster must be in after a subtest: the state
	// before it, or, for the subtests that add tokens, revoke the
	// bootstrap secret or remove the nodes they admitted, that state with
	// exactly those changes.
	want := base
	after := func(t *testing.T) {
		t.Helper()
		if got := a.view(t); !got.equal(want) {
			t.Errorf("cluster state changed:\nwant %s\ngot  %s", want, got)
		}
		a.checkServing(t)
	}
	// track takes token id as the cluster now holds it into want.
	track := func(t *testing.T, id string) string {
		t.Helper()
		line := a.view(t).token(t, id)
		want = want.withToken(line)
		return line
	}

	t.Run("client node writes an admin token with Cluster.Apply", func(t *testing.T) {
		const evilID, evilSecret = "evil01", "0123456789abcdef"
		for _, rpc := range servers {
			r := a.attack(t, mallory, "apply", "--tls", malloryTLS, "--server", rpc, "--bind", mallory.ip,
				"--id", evilID, "--secret", evilSecret, "--key", join.Secret, "--revoke", admin.ID)
			if len(r.Attempts) != 6 {
				t.Fatalf("attempts: %+v", r.Attempts)
			}
			for _, at := range r.Attempts {
				if at.Code != 403 || !strings.Contains(at.Err, "needs an admin key") {
					t.Errorf("%s via %s: got %d %q, want 403 \"... needs an admin key\"", at.Name, rpc, at.Code, at.Err)
				}
			}
		}
		for _, path := range []string{"/v1/nodes", "/v1/tokens"} {
			h := a.http(t, mallory, "GET", "https://"+server.ip+":7948"+path, evilID+"."+evilSecret, "")
			if h.Status != 401 && h.Status != 403 {
				t.Errorf("GET %s with the written key: %d %s", path, h.Status, h.Body)
			}
		}
		after(t)
	})

	t.Run("client node removes a server with Cluster.RemoveNode", func(t *testing.T) {
		// The follower server (the leader refuses its own removal anyway)
		// and the client agent, asked of either server.
		for _, rpc := range servers {
			for _, victim := range []string{server2ID, clientID} {
				r := a.attack(t, mallory, "remove", "--tls", malloryTLS, "--server", rpc, "--bind", mallory.ip,
					"--id", victim, "--key", join.Secret)
				if len(r.Attempts) != 3 {
					t.Fatalf("attempts: %+v", r.Attempts)
				}
				for _, at := range r.Attempts {
					if at.Code != 403 || !strings.Contains(at.Err, "removing a node needs an admin key") {
						t.Errorf("%s of %s via %s: got %d %q", at.Name, victim, rpc, at.Code, at.Err)
					}
				}
			}
		}
		after(t)
	})

	t.Run("client node moves the leadership with Cluster.TransferLeader", func(t *testing.T) {
		for _, rpc := range servers {
			r := a.attack(t, mallory, "lead", "--tls", malloryTLS, "--server", rpc, "--bind", mallory.ip,
				"--id", server2ID, "--key", join.Secret)
			if len(r.Attempts) != 3 {
				t.Fatalf("attempts: %+v", r.Attempts)
			}
			for _, at := range r.Attempts {
				if at.Code != 403 || !strings.Contains(at.Err, "moving the leadership needs an admin key") {
					t.Errorf("%s via %s: got %d %q", at.Name, rpc, at.Code, at.Err)
				}
			}
		}
		after(t)
	})

	t.Run("client node reads token hashes with Cluster.State", func(t *testing.T) {
		for _, rpc := range servers {
			r := a.attack(t, mallory, "state", "--tls", malloryTLS, "--server", rpc, "--bind", mallory.ip)
			if len(r.Attempts) != 0 || r.Nodes != len(base.nodes) {
				t.Fatalf("state read via %s: %+v", rpc, r)
			}
			kinds := map[string]bool{}
			for _, tk := range r.Tokens {
				kinds[tk.Kind] = true
				if tk.HasHash {
					t.Errorf("via %s a client node read the secret hash of %s token %s", rpc, tk.Kind, tk.ID)
				}
			}
			for _, k := range []string{"bootstrap", "admin", "join", "inference", "read"} {
				if !kinds[k] {
					t.Errorf("no %s token in the state a client node read via %s (%d tokens): the check would prove nothing", k, rpc, len(r.Tokens))
				}
			}
		}
		after(t)
	})

	t.Run("join as a server with a client token", func(t *testing.T) {
		dir := filepath.Join(box.dir, "as-server")
		r := a.agent(t, "--server", "--name", "rogue-server", "--data-dir", dir, "--token", join.Secret)
		r.refused(t, "admits clients, not servers", 15*time.Second)
		if _, err := os.Stat(filepath.Join(dir, "tls", "ca-key.pem")); !os.IsNotExist(err) {
			t.Errorf("the refused server holds a CA key file: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "tls")); !os.IsNotExist(err) {
			t.Errorf("the refused server holds a tls folder: %v", err)
		}
		after(t)
	})

	t.Run("start from a copy of a live node's data dir", func(t *testing.T) {
		dir := filepath.Join(box.dir, "copied")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		id, err := os.ReadFile(filepath.Join(client.dir, "node-id"))
		if err != nil || string(id) != clientID {
			t.Fatalf("n1's node-id %q %v, want %s", id, err, clientID)
		}
		if err := os.WriteFile(filepath.Join(dir, "node-id"), id, 0o600); err != nil {
			t.Fatal(err)
		}
		r := a.agent(t, "--name", "copy-of-n1", "--data-dir", dir, "--token", join.Secret)
		r.refused(t, "is already a live member", 15*time.Second)
		after(t)
	})

	t.Run("join with a live node's name", func(t *testing.T) {
		r := a.agent(t, "--name", client.name, "--data-dir", filepath.Join(box.dir, "same-name"), "--token", join.Secret)
		r.refused(t, `the name "n1" is taken by live node `+clientID, 15*time.Second)
		// The name still means the real node.
		if _, err := a.shoal(t, a.key, "node", "drain", client.name); err != nil {
			t.Fatal(err)
		}
		drained := a.view(t)
		for _, n := range drained.nodes {
			if want := n.ID == clientID; n.Draining != want {
				t.Errorf("after 'shoal node drain n1': %+v (want only %s draining)", n, clientID)
			}
		}
		if len(drained.nodes) != len(base.nodes) {
			t.Errorf("%d nodes after the drain, %d before", len(drained.nodes), len(base.nodes))
		}
		if _, err := a.shoal(t, a.key, "node", "undrain", client.name); err != nil {
			t.Fatal(err)
		}
		after(t)
	})

	t.Run("join with another cluster's CA hash", func(t *testing.T) {
		parts := strings.Split(join.Secret, ".")
		wrong := parts[0] + "." + parts[1] + "." + strings.Repeat("ab", 32)
		r := a.agent(t, "--name", "wrong-ca", "--data-dir", filepath.Join(box.dir, "wrong-ca"), "--token", wrong)
		r.refused(t, "does not match the CA hash in the join token", 10*time.Second)
		after(t)
	})

	t.Run("join with a revoked token", func(t *testing.T) {
		r := a.agent(t, "--name", "revoked", "--data-dir", filepath.Join(box.dir, "revoked"), "--token", revoked.Secret)
		r.refused(t, "token "+revoked.ID+" is revoked", 10*time.Second)
		after(t)
	})

	t.Run("keys beyond their scope", func(t *testing.T) {
		// An inference or a read key calls no admin endpoint; a join token
		// (client or server) is no API key at all.
		for _, c := range []struct {
			who, key, want string
			args           []string
		}{
			{"inference key", inference.Secret, "is a inference token", []string{"token", "create", "--kind", "admin"}},
			{"inference key", inference.Secret, "is a inference token", []string{"token", "revoke", admin.ID}},
			{"inference key", inference.Secret, "is a inference token", []string{"node", "drain", client.name}},
			{"inference key", inference.Secret, "is a inference token", []string{"node", "rm", client.name}},
			{"inference key", inference.Secret, "is a inference token", []string{"token", "ls"}},
			{"read key", read.Secret, "is a read token", []string{"token", "create", "--kind", "admin"}},
			{"read key", read.Secret, "is a read token", []string{"node", "drain", client.name}},
			{"read key", read.Secret, "is a read token", []string{"node", "rm", server2ID}},
			{"read key", read.Secret, "is a read token", []string{"token", "ls"}},
			{"client join token", join.Secret, "is a join token", []string{"token", "create", "--kind", "admin"}},
			{"server join token", serverJoin.Secret, "is a join token", []string{"node", "drain", client.name}},
		} {
			r, err := a.shoal(t, c.key, c.args...)
			if err == nil || r.code == 0 || !strings.Contains(r.errLine(), c.want) {
				t.Errorf("%s: shoal %s: exit %d, %q; want a refusal containing %q", c.who, strings.Join(c.args, " "), r.code, r.errLine(), c.want)
			}
			t.Logf("%s: shoal %s: %s", c.who, strings.Join(c.args, " "), r.errLine())
		}
		// The read key reads; the limited keys see their model only.
		if _, err := a.shoal(t, read.Secret, "node", "ls"); err != nil {
			t.Errorf("read key: %v", err)
		}
		chat := a.chatBody()
		for _, c := range []struct {
			who, key string
			status   int
			want     string
		}{
			{"read key", read.Secret, 401, "invalid_api_key"}, // the OpenAI endpoint's answer to a key it does not take
			{"key limited to another model", otherModel.Secret, 404, "model_not_found"},
			{"key limited to the model", limited.Secret, 200, `"choices"`},
		} {
			h := a.http(t, box, "POST", "https://"+server.ip+":7948/v1/chat/completions", c.key, chat)
			if h.Status != c.status || !strings.Contains(h.Body, c.want) {
				t.Errorf("%s: chat completion %d %s; want %d with %q", c.who, h.Status, h.Body, c.status, c.want)
			}
		}
		if h := a.http(t, box, "GET", "https://"+server.ip+":7948/v1/models", otherModel.Secret, ""); h.Status != 200 || strings.Contains(h.Body, `"`+a.model+`"`) {
			t.Errorf("key limited to another model lists: %d %s", h.Status, h.Body)
		}
		// An API key is not a join token.
		for _, c := range []struct{ who, key string }{{"admin key", admin.Secret}, {"inference key", inference.Secret}} {
			r := a.agent(t, "--name", "with-"+strings.Fields(c.who)[0], "--data-dir", filepath.Join(box.dir, "as-join-"+strings.Fields(c.who)[0]), "--token", c.key)
			r.refused(t, "has the form of an API key (ID.secret), not of a join token", 10*time.Second)
			if strings.Contains(r.stderr, strings.Split(c.key, ".")[1]) {
				t.Errorf("the refusal prints the %s's secret", c.who)
			}
		}
		after(t)
	})

	// The newest protections: a wrong or revoked bootstrap secret, a
	// rotated join token, a removed node. These subtests admit nodes (and
	// remove them again), add tokens and, last, revoke the bootstrap
	// secret: each states the state it leaves in want.
	t.Run("wrong bootstrap secret", func(t *testing.T) {
		const other = "another-clusters-secret-01234567" // 32 characters, like the secret an agent makes
		dir := filepath.Join(box.dir, "wrong-secret")
		r := a.agent(t, "--server", "--name", "wrong-secret", "--data-dir", dir, "--token", other)
		r.refused(t, "not this cluster's bootstrap secret", 10*time.Second)
		if _, err := os.Stat(filepath.Join(dir, "tls")); !os.IsNotExist(err) {
			t.Errorf("the refused server holds a tls folder: %v", err)
		}
		after(t)
	})

	t.Run("rotated join token", func(t *testing.T) {
		tok := a.createToken(t, "--description", "rotated")
		before := track(t, tok.ID)
		r, err := a.shoal(t, a.key, "token", "rotate", tok.ID)
		if err != nil {
			t.Fatal(err)
		}
		line := track(t, tok.ID)
		if line == before || !strings.Contains(line, ":revoked=false:") {
			t.Errorf("token %s after the rotation: %s (before: %s)", tok.ID, line, before)
		}
		var rotated newToken
		if err := json.Unmarshal([]byte(r.stdout), &rotated); err != nil || rotated.ID != tok.ID || rotated.Secret == "" || rotated.Secret == tok.Secret {
			t.Fatalf("token rotate: %v %q", err, r.stdout)
		}
		old := a.agent(t, "--name", joiner.name, "--data-dir", filepath.Join(box.dir, "old-secret"), "--token", tok.Secret)
		old.refused(t, "invalid token", 10*time.Second)
		// The new secret admits the node; it is removed again.
		j := a.background(t, joiner, "agent", "--name", joiner.name, "--data-dir", joiner.dir, "--bind", joiner.ip,
			"--join", server.ip, "--token", rotated.Secret, "--threads", "1", "--log-level", "info")
		a.waitNode(t, joiner.name, j, 30*time.Second)
		a.remove(t, joiner.name, j)
		after(t)
	})

	t.Run("removed node reconnects", func(t *testing.T) {
		tok := a.createToken(t, "--description", "victim's join token")
		track(t, tok.ID)
		args := func(token string) []string {
			return []string{"agent", "--name", victim.name, "--data-dir", victim.dir, "--bind", victim.ip,
				"--join", server.ip, "--token", token, "--threads", "1", "--log-level", "info"}
		}
		v := a.background(t, victim, args(tok.Secret)...)
		id := a.waitNode(t, victim.name, v, 30*time.Second)
		a.remove(t, victim.name, v)
		// (Until the failure detector notices, the gossip views may still
		// list the removed node alive: it stops without leaving gossip.)
		a.waitGone(t, id, 20*time.Second)

		// Restarted from its data dir with the same arguments, it stops by
		// itself and never shows up alive again.
		v = a.background(t, victim, args(tok.Secret)...)
		var restarted ran
		for done := false; !done; {
			a.notAlive(t, id)
			select {
			case restarted = <-v.done:
				done = true
			case <-time.After(200 * time.Millisecond):
				if time.Since(v.started) > 30*time.Second {
					t.Fatalf("the removed node kept running 30 s after its restart:\n%s", tail(v.log(), 15))
				}
			}
		}
		restarted.refused(t, "this node was removed from the cluster", 15*time.Second)
		const logLine = "the cluster refuses this node: it was removed with 'shoal node rm'"
		if !strings.Contains(restarted.stderr, logLine) {
			t.Errorf("the restarted node's log lacks %q:\n%s", logLine, tail(restarted.stderr, 15))
		}
		time.Sleep(2 * time.Second)
		a.notAlive(t, id)

		// Its certificate is refused on QUIC, by the leader and a follower.
		victimTLS := filepath.Join(victim.dir, "tls")
		for _, rpc := range servers {
			r := a.attack(t, victim, "state", "--tls", victimTLS, "--server", rpc, "--bind", victim.ip)
			if len(r.Attempts) != 1 || !strings.Contains(r.Attempts[0].Err, "revoked") || r.Nodes != 0 || len(r.Tokens) != 0 {
				t.Errorf("Cluster.State via %s with the removed node's certificate: %+v", rpc, r)
			}
		}

		// Without its certificate but with its node ID and a new join
		// token, it is refused at join.
		if err := os.RemoveAll(victimTLS); err != nil {
			t.Fatal(err)
		}
		tok2 := a.createToken(t, "--description", "fresh token for the removed node")
		track(t, tok2.ID)
		r := a.exec(victim, 30*time.Second, nil, a.bin, args(tok2.Secret)...)
		r.refused(t, "node "+id+" was removed from the cluster", 15*time.Second)
		a.notAlive(t, id)
		after(t)
	})

	t.Run("node serving a model gets no API keys", func(t *testing.T) {
		// A client node that serves a model (as one the planner made its
		// single holder, for the memory it claimed, would) receives the
		// requests the other agents take for it: without the users' keys.
		tok := a.createToken(t, "--description", "magnet's join token")
		track(t, tok.ID)
		user := a.createToken(t, "--kind", "inference", "--description", "a user of the magnet's model")
		track(t, user.ID)
		magnet := filepath.Join(e.dir, "magnet.gguf")
		if out, err := exec.Command(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "64", "--n-layer", "2",
			"--n-head", "4", "--n-ff", "128", "--vocab-size", "512", "--ctx", "256", "--seed", "7", "-q", "--out", magnet).CombinedOutput(); err != nil {
			t.Fatalf("gen-model: %v\n%s", err, out)
		}
		m := a.background(t, joiner, "agent", "--name", "magnet", "--data-dir", filepath.Join(joiner.dir, "magnet"), "--bind", joiner.ip,
			"--join", server.ip, "--token", tok.Secret, "--model", magnet, "--threads", "1", "--log-level", "debug")
		a.waitNode(t, "magnet", m, 30*time.Second)
		body := `{"model":"magnet","messages":[{"role":"user","content":"Hello"}],"max_tokens":4}`
		var h attackResult
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			h = a.http(t, box, "POST", "https://"+server.ip+":7948/v1/chat/completions", user.Secret, body)
			if h.Status == 200 || time.Now().After(deadline) {
				break
			}
		}
		if h.Status != 200 {
			t.Fatalf("chat through n0 with the magnet's model: %d %s", h.Status, h.Body)
		}
		a.remove(t, "magnet", m)
		if _, err := a.shoal(t, a.key, "model", "unload", "magnet"); err != nil {
			t.Error(err)
		}
		log := m.log()
		var forwarded []string
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "forwarded request") {
				forwarded = append(forwarded, line)
			}
		}
		if len(forwarded) == 0 {
			t.Fatalf("the magnet logged no forwarded request:\n%s", tail(log, 20))
		}
		for _, line := range forwarded {
			if strings.Contains(line, "Authorization") || strings.Contains(line, "Cookie") {
				t.Errorf("a forwarded request reached the magnet with credentials: %s", line)
			}
		}
		_, secret, _ := strings.Cut(user.Secret, ".")
		if strings.Contains(log, secret) {
			t.Error("the user's key is in the magnet's log")
		}
		after(t)
	})

	// Last: the secret the servers bootstrapped with is revoked.
	t.Run("revoked bootstrap secret", func(t *testing.T) {
		// Nothing is derived from the secret: the cluster's CA and gossip
		// key are not the ones it would give.
		derived, err := transport.DeriveCA(secret)
		if err != nil {
			t.Fatal(err)
		}
		var clusterCA string
		for _, p := range []*proc{server, server2, client, mallory} {
			ident, err := transport.LoadIdentity(filepath.Join(p.dir, "tls"))
			if err != nil {
				t.Fatal(err)
			}
			ca := transport.CAHash(ident.CA.Cert)
			if clusterCA == "" {
				clusterCA = ca
			}
			if ca != clusterCA || ca == transport.CAHash(derived.Cert) {
				t.Errorf("%s's CA %s (n0's %s, derived from the secret %s)", p.name, ca, clusterCA, transport.CAHash(derived.Cert))
			}
			if gk, err := os.ReadFile(filepath.Join(p.dir, "tls", "gossip.key")); err != nil || bytes.Equal(gk, transport.DeriveGossipKey(secret)) {
				t.Errorf("%s's gossip key: derived from the secret, or %v", p.name, err)
			}
		}

		// While valid, the secret admits a node (a client, removed again).
		h := a.background(t, holder, "agent", "--name", holder.name, "--data-dir", holder.dir, "--bind", holder.ip,
			"--join", server.ip, "--token", secret, "--threads", "1", "--log-level", "info")
		a.waitNode(t, holder.name, h, 30*time.Second)
		a.remove(t, holder.name, h)

		before := want.token(t, "bootstrap")
		if _, err := a.shoal(t, a.key, "token", "revoke", "bootstrap"); err != nil {
			t.Fatal(err)
		}
		if line := track(t, "bootstrap"); !strings.Contains(before, ":revoked=false:") || line != strings.Replace(before, ":revoked=false:", ":revoked=true:", 1) {
			t.Errorf("bootstrap token: %s before the revocation, %s after", before, line)
		}
		for _, c := range []struct {
			name string
			args []string
		}{{"late-server", []string{"--server"}}, {"late-client", nil}} {
			r := a.agent(t, append(c.args, "--name", c.name, "--data-dir", filepath.Join(box.dir, c.name), "--token", secret)...)
			r.refused(t, "bootstrap secret was revoked", 10*time.Second)
			if _, err := os.Stat(filepath.Join(box.dir, c.name, "tls")); !os.IsNotExist(err) {
				t.Errorf("%s holds a tls folder: %v", c.name, err)
			}
		}
		// (Retired as an API key since the first admin key, and revoked now.)
		for _, path := range []string{"/v1/nodes", "/v1/tokens"} {
			if h := a.http(t, box, "GET", "https://"+server.ip+":7948"+path, secret, ""); h.Status != 401 && h.Status != 403 {
				t.Errorf("GET %s with the revoked bootstrap secret: %d %s", path, h.Status, h.Body)
			}
		}
		after(t)
	})

	// Issue #33: gossip is not an authority, and an admitted node's
	// writes, floods and requests are bounded. Then, last, both servers
	// restart from their data dirs.
	s := &attackSuite{mallory: mallory, victim: victim, joiner: joiner, holder: holder, malloryTLS: malloryTLS,
		servers: servers, modelFile: model, admin: admin, join: join, read: read, after: after, track: track}
	a.gossipIsNoAuthority(t, s)
	a.restartServers(t, s)
}

// attackEnv is the cluster TestAttacks attacks and the tools it uses.
type attackEnv struct {
	*env
	server       *proc // the leader, which serves the model
	server2      *proc // a follower
	client       *proc // a client agent
	box          *proc // where refused agents and CLI calls run
	attacker     string
	model        string
	key          string // the operator's admin key
	inferenceKey string
}

type newToken struct {
	ID     string `json:"id"`
	Secret string `json:"token"`
}

// ran is a finished process.
type ran struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// errLine is the one line the shoal command prints when it fails.
func (r ran) errLine() string {
	var out []string
	for _, l := range strings.Split(r.stderr, "\n") {
		if strings.HasPrefix(l, "shoal: ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// refused checks that an agent stopped with a non-zero status within
// limit, on one error line containing want.
func (r ran) refused(t *testing.T, want string, limit time.Duration) {
	t.Helper()
	line := r.errLine()
	if r.code == 0 || r.code == -1 || !strings.Contains(line, want) || strings.Count(line, "\n") != 0 {
		t.Fatalf("agent: exit %d after %v, error %q; want a refusal containing %q\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), line, want, tail(r.stderr, 15))
	}
	if r.took > limit {
		t.Errorf("refused after %v, want within %v", r.took.Round(time.Millisecond), limit)
	}
	t.Logf("refused in %v: %s", r.took.Round(time.Millisecond), line)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exec runs bin in p's namespace, killed after timeout.
func (a *attackEnv) exec(p *proc, timeout time.Duration, env []string, bin string, args ...string) ran {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.ns, bin}, args...)...)
	c.Env = append(os.Environ(), env...)
	c.WaitDelay = 2 * time.Second
	var out, errb strings.Builder
	c.Stdout, c.Stderr = &out, &errb
	t0 := time.Now()
	err := c.Run()
	r := ran{stdout: out.String(), stderr: errb.String(), took: time.Since(t0)}
	if ctx.Err() != nil {
		r.code = -1 // killed at the timeout
	} else if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		r.code, r.stderr = -2, r.stderr+err.Error()
	}
	return r
}

// shoal runs a CLI command from the box against the server with key.
func (a *attackEnv) shoal(t *testing.T, key string, args ...string) (ran, error) {
	t.Helper()
	return a.shoalAt(t, a.server.ip+":7948", key, args...)
}

// shoalAt runs a CLI command from the box against the agent at addr.
func (a *attackEnv) shoalAt(t *testing.T, addr, key string, args ...string) (ran, error) {
	t.Helper()
	r := a.exec(a.box, 30*time.Second, []string{"SHOAL_ADDR=" + addr, "SHOAL_TOKEN=" + key, "SHOAL_CACERT=" + a.caCert()},
		a.bin, append(args, "-o", "json")...)
	if r.code != 0 {
		return r, fmt.Errorf("shoal %s: exit %d: %s", strings.Join(args, " "), r.code, strings.TrimSpace(r.stderr))
	}
	return r, nil
}

func (a *attackEnv) createToken(t *testing.T, args ...string) newToken {
	t.Helper()
	r, err := a.shoal(t, a.key, append([]string{"token", "create"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var tok newToken
	if err := json.Unmarshal([]byte(r.stdout), &tok); err != nil || tok.Secret == "" {
		t.Fatalf("token create: %v %q", err, r.stdout)
	}
	return tok
}

// agent starts `shoal agent` in the box, joining the server, and waits for
// it to exit (at most 30 s).
func (a *attackEnv) agent(t *testing.T, args ...string) ran {
	t.Helper()
	args = append([]string{"agent", "--bind", a.box.ip, "--join", a.server.ip, "--threads", "1"}, args...)
	return a.exec(a.box, 30*time.Second, nil, a.bin, args...)
}

// attackResult is what the attacker program prints.
type attackResult = report.Result

// attack runs the attacker program in p's namespace.
func (a *attackEnv) attack(t *testing.T, p *proc, args ...string) attackResult {
	t.Helper()
	return a.attackFor(t, p, 30*time.Second, args...)
}

func (a *attackEnv) http(t *testing.T, p *proc, method, url, key, body string) attackResult {
	t.Helper()
	return a.attack(t, p, "http", "--method", method, "--url", url, "--key", key, "--body", body, "--cacert", a.caCert())
}

// caCert is the cluster's HTTPS CA (the agents bind namespace addresses,
// so they serve HTTPS), from the server's data dir.
func (a *attackEnv) caCert() string { return filepath.Join(a.server.dir, "tls", "https-ca.pem") }

func (a *attackEnv) chatBody() string {
	return `{"model":"` + a.model + `","messages":[{"role":"user","content":"Hello"}],"max_tokens":4}`
}

// checkServing asks for a chat completion through the server and through
// the client agent, and for the status: the server still leads.
func (a *attackEnv) checkServing(t *testing.T) {
	t.Helper()
	for _, host := range []string{a.server.ip, a.client.ip} {
		h := a.http(t, a.box, "POST", "https://"+host+":7948/v1/chat/completions", a.inferenceKey, a.chatBody())
		var resp struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if h.Status != 200 || json.Unmarshal([]byte(h.Body), &resp) != nil || len(resp.Choices) != 1 || resp.Choices[0].FinishReason == "" {
			t.Errorf("chat completion via %s: %d %s", host, h.Status, h.Body)
		}
	}
	r, err := a.shoal(t, a.key, "status")
	var s status
	if err == nil {
		err = json.Unmarshal([]byte(r.stdout), &s)
	}
	if err != nil || s.Leader == "" || s.Health != "healthy" || len(s.Servers) != 2 || s.NodesAlive != 4 {
		t.Errorf("status: %+v %v", s, err)
	}
}

// waitAlive waits for the status to show a leader and n live nodes.
func (a *attackEnv) waitAlive(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		r, err := a.shoal(t, a.key, "status")
		var s status
		if err == nil && json.Unmarshal([]byte(r.stdout), &s) == nil && s.Leader != "" && s.NodesAlive == n {
			return
		}
		last = fmt.Sprint(err, r.stdout)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("not %d live nodes after %v: %s", n, timeout, last)
}

// waitServing waits until the model answers through the client agent.
func (a *attackEnv) waitServing(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var h attackResult
	for time.Now().Before(deadline) {
		h = a.http(t, a.box, "POST", "https://"+a.client.ip+":7948/v1/chat/completions", a.inferenceKey, a.chatBody())
		if h.Status == 200 {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("model not served after %v: %d %s", timeout, h.Status, h.Body)
}

// clusterView is the part of the state an attack must not change.
type clusterView struct {
	nodes  []viewNode
	tokens []string
}

type viewNode struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Role     string `json:"role"`
	Status   string `json:"status"`
	Draining bool   `json:"draining"`
}

func (v clusterView) String() string {
	return fmt.Sprintf("nodes %+v tokens %v", v.nodes, v.tokens)
}

func (v clusterView) equal(o clusterView) bool { return v.String() == o.String() }

func (v clusterView) id(t *testing.T, name string) string {
	for _, n := range v.nodes {
		if n.Name == name {
			return n.ID
		}
	}
	t.Fatalf("no node %s in %s", name, v)
	return ""
}

// view reads the nodes and tokens with the admin key.
func (a *attackEnv) view(t *testing.T) clusterView {
	t.Helper()
	var v clusterView
	r, err := a.shoal(t, a.key, "node", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(r.stdout), &v.nodes); err != nil {
		t.Fatal(err)
	}
	sort.Slice(v.nodes, func(i, j int) bool { return v.nodes[i].ID < v.nodes[j].ID })
	if r, err = a.shoal(t, a.key, "token", "ls"); err != nil {
		t.Fatal(err)
	}
	var toks []struct {
		ID, Kind, Role string
		SecretHash     string `json:"secret_hash"`
		Models         []string
		Revoked        bool
	}
	if err := json.Unmarshal([]byte(r.stdout), &toks); err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		v.tokens = append(v.tokens, fmt.Sprintf("%s:%s:%s:%v:revoked=%v:%.8s", tk.ID, tk.Kind, tk.Role, tk.Models, tk.Revoked, tk.SecretHash))
	}
	sort.Strings(v.tokens)
	return v
}

// running is an agent started in the background.
type running struct {
	done    chan ran // receives the agent's end
	started time.Time
	logFile string
	kill    func() // kill -9 (waits for the end)
}

// log is what the agent printed so far.
func (r *running) log() string {
	b, _ := os.ReadFile(r.logFile)
	return string(b)
}

// background starts bin args in p's namespace; it is killed when the
// test ends if it still runs.
func (a *attackEnv) background(t *testing.T, p *proc, args ...string) *running {
	t.Helper()
	f, err := os.CreateTemp(a.dir, p.name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.ns, a.bin}, args...)...)
	c.Stdout, c.Stderr = f, f
	c.WaitDelay = 2 * time.Second
	r := &running{done: make(chan ran, 1), started: time.Now(), logFile: f.Name()}
	if err := c.Start(); err != nil {
		cancel()
		f.Close()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		err := c.Wait()
		f.Close()
		res := ran{stderr: r.log(), took: time.Since(r.started)}
		if ee, ok := err.(*exec.ExitError); ok {
			res.code = ee.ExitCode()
		} else if err != nil {
			res.code = -2
		}
		if ctx.Err() != nil {
			res.code = -1
		}
		r.done <- res
		close(exited)
	}()
	r.kill = func() {
		cancel()
		<-exited
	}
	t.Cleanup(r.kill)
	return r
}

// waitNode waits until the node named name is alive in the state and
// returns its ID; the agent r must keep running meanwhile.
func (a *attackEnv) waitNode(t *testing.T, name string, r *running, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case res := <-r.done:
			t.Fatalf("agent %s stopped (exit %d):\n%s", name, res.code, tail(res.stderr, 15))
		default:
		}
		for _, n := range a.view(t).nodes {
			if n.Name == name && n.Status == "alive" {
				t.Logf("%s alive as %s after %v", name, n.ID, time.Since(r.started).Round(time.Millisecond))
				return n.ID
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s not alive after %v:\n%s", name, timeout, tail(r.log(), 15))
	return ""
}

// remove runs 'shoal node rm name' with the admin key and checks that the
// agent r stops by itself, on the error line of a removed node.
func (a *attackEnv) remove(t *testing.T, name string, r *running) {
	t.Helper()
	if _, err := a.shoal(t, a.key, "node", "rm", name); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	select {
	case res := <-r.done:
		// Exit status 3: a service manager does not restart it in a loop.
		if line := res.errLine(); res.code != 3 || !strings.Contains(line, "this node was removed from the cluster") {
			t.Errorf("%s after 'shoal node rm': exit %d, %q (want exit 3)\n%s", name, res.code, line, tail(res.stderr, 15))
		}
		t.Logf("%s stopped %v after 'shoal node rm': %s", name, time.Since(removed).Round(time.Millisecond), res.errLine())
	case <-time.After(15 * time.Second):
		t.Fatalf("%s still runs 15 s after 'shoal node rm':\n%s", name, tail(r.log(), 15))
	}
}

// aliveIn tells where node id shows alive: in the state, or in the
// gossip view of a server or of the client agent.
func (a *attackEnv) aliveIn(t *testing.T, id string) []string {
	t.Helper()
	var where []string
	for _, n := range a.view(t).nodes {
		if n.ID == id {
			where = append(where, fmt.Sprintf("the state (%s)", n.Status))
		}
	}
	for _, p := range []*proc{a.server, a.server2, a.client} {
		r, err := a.shoalAt(t, p.ip+":7948", a.key, "members")
		if err != nil {
			t.Fatal(err)
		}
		var ms []struct{ ID, Status string }
		if err := json.Unmarshal([]byte(r.stdout), &ms); err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.ID == id && m.Status == "alive" {
				where = append(where, p.name+"'s gossip view")
			}
		}
	}
	return where
}

// notAlive checks that node id is neither in the state nor alive in a
// gossip view.
func (a *attackEnv) notAlive(t *testing.T, id string) {
	t.Helper()
	if where := a.aliveIn(t, id); len(where) > 0 {
		t.Errorf("the removed node %s is back in %s", id, strings.Join(where, ", "))
	}
}

// waitGone waits until node id is neither in the state nor alive in a
// gossip view.
func (a *attackEnv) waitGone(t *testing.T, id string, timeout time.Duration) {
	t.Helper()
	t0 := time.Now()
	for {
		where := a.aliveIn(t, id)
		if len(where) == 0 {
			t.Logf("node %s out of the state and of every gossip view %v after its removal", id, time.Since(t0).Round(time.Millisecond))
			return
		}
		if time.Since(t0) > timeout {
			t.Fatalf("node %s still in %s %v after its removal", id, strings.Join(where, ", "), timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// token is the view's line of token id.
func (v clusterView) token(t *testing.T, id string) string {
	t.Helper()
	for _, l := range v.tokens {
		if strings.HasPrefix(l, id+":") {
			return l
		}
	}
	t.Fatalf("no token %s in %s", id, v)
	return ""
}

// withToken is v with line in place of the line of the same token ID, or
// added.
func (v clusterView) withToken(line string) clusterView {
	id := line[:strings.Index(line, ":")+1]
	out := clusterView{nodes: v.nodes}
	for _, l := range v.tokens {
		if !strings.HasPrefix(l, id) {
			out.tokens = append(out.tokens, l)
		}
	}
	out.tokens = append(out.tokens, line)
	sort.Strings(out.tokens)
	return out
}
