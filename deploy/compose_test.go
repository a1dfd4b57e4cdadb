//go:build integration

package deploy_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// composeEnv is a compose project of the test's own: an image tag, a
// project name and an API port nobody else uses.
type composeEnv struct {
	t       *testing.T
	root    string // the repository
	bin     string // the host's shoal, the operator's CLI
	project string
	env     []string
	secret  string
	api     string
	ca      string
	client  *http.Client
}

// TestComposeCluster builds the image (FROM scratch, no registry), starts
// deploy/compose's three servers, waits for a leader, loads the built-in
// model, gets chat completions with the official OpenAI client, stops one
// container (SIGTERM: it drains and exits 0) and still gets completions,
// starts it again and sees it rejoin under its old identity, then tears
// everything down.
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
	e := &composeEnv{t: t, root: root, project: "shoaltest" + strconv.Itoa(os.Getpid())}
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
	if err := os.WriteFile(envFile, []byte("SHOAL_AGENT_TOKEN="+e.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	e.api = "https://127.0.0.1:" + port
	e.env = append(os.Environ(), "SHOAL_IMAGE="+image, "SHOAL_ENV_FILE="+envFile, "SHOAL_API_PORT="+port)
	composeFile := filepath.Join(root, "deploy", "compose", "compose.yaml")
	dc := func(timeout time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c := exec.CommandContext(ctx, compose, append([]string{"-p", e.project, "-f", composeFile}, args...)...)
		c.Env = e.env
		out, err := c.CombinedOutput()
		return string(out), err
	}
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
	container := func(service string) string {
		out, err := dc(time.Minute, "ps", "-q", service)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("no container for %s: %v %s", service, err, out)
		}
		return strings.TrimSpace(out)
	}

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
