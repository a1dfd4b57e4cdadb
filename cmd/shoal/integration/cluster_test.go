//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const secret = "integration-bootstrap-secret-0123"

type env struct {
	t      *testing.T
	bin    string
	dir    string
	prefix string
	bridge string
	nodes  []*proc
}

type proc struct {
	name string
	ns   string
	ip   string
	dir  string
	args []string
	cmd  *exec.Cmd
	bin  string // the binary it runs ("": the one the test built)
}

func run(t *testing.T, name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func must(t *testing.T, name string, args ...string) {
	t.Helper()
	if err := run(t, name, args...); err != nil {
		t.Fatal(err)
	}
}

// setup builds the binary and a bridge namespace with n node namespaces.
func setup(t *testing.T, n int) *env {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("integration: iproute2 (ip) is not installed")
	}
	e := &env{t: t, dir: t.TempDir(), prefix: fmt.Sprintf("shl%d", os.Getpid()%100000)}
	e.bridge = e.prefix + "-br"
	if err := run(t, "ip", "netns", "add", e.bridge); err != nil {
		t.Skipf("integration: cannot create network namespaces (needs root): %v", err)
	}
	t.Cleanup(e.teardown)
	e.bin = filepath.Join(e.dir, "shoal")
	build := exec.Command("go", "build", "-o", e.bin, "shoal/cmd/shoal")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	must(t, "ip", "-n", e.bridge, "link", "add", "br0", "type", "bridge")
	must(t, "ip", "-n", e.bridge, "link", "set", "br0", "up")
	for i := 0; i < n; i++ {
		p := &proc{name: fmt.Sprintf("n%d", i), ns: fmt.Sprintf("%s-%d", e.prefix, i), ip: fmt.Sprintf("10.77.0.%d", i+1), dir: filepath.Join(e.dir, fmt.Sprintf("n%d", i))}
		must(t, "ip", "netns", "add", p.ns)
		veth, peer := fmt.Sprintf("v%d", i), fmt.Sprintf("%s-b%d", e.prefix, i)
		must(t, "ip", "link", "add", peer, "type", "veth", "peer", "name", veth)
		must(t, "ip", "link", "set", veth, "netns", p.ns)
		must(t, "ip", "link", "set", peer, "netns", e.bridge)
		must(t, "ip", "-n", e.bridge, "link", "set", peer, "master", "br0")
		must(t, "ip", "-n", e.bridge, "link", "set", peer, "up")
		must(t, "ip", "-n", p.ns, "addr", "add", p.ip+"/24", "dev", veth)
		must(t, "ip", "-n", p.ns, "link", "set", veth, "up")
		must(t, "ip", "-n", p.ns, "link", "set", "lo", "up")
		e.nodes = append(e.nodes, p)
	}
	for _, p := range e.nodes {
		p.args = []string{"agent", "--server", "--bootstrap-expect", "3", "--name", p.name, "--data-dir", p.dir,
			"--bind", p.ip, "--token", secret, "--log-level", "info"}
		for _, o := range e.nodes[:3] {
			if o != p {
				p.args = append(p.args, "--join", o.ip)
			}
		}
	}
	return e
}

func (e *env) start(p *proc) {
	e.t.Helper()
	logf, err := os.OpenFile(filepath.Join(e.dir, p.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	bin := e.bin
	if p.bin != "" {
		bin = p.bin
	}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", p.ns, bin}, p.args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func(c *exec.Cmd, f *os.File) { _ = c.Wait(); f.Close() }(p.cmd, logf)
}

func (e *env) kill(p *proc, sig os.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p.cmd.ProcessState != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		time.Sleep(100 * time.Millisecond)
	}
	p.cmd = nil
}

func (e *env) teardown() {
	for _, p := range e.nodes {
		e.kill(p, os.Kill)
	}
	for _, p := range e.nodes {
		_ = run(e.t, "ip", "netns", "del", p.ns)
	}
	_ = run(e.t, "ip", "netns", "del", e.bridge)
	// SHOAL_KEEP_LOGS=DIR keeps every agent's whole log there.
	if keep := os.Getenv("SHOAL_KEEP_LOGS"); keep != "" {
		dst := filepath.Join(keep, strings.NewReplacer("/", "_", " ", "_").Replace(e.t.Name()))
		if err := os.MkdirAll(dst, 0o755); err == nil {
			for _, p := range e.nodes {
				if b, err := os.ReadFile(filepath.Join(e.dir, p.name+".log")); err == nil {
					_ = os.WriteFile(filepath.Join(dst, p.name+".log"), b, 0o644)
				}
			}
			e.t.Logf("agent logs kept in %s", dst)
		}
	}
	if e.t.Failed() {
		for _, p := range e.nodes {
			b, _ := os.ReadFile(filepath.Join(e.dir, p.name+".log"))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) > 25 {
				lines = lines[len(lines)-25:]
			}
			e.t.Logf("---- %s log (tail) ----\n%s", p.name, strings.Join(lines, "\n"))
		}
	}
}

// cli runs a shoal CLI command inside p's namespace against p's agent,
// over HTTPS (the agents bind a network address) trusting the cluster's
// HTTPS CA from p's data dir.
func (e *env) cli(p *proc, out any, args ...string) error {
	c := exec.Command("ip", append([]string{"netns", "exec", p.ns, e.bin}, append(args, "-o", "json")...)...)
	c.Env = append(os.Environ(), "SHOAL_ADDR="+p.ip+":7948", "SHOAL_TOKEN="+secret,
		"SHOAL_CACERT="+filepath.Join(p.dir, "tls", "https-ca.pem"))
	b, err := c.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = strings.TrimSpace(string(ee.Stderr))
		}
		return fmt.Errorf("shoal %s: %v %s", strings.Join(args, " "), err, msg)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

type status struct {
	Leader     string `json:"leader"`
	Health     string `json:"health"`
	NodesAlive int    `json:"nodes_alive"`
	Servers    []struct {
		ID    string `json:"id"`
		Voter bool   `json:"voter"`
	} `json:"servers"`
}

type nodeInfo struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
	Caps   struct {
		MemTotal uint64  `json:"mem_total"`
		Cores    int     `json:"cores"`
		GFLOPS   float64 `json:"gflops"`
		MemGBps  float64 `json:"mem_gbps"`
	} `json:"caps"`
}

func (e *env) waitHealthy(p *proc, alive int, timeout time.Duration) status {
	e.t.Helper()
	var s status
	var last error
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		s = status{}
		if last = e.cli(p, &s, "status"); last == nil && s.Leader != "" && s.Health == "healthy" && s.NodesAlive == alive {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("%s: not healthy with %d nodes after %v: %+v %v", p.name, alive, timeout, s, last)
	return s
}

func TestClusterInNamespaces(t *testing.T) {
	e := setup(t, 3)
	start := time.Now()
	for _, p := range e.nodes {
		e.start(p)
	}
	e.waitHealthy(e.nodes[0], 3, 30*time.Second)
	t.Logf("MEASURED formation: %v (3 processes, 3 namespaces, start to healthy)", time.Since(start).Round(time.Millisecond))

	// Each agent serves HTTPS once a server signed its certificate,
	// which can follow the cluster turning healthy by a moment.
	var nodes []nodeInfo
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := e.cli(e.nodes[1], &nodes, "node", "ls")
		if err == nil {
			break
		}
		if time.Now().After(deadline) || !strings.Contains(err.Error(), "no HTTPS certificate yet") {
			t.Fatal(err)
		}
	}
	if len(nodes) != 3 {
		t.Fatalf("node ls: %d nodes", len(nodes))
	}
	for _, n := range nodes {
		if n.Status != "alive" || n.Caps.MemTotal == 0 || n.Caps.Cores == 0 || n.Caps.GFLOPS <= 0 || n.Caps.MemGBps <= 0 {
			t.Fatalf("node %+v", n)
		}
	}

	// kill -9 the leader.
	var s status
	if err := e.cli(e.nodes[0], &s, "status"); err != nil {
		t.Fatal(err)
	}
	var leader *proc
	var leaderID string
	for _, n := range nodes {
		if n.ID == s.Leader {
			leaderID = n.ID
			for _, p := range e.nodes {
				if p.name == n.Name {
					leader = p
				}
			}
		}
	}
	if leader == nil {
		t.Fatalf("leader %s not among nodes", s.Leader)
	}
	killed := time.Now()
	e.kill(leader, os.Kill)
	for _, p := range e.nodes {
		if p == leader {
			continue
		}
		for {
			var s status
			if err := e.cli(p, &s, "status"); err == nil && s.Leader != "" && s.Leader != leaderID {
				break
			}
			if time.Since(killed) > 5*time.Second {
				t.Fatalf("%s: no new leader 5s after kill -9 of %s", p.name, leader.name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("MEASURED failover: %v from kill -9 of leader %s to a new leader answering on both survivors", time.Since(killed).Round(time.Millisecond), leader.name)
	survivor := e.nodes[0]
	if survivor == leader {
		survivor = e.nodes[1]
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ns []nodeInfo
		_ = e.cli(survivor, &ns, "node", "ls")
		failed := false
		for _, n := range ns {
			if n.ID == leaderID && n.Status == "failed" {
				failed = true
			}
		}
		if failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dead leader not marked failed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("MEASURED failure detection: dead node marked failed %v after kill", time.Since(killed).Round(time.Millisecond))

	restarted := time.Now()
	e.start(leader)
	e.waitHealthy(leader, 3, 30*time.Second)
	t.Logf("MEASURED rejoin: %v from restart to healthy with 3 alive", time.Since(restarted).Round(time.Millisecond))
	var after []nodeInfo
	if err := e.cli(leader, &after, "node", "ls"); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range after {
		if n.ID == leaderID && n.Name == leader.name && n.Status == "alive" {
			found = true
		}
	}
	if !found || len(after) != 3 {
		t.Fatalf("restarted node did not come back under id %s: %+v", leaderID, after)
	}

	// Stop everything (SIGTERM, graceful) and start again: state intact.
	var tok struct {
		ID string `json:"id"`
	}
	if err := e.cli(e.nodes[0], &tok, "token", "create", "--description", "survives restart"); err != nil {
		t.Fatal(err)
	}
	if err := e.cli(e.nodes[1], nil, "node", "drain", "n2"); err != nil {
		t.Fatal(err)
	}
	for _, p := range e.nodes {
		e.kill(p, os.Interrupt)
	}
	start = time.Now()
	for _, p := range e.nodes {
		e.start(p)
	}
	e.waitHealthy(e.nodes[2], 3, 30*time.Second)
	t.Logf("MEASURED full restart: %v from start to healthy", time.Since(start).Round(time.Millisecond))
	var toks []struct {
		ID, Description string
	}
	if err := e.cli(e.nodes[2], &toks, "token", "ls"); err != nil {
		t.Fatal(err)
	}
	ok := false
	for _, tk := range toks {
		ok = ok || (tk.ID == tok.ID && tk.Description == "survives restart")
	}
	var final []struct {
		Name     string `json:"name"`
		Draining bool   `json:"draining"`
	}
	_ = e.cli(e.nodes[0], &final, "node", "ls")
	drained := false
	for _, n := range final {
		drained = drained || (n.Name == "n2" && n.Draining)
	}
	if !ok || !drained || len(final) != 3 {
		t.Fatalf("state lost in restart: tokens %+v nodes %+v", toks, final)
	}
}
