//go:build integration

package deploy_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// composeEnv is a compose project of the test's own: an image tag, a
// project name and an API port nobody else uses.
type composeEnv struct {
	t           *testing.T
	root        string // the repository
	bin         string // the host's shoal, the operator's CLI
	compose     string // docker-compose
	composeFile string
	project     string
	env         []string
	secret      string
	api         string
	ca          string
	client      *http.Client
}

// TestComposeCluster builds the image (FROM scratch, no registry), starts
// deploy/compose's three servers, waits for a leader, loads the built-in
// model, gets chat completions with the official OpenAI client, stops one
// container (SIGTERM: it drains and exits 0) and still gets completions,
// starts it again and sees it rejoin under its old identity, then runs
// deploy/README.md's rolling upgrade under compose while clients stream
// completions (the subtest "rolling upgrade"), and tears everything down.
func TestComposeCluster(t *testing.T) {
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose is not installed")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine: %v %s", err, out)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	e := &composeEnv{t: t, root: root, compose: compose, project: "shoaltest" + strconv.Itoa(os.Getpid()),
		composeFile: filepath.Join(root, "deploy", "compose", "compose.yaml")}
	dir := t.TempDir()
	image := e.project + ":latest"
	e.bin = filepath.Join(dir, "shoal")
	build := exec.Command("make", "-C", root, "image", "IMAGE="+image)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	if out, err := exec.Command("cp", filepath.Join(root, "deploy", ".image", "shoal"), e.bin).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", image).Run() })
	size, _ := exec.Command("docker", "image", "inspect", image, "--format", "{{.Size}}").Output()
	t.Logf("MEASURED image %s: %s bytes", image, strings.TrimSpace(string(size)))

	buf := make([]byte, 24)
	_, _ = rand.Read(buf)
	e.secret = hex.EncodeToString(buf)
	envFile := filepath.Join(dir, "shoal.env")
	// Info logs: the drains, leaves and plans show in the logs of a failure.
	if err := os.WriteFile(envFile, []byte("SHOAL_AGENT_TOKEN="+e.secret+"\nSHOAL_LOG_LEVEL=info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	e.api = "https://127.0.0.1:" + port
	e.env = append(os.Environ(), "SHOAL_IMAGE="+image, "SHOAL_ENV_FILE="+envFile, "SHOAL_API_PORT="+port)
	dc := e.dc
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := dc(time.Minute, "logs", "--no-color", "--tail", "60")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := dc(3*time.Minute, "down", "-v", "--timeout", "5"); err != nil {
			t.Logf("compose down: %v\n%s", err, out)
		}
	})
	if out, err := dc(3*time.Minute, "up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	container := func(service string) string { return e.container(t, service) }

	// The CA appears in /data once a leader has made it; a leader known to
	// the published agent is what "serving" needs.
	t0 := time.Now()
	e.ca = filepath.Join(dir, "ca.pem")
	waitFor(t, 3*time.Minute, "the cluster's HTTPS CA", func() error {
		return exec.Command("docker", "cp", container("shoal-1")+":/data/tls/https-ca.pem", e.ca).Run()
	})
	pem, err := os.ReadFile(e.ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("the CA file holds no certificate")
	}
	e.client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var st struct {
		Leader     string `json:"leader"`
		LeaderName string `json:"leader_name"`
		NodesAlive int    `json:"nodes_alive"`
	}
	waitFor(t, 3*time.Minute, "a leader and 3 nodes alive", func() error {
		if err := e.get("/v1/status", &st); err != nil {
			return err
		}
		if st.Leader == "" || st.NodesAlive != 3 {
			return fmt.Errorf("leader %q, %d alive", st.LeaderName, st.NodesAlive)
		}
		return nil
	})
	t.Logf("MEASURED leader %s and 3 nodes alive %.1f s after compose up", st.LeaderName, time.Since(t0).Seconds())

	if out, err := e.shoal("model", "load", "/models/builtin.gguf", "--name", "builtin"); err != nil {
		t.Fatalf("model load: %v\n%s", err, out)
	}
	oai := oa.NewClient(option.WithBaseURL(e.api+"/v1/"), option.WithAPIKey(e.secret), option.WithMaxRetries(0),
		option.WithHTTPClient(e.client))
	chat := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := oai.Chat.Completions.New(ctx, oa.ChatCompletionNewParams{Model: "builtin", MaxTokens: oa.Int(8),
			Messages: []oa.ChatCompletionMessageParamUnion{oa.UserMessage("Hello from compose")}})
		if err != nil {
			return err
		}
		if len(res.Choices) != 1 || res.Usage.CompletionTokens == 0 {
			return fmt.Errorf("empty completion: %+v", res)
		}
		return nil
	}
	waitFor(t, 2*time.Minute, "a chat completion", chat)

	// Stop a container: the one whose node holds the model, so the stop is
	// felt (the API stays on shoal-1, whose port is published).
	var plan struct {
		Stages []struct {
			Members []struct {
				NodeName string `json:"node_name"`
			} `json:"members"`
		} `json:"stages"`
	}
	victim := "shoal-2"
	if out, err := e.shoal("placement", "show", "builtin", "--json"); err == nil && json.Unmarshal([]byte(out), &plan) == nil {
		for _, s := range plan.Stages {
			for _, m := range s.Members {
				if m.NodeName != "" && m.NodeName != "shoal-1" {
					victim = m.NodeName
				}
			}
		}
	}
	id := container(victim)
	nodeID := e.nodeID(victim)
	t1 := time.Now()
	if out, err := exec.Command("docker", "stop", "-t", "45", id).CombinedOutput(); err != nil {
		t.Fatalf("docker stop %s: %v %s", victim, err, out)
	}
	stopped := time.Since(t1)
	code, _ := exec.Command("docker", "inspect", id, "--format", "{{.State.ExitCode}}").Output()
	if strings.TrimSpace(string(code)) != "0" {
		t.Fatalf("%s exited %s after SIGTERM, want 0 (a drained, clean leave)", victim, code)
	}
	t2 := time.Now()
	waitFor(t, 2*time.Minute, "a chat completion with "+victim+" stopped", chat)
	t.Logf("MEASURED %s stopped (drained, exit 0) in %.1f s; completions again %.1f s later", victim, stopped.Seconds(), time.Since(t2).Seconds())
	for i := 0; i < 3; i++ {
		if err := chat(); err != nil {
			t.Fatalf("completion %d with %s stopped: %v", i, victim, err)
		}
	}

	// Start it again: it rejoins as the same node (its data volume keeps
	// its identity) and the cluster has 3 alive.
	t3 := time.Now()
	if out, err := exec.Command("docker", "start", id).CombinedOutput(); err != nil {
		t.Fatalf("docker start: %v %s", err, out)
	}
	waitFor(t, 2*time.Minute, victim+" alive again", func() error {
		var nodes []struct {
			ID     string `json:"id"`
			Name   string `json:"name"`
			Status string `json:"status"`
		}
		if err := e.get("/v1/nodes", &nodes); err != nil {
			return err
		}
		alive := 0
		for _, n := range nodes {
			if n.Status == "alive" {
				alive++
			}
			if n.Name == victim && (n.ID != nodeID || n.Status != "alive") {
				return fmt.Errorf("%s: id %s status %s (before: %s)", victim, n.ID, n.Status, nodeID)
			}
		}
		if len(nodes) != 3 || alive != 3 {
			return fmt.Errorf("%d nodes, %d alive", len(nodes), alive)
		}
		return nil
	})
	t.Logf("MEASURED %s rejoined as the same node %.1f s after docker start", victim, time.Since(t3).Seconds())
	if err := chat(); err != nil {
		t.Fatalf("completion after the rejoin: %v", err)
	}

	t.Run("rolling upgrade", func(t *testing.T) { e.rollingUpgrade(t, image, chat) })
}

func (e *composeEnv) dc(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := exec.CommandContext(ctx, e.compose, append([]string{"-p", e.project, "-f", e.composeFile}, args...)...)
	c.Env = e.env
	out, err := c.CombinedOutput()
	return string(out), err
}

// container is the ID of service's container.
func (e *composeEnv) container(t *testing.T, service string) string {
	t.Helper()
	out, err := e.dc(time.Minute, "ps", "-q", service)
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("no container for %s: %v %s", service, err, out)
	}
	return strings.TrimSpace(out)
}

func (e *composeEnv) shoal(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, e.bin, append(args, "--addr", e.api)...)
	c.Env = append(os.Environ(), "SHOAL_TOKEN="+e.secret, "SHOAL_CACERT="+e.ca)
	out, err := c.CombinedOutput()
	return string(out), err
}

func (e *composeEnv) get(path string, out any) error {
	req, _ := http.NewRequest(http.MethodGet, e.api+path, nil)
	req.Header.Set("Authorization", "Bearer "+e.secret)
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (e *composeEnv) nodeID(name string) string {
	var nodes []struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	if err := e.get("/v1/nodes", &nodes); err != nil {
		e.t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n.ID
		}
	}
	e.t.Fatalf("no node %s", name)
	return ""
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// The part of deploy/README.md whose sh blocks the rolling upgrade runs.
const (
	upgradeDoc        = "README.md"
	upgradeSection    = "Rolling upgrades"
	upgradeSubsection = "Docker compose"
)

// rollingUpgrade tags the image as the "next" release (the procedure is
// what is tested, not a change of version), runs the sh blocks of the
// "Docker compose" part of deploy/README.md's "Rolling upgrades" with bash
// as they are written, with the environment a user sets (the compose
// project, SHOAL_IMAGE, the CLI's SHOAL_ADDR, SHOAL_TOKEN and SHOAL_CACERT),
// while clients stream completions through the published port; every
// stream that starts must end with [DONE] and no error, and a request may
// be refused only with 503 or by finding no connection (the client tries
// again). Then every node is
// alive under its old ID with the new version, every container runs the
// new tag, and the model answers.
func (e *composeEnv) rollingUpgrade(t *testing.T, image string, chat func() error) {
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("jq is not installed: deploy/README.md's rolling upgrade uses it")
	}
	src, err := os.ReadFile(upgradeDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := markdownBlocks(string(src), upgradeSection, upgradeSubsection, "sh")
	if err != nil {
		t.Fatalf("%s: %v", upgradeDoc, err)
	}
	next := e.project + ":next"
	if out, err := exec.Command("docker", "tag", image, next).CombinedOutput(); err != nil {
		t.Fatalf("docker tag: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", next).Run() })
	out, err := exec.Command("docker", "run", "--rm", next, "version", "-o", "json").Output()
	var build struct {
		Version string `json:"version"`
	}
	if err != nil || json.Unmarshal(out, &build) != nil || build.Version == "" {
		t.Fatalf("docker run %s version -o json: %v %s", next, err, out)
	}
	before := map[string]string{} // name → node ID
	for _, n := range e.nodes(t) {
		before[n.Name] = n.ID
	}

	env := append(slices.Clone(e.env),
		"COMPOSE_PROJECT_NAME="+e.project, "SHOAL_IMAGE="+next,
		"SHOAL_ADDR="+e.api, "SHOAL_TOKEN="+e.secret, "SHOAL_CACERT="+e.ca,
		"PATH="+filepath.Dir(e.bin)+string(os.PathListSeparator)+os.Getenv("PATH"))

	// Clients stream completions through the published port (shoal-1's,
	// which restarts too) the whole time.
	st := &streamStats{other: map[string]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const clients = 3
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.streamUntil(stop, c, st)
		}()
	}
	stopStreams := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopStreams()
	waitFor(t, time.Minute, "the clients' first streams", func() error {
		if s := st.snapshot(); s.done < clients {
			return fmt.Errorf("%d streams done", s.done)
		}
		return nil
	})

	// The blocks replace the containers, and compose removes the old ones
	// with their logs: keep them for a failure.
	logDir := t.TempDir()
	for _, svc := range []string{"shoal-1", "shoal-2", "shoal-3"} {
		f, err := os.Create(filepath.Join(logDir, svc+".log"))
		if err != nil {
			t.Fatal(err)
		}
		follow := exec.Command("docker", "logs", "--follow", "--timestamps", e.container(t, svc))
		follow.Stdout, follow.Stderr = f, f
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = follow.Process.Kill()
			_ = follow.Wait()
			f.Close()
			if t.Failed() {
				b, _ := os.ReadFile(f.Name())
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("the logs of %s's container before the upgrade (last %d lines):\n%s", svc, min(len(lines), 40), strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		})
	}

	// Each block as a user would run it, traced; what they printed is
	// shown when the test fails.
	var ran strings.Builder
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the blocks of %s %q > %q and what they printed:\n%s", upgradeDoc, upgradeSection, upgradeSubsection, ran.String())
		}
	})
	t0 := time.Now()
	for i, b := range blocks {
		t1 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		c := exec.CommandContext(ctx, "bash", "-e", "-u", "-o", "pipefail", "-x", "-c", b)
		c.Dir = e.root
		c.Env = env
		out, err := c.CombinedOutput()
		cancel()
		fmt.Fprintf(&ran, "--- block %d (%.1f s, %v):\n%s--- printed:\n%s\n", i+1, time.Since(t1).Seconds(), err, b, out)
		if err != nil {
			t.Fatalf("block %d of %s %q > %q: %v", i+1, upgradeDoc, upgradeSection, upgradeSubsection, err)
		}
		t.Logf("MEASURED block %d of the README's compose upgrade: %.1f s", i+1, time.Since(t1).Seconds())
	}
	upgraded := time.Since(t0)
	stopStreams()

	s := st.snapshot()
	t.Logf("MEASURED rolling upgrade of 3 nodes by the README's compose blocks: %.1f s; meanwhile %d clients started %d streams, %d ended with [DONE]; refused: %d with 503, %d without a connection, other statuses %v",
		upgraded.Seconds(), clients, s.started, s.done, s.unavailable, s.refused, s.other)
	for _, f := range s.failures {
		t.Errorf("a stream that started: %s", f)
	}
	if s.started == 0 || s.done != s.started {
		t.Errorf("%d streams started, %d ended with [DONE]", s.started, s.done)
	}
	if len(s.other) > 0 {
		t.Errorf("requests refused with statuses other than 503: %v (first: %s)", s.other, s.firstOther)
	}

	// Every node alive, as the same node, on the new release and image.
	nodes := e.nodes(t)
	if len(nodes) != 3 {
		t.Errorf("%d nodes after the upgrade, want 3", len(nodes))
	}
	for _, n := range nodes {
		if n.Status != "alive" || n.Draining || n.ID != before[n.Name] || n.Version != build.Version {
			t.Errorf("%s after the upgrade: status %s, draining %v, id %s (before %s), version %q (want %q)",
				n.Name, n.Status, n.Draining, n.ID, before[n.Name], n.Version, build.Version)
		}
	}
	for _, svc := range []string{"shoal-1", "shoal-2", "shoal-3"} {
		id := e.container(t, svc)
		img, err := exec.Command("docker", "inspect", id, "--format", "{{.Config.Image}} {{.State.Status}}").Output()
		if got := strings.TrimSpace(string(img)); err != nil || got != next+" running" {
			t.Errorf("%s's container %.12s: %q %v, want %q", svc, id, got, err, next+" running")
		}
	}
	t2 := time.Now()
	waitFor(t, time.Minute, "a chat completion after the upgrade", chat)
	t.Logf("MEASURED a completion %.1f s after the upgrade's last block", time.Since(t2).Seconds())
}

type composeNode struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Status   string `json:"status"`
	Draining bool   `json:"draining"`
	Version  string `json:"version"`
	Protocol int    `json:"protocol"`
}

// nodes is shoal node ls -o json, as the operator's CLI prints it.
func (e *composeEnv) nodes(t *testing.T) []composeNode {
	t.Helper()
	out, err := e.shoal("node", "ls", "-o", "json")
	if err != nil {
		t.Fatalf("shoal node ls: %v\n%s", err, out)
	}
	var nodes []composeNode
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("shoal node ls -o json: %v\n%s", err, out)
	}
	return nodes
}

// streamStats counts what the streaming clients saw.
type streamStats struct {
	mu          sync.Mutex
	started     int // answered 200
	done        int // of those, ended with [DONE] and no error event
	unavailable int // answered 503
	refused     int // no response: connection refused or reset
	other       map[string]int
	firstOther  string
	failures    []string
}

func (s *streamStats) snapshot() streamStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return streamStats{started: s.started, done: s.done, unavailable: s.unavailable, refused: s.refused,
		other: maps.Clone(s.other), firstOther: s.firstOther, failures: slices.Clone(s.failures)}
}

func (s *streamStats) add(f func(s *streamStats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// streamUntil streams completions one after the other until stop closes
// (at most 20 minutes), trying again after a request that got 503 or no
// connection.
func (e *composeEnv) streamUntil(stop <-chan struct{}, client int, st *streamStats) {
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(e.ca); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Minute)
	for n := 0; time.Now().Before(deadline); n++ {
		select {
		case <-stop:
			return
		default:
		}
		if !e.stream(hc, client, n, st) {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// stream makes one streaming chat completion; false when it did not start.
func (e *composeEnv) stream(hc *http.Client, client, n int, st *streamStats) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := fmt.Sprintf(`{"model":"builtin","stream":true,"max_tokens":32,"messages":[{"role":"user","content":"client %d, request %d: hello during the upgrade"}]}`, client, n)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.api+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		st.add(func(s *streamStats) { s.refused++ })
		return false
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		_, _ = io.Copy(io.Discard, resp.Body)
		st.add(func(s *streamStats) { s.unavailable++ })
		return false
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		st.add(func(s *streamStats) {
			s.other[resp.Status]++
			if s.firstOther == "" {
				s.firstOther = fmt.Sprintf("%s at %s: %s", resp.Status, time.Now().UTC().Format("15:04:05.000"), b)
			}
		})
		return false
	}
	st.add(func(s *streamStats) { s.started++ })
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	chunks, done, problem := 0, false, ""
	for sc.Scan() {
		line := sc.Text()
		if ev, ok := strings.CutPrefix(line, "event:"); ok && strings.TrimSpace(ev) == "error" {
			problem = "an error event"
			continue
		}
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		switch {
		case done:
			problem = "data after [DONE]: " + data
		case data == "[DONE]":
			done = true
		case strings.HasPrefix(data, `{"error"`):
			problem = "an error event: " + data
		default:
			chunks++
		}
	}
	switch {
	case sc.Err() != nil:
		problem = fmt.Sprintf("reading it after %d chunks: %v", chunks, sc.Err())
	case problem == "" && !done:
		problem = fmt.Sprintf("it ended after %d chunks without [DONE]", chunks)
	case problem == "" && chunks == 0:
		problem = "[DONE] without a chunk"
	}
	if problem != "" {
		st.add(func(s *streamStats) {
			s.failures = append(s.failures, fmt.Sprintf("client %d request %d at %s: %s", client, n, time.Now().UTC().Format("15:04:05.000"), problem))
		})
		return true
	}
	st.add(func(s *streamStats) { s.done++ })
	return true
}

var (
	mdHeadingRE = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*$`)
	mdFenceRE   = regexp.MustCompile("^([ \t]*)(```+|~~~+)[ \t]*([^ \t`]*)")
)

// markdownBlocks is the body of every fenced block of language lang under
// the level-2 heading section, in its subsection sub (a deeper heading),
// up to the next heading of sub's level or higher. Headings inside fenced
// blocks are not headings; the blocks of a list item lose its indent.
func markdownBlocks(src, section, sub, lang string) ([]string, error) {
	lines := strings.Split(src, "\n")
	var blocks []string
	secLevel, subLevel := 0, 0 // of the headings we are under; 0: not under one
	foundSec, foundSub := false, false
	for i := 0; i < len(lines); i++ {
		if m := mdFenceRE.FindStringSubmatch(lines[i]); m != nil {
			start, indent, fence, info := i+1, m[1], m[2], m[3]
			var body []string
			closed := false
			for i++; i < len(lines); i++ {
				l := strings.TrimSpace(lines[i])
				if strings.HasPrefix(l, fence) && strings.Trim(l, fence[:1]) == "" {
					closed = true
					break
				}
				body = append(body, strings.TrimPrefix(lines[i], indent))
			}
			if !closed {
				return nil, fmt.Errorf("line %d: a fenced block that is never closed", start)
			}
			if subLevel > 0 && info == lang {
				blocks = append(blocks, strings.Join(body, "\n")+"\n")
			}
			continue
		}
		m := mdHeadingRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		level, text := len(m[1]), strings.TrimSpace(strings.TrimRight(m[2], "#"))
		if subLevel > 0 && level <= subLevel {
			subLevel = 0
		}
		if secLevel > 0 && level <= secLevel {
			secLevel = 0
		}
		switch {
		case secLevel == 0 && level == 2 && text == section:
			if foundSec {
				return nil, fmt.Errorf("line %d: a second heading %q", i+1, section)
			}
			secLevel, foundSec = level, true
		case secLevel > 0 && subLevel == 0 && level > secLevel && text == sub:
			if foundSub {
				return nil, fmt.Errorf("line %d: a second heading %q under %q", i+1, sub, section)
			}
			subLevel, foundSub = level, true
		}
	}
	switch {
	case !foundSec:
		return nil, fmt.Errorf("no heading \"## %s\"", section)
	case !foundSub:
		return nil, fmt.Errorf("no heading %q under \"## %s\"", sub, section)
	case len(blocks) == 0:
		return nil, fmt.Errorf("no %s block under %q > %q", lang, section, sub)
	}
	return blocks, nil
}

// TestMarkdownBlocks checks the parser on a sample, and that the README's
// compose upgrade is there to run (no Docker needed).
func TestMarkdownBlocks(t *testing.T) {
	sample := "# Title\n\n## Docker compose\n\n```sh\nwrong section\n```\n\n## Rolling upgrades\n\n```sh\nnot in the subsection\n```\n\n" +
		"### systemd\n\n```sh\nsystemd\n```\n\n### Docker compose\n\n```sh\none\n# not a heading\n```\n\n```\nplain, not run\n```\n\n" +
		"1. a list item\n\n   ```sh\n   two\n   ```\n\n#### deeper\n\n~~~sh\nthree\n~~~\n\n### Kubernetes\n\n```sh\nkubectl\n```\n\n## Next\n\n```sh\nafter\n```\n"
	got, err := markdownBlocks(sample, "Rolling upgrades", "Docker compose", "sh")
	if want := []string{"one\n# not a heading\n", "two\n", "three\n"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("markdownBlocks = %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"## Rolling upgrades\n\n### Docker compose\n\n```sh\nnever closed\n", "## Rolling upgrades\n\n### systemd\n", "## Other\n"} {
		if _, err := markdownBlocks(bad, "Rolling upgrades", "Docker compose", "sh"); err == nil {
			t.Errorf("markdownBlocks(%q) gave no error", bad)
		}
	}

	src, err := os.ReadFile(upgradeDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := markdownBlocks(string(src), upgradeSection, upgradeSubsection, "sh")
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(blocks, "")
	for _, want := range []string{"upgrade-check", "shoal node drain", "up -d --no-deps", "shoal node undrain", "$SHOAL_IMAGE"} {
		if !strings.Contains(all, want) {
			t.Errorf("the README's compose upgrade blocks do not run %q", want)
		}
	}
	for _, b := range blocks {
		out, err := exec.Command("bash", "-n", "-c", b).CombinedOutput()
		if err != nil {
			t.Errorf("bash -n: %v %s\n%s", err, out, b)
		}
		if strings.Contains(b, "while ") || strings.Contains(b, "until ") {
			t.Errorf("a block with an unbounded loop (the test runs it; loop over seq instead):\n%s", b)
		}
	}
}
