//go:build integration

package integration

import (
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
)

// TestAttacks runs each attack of issue #20 as its own process, with the
// credential an attacker would hold (a client or server join token, an
// admin, inference or read key, a revoked token, a client node's
// certificate), against two servers (one serving a tiny model), one client
// agent and the attacker's client node, each in its own network namespace
// (refused agents and CLI calls run in a fifth one). Every
// attack must be refused with a clear message, leave the nodes and tokens
// as they were, and leave the cluster serving.
func TestAttacks(t *testing.T) {
	e := setup(t, 5)
	server, client, mallory, box, server2 := e.nodes[0], e.nodes[1], e.nodes[2], e.nodes[3], e.nodes[4]
	server.name, client.name, mallory.name, box.name, server2.name = "n0", "n1", "mallory", "box", "s1"
	a := &attackEnv{env: e, server: server, client: client, box: box, key: secret}

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
	after := func(t *testing.T) {
		t.Helper()
		if got := a.view(t); !got.equal(base) {
			t.Errorf("cluster state changed:\nbefore %s\nafter  %s", base, got)
		}
		a.checkServing(t)
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
}

// attackEnv is the cluster TestAttacks attacks and the tools it uses.
type attackEnv struct {
	*env
	server       *proc // the leader, which serves the model
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
	r := a.exec(a.box, 30*time.Second, []string{"SHOAL_ADDR=" + a.server.ip + ":7948", "SHOAL_TOKEN=" + key, "SHOAL_CACERT=" + a.caCert()},
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
type attackResult struct {
	Attempts []struct {
		Name string `json:"name"`
		Code int    `json:"code"`
		Err  string `json:"err"`
	} `json:"attempts"`
	Tokens []struct {
		ID      string `json:"id"`
		Kind    string `json:"kind"`
		HasHash bool   `json:"has_hash"`
	} `json:"tokens"`
	Nodes  int    `json:"nodes"`
	Status int    `json:"status"`
	Body   string `json:"body"`
}

// attack runs the attacker program in p's namespace.
func (a *attackEnv) attack(t *testing.T, p *proc, args ...string) attackResult {
	t.Helper()
	r := a.exec(p, 30*time.Second, nil, a.attacker, args...)
	var res attackResult
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
		t.Fatalf("attacker %s: exit %d\n%s%s", args[0], r.code, r.stdout, r.stderr)
	}
	for _, at := range res.Attempts {
		t.Logf("attacker %s: %d %s", at.Name, at.Code, at.Err)
	}
	return res
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
