package localcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/node"
)

// Options describe the cluster.
type Options struct {
	Nodes    int    // agents (servers), 1 or more
	DataDir  string // holds the model, the secret and one folder per agent
	Model    string // model file; empty = the built-in model in DataDir
	BasePort int    // agent i listens on BasePort+10i (HTTP), +1 (QUIC), +2 (gossip)
	Binary   string // the shoal executable
	Log      io.Writer
}

// Cluster is a running local cluster.
type Cluster struct {
	opts   Options
	procs  []*exec.Cmd
	exited chan int
	Token  string // the cluster secret: the admin key of the CLI
	// InferenceKey calls the OpenAI endpoint and nothing else.
	InferenceKey string
	Endpoint     string // OpenAI-compatible base URL of the serving agent
	Model        string // the served model's name
	// HTTPSCA is the file of the cluster's HTTPS CA certificate (the
	// agents here bind loopback and serve plain HTTP; agents on a network
	// address serve HTTPS with certificates it signs).
	HTTPSCA string
}

// BuiltinModel is the file name of the model written on first use.
const BuiltinModel = "builtin-llama-q4_k.gguf"

// BuiltinSpec is the built-in model: a small llama with random weights in
// Q4_K and a byte-level BPE vocabulary, made by shoal (no download).
func BuiltinSpec() (synth.Spec, error) {
	v, err := tokenizer.ByteLevelVocab(2048)
	if err != nil {
		return synth.Spec{}, err
	}
	v.Pad(2048)
	return synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 4, NHead: 8, NHeadKV: 4, NFF: 768, Type: "q4_k", Seed: 1,
		Std: 0.02, Name: "shoal-builtin", Tokenizer: v.KVs()}, nil
}

// EnsureBuiltin writes the built-in model into dir if it is not there and
// returns its path.
func EnsureBuiltin(dir string) (string, error) {
	path := filepath.Join(dir, BuiltinModel)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	spec, err := BuiltinSpec()
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".builtin-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := synth.Write(tmp, spec, nil); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return path, os.Rename(tmp.Name(), path)
}

func (o *Options) port(i, off int) int { return o.BasePort + 10*i + off }

// secret reads the cluster secret from the data dir, creating it once.
func secret(dir string) (string, error) {
	p := filepath.Join(dir, "secret")
	if b, err := os.ReadFile(p); err == nil {
		if s := strings.TrimSpace(string(b)); len(s) >= 16 {
			return s, nil
		}
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	s := hex.EncodeToString(b)
	return s, os.WriteFile(p, []byte(s+"\n"), 0o600)
}

// Start brings the cluster up and waits until it serves the model.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.Nodes < 1 {
		return nil, fmt.Errorf("--nodes %d: want at least 1", o.Nodes)
	}
	if o.BasePort < 1024 || o.port(o.Nodes-1, 2) > 65535 {
		return nil, fmt.Errorf("--port %d: agents need ports %d..%d", o.BasePort, o.BasePort, o.port(o.Nodes-1, 2))
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, err
	}
	for i := 0; i < o.Nodes; i++ {
		for _, off := range []int{0, 2} {
			if err := portFree(o.port(i, off)); err != nil {
				return nil, fmt.Errorf("port %d is taken (%v): stop what uses it or pick another --port", o.port(i, off), err)
			}
		}
	}
	modelPath := o.Model
	if modelPath == "" {
		fmt.Fprintf(o.Log, "writing the built-in model to %s (first run only)\n", filepath.Join(o.DataDir, BuiltinModel))
		var err error
		if modelPath, err = EnsureBuiltin(o.DataDir); err != nil {
			return nil, fmt.Errorf("built-in model: %w", err)
		}
	}
	tok, err := secret(o.DataDir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, Token: tok, exited: make(chan int, o.Nodes)}
	c.Model = strings.TrimSuffix(filepath.Base(modelPath), ".gguf")
	c.Endpoint = fmt.Sprintf("http://127.0.0.1:%d/v1", o.port(0, 0))
	for i := 0; i < o.Nodes; i++ {
		if err := c.startAgent(i, modelPath); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.waitReady(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.ensureInferenceKey(ctx); err != nil {
		c.Stop()
		return nil, fmt.Errorf("inference key: %w", err)
	}
	if p := node.HTTPSCAPath(c.agentDir(0)); waitFile(p, 5*time.Second) {
		c.HTTPSCA = p
	}
	return c, nil
}

// ensureInferenceKey sets InferenceKey: the one kept in the data dir while
// the cluster still accepts it, else a new one made with the admin secret.
func (c *Cluster) ensureInferenceKey(ctx context.Context) error {
	p := filepath.Join(c.opts.DataDir, "inference-key")
	if b, err := os.ReadFile(p); err == nil {
		c.InferenceKey = strings.TrimSpace(string(b))
		var models json.RawMessage
		if c.get(ctx, c.Endpoint+"/models", &models, c.InferenceKey) == nil {
			return nil
		}
	}
	body := strings.NewReader(`{"kind":"inference","description":"shoal up: the OpenAI endpoint"}`)
	req, _ := http.NewRequestWithContext(ctx, "POST", c.Endpoint[:len(c.Endpoint)-len("/v1")]+"/v1/tokens", body)
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var tok struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || resp.StatusCode != 200 || tok.Token == "" {
		return fmt.Errorf("POST /v1/tokens: %s %v", resp.Status, err)
	}
	c.InferenceKey = tok.Token
	return os.WriteFile(p, []byte(tok.Token+"\n"), 0o600)
}

// waitFile reports whether path exists within d.
func waitFile(path string, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func portFree(p int) error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return err
	}
	return l.Close()
}

func (c *Cluster) agentDir(i int) string {
	return filepath.Join(c.opts.DataDir, fmt.Sprintf("node-%d", i+1))
}

func (c *Cluster) startAgent(i int, modelPath string) error {
	o := c.opts
	dir := c.agentDir(i)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	args := []string{"agent", "--server", "--bootstrap-expect", strconv.Itoa(o.Nodes),
		"--name", fmt.Sprintf("node-%d", i+1), "--data-dir", dir, "--bind", "127.0.0.1",
		"--http-port", strconv.Itoa(o.port(i, 0)), "--quic-port", strconv.Itoa(o.port(i, 1)),
		"--gossip-port", strconv.Itoa(o.port(i, 2)), "--log-level", "info"}
	for j := 0; j < o.Nodes; j++ {
		if j != i {
			args = append(args, "--join", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.port(j, 1))))
		}
	}
	if i == 0 {
		args = append(args, "--model", modelPath)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(o.Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "SHOAL_AGENT_TOKEN="+c.Token)
	// Its own process group: a terminal's Ctrl-C reaches only shoal up,
	// which then stops the agents in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start agent %d: %w", i+1, err)
	}
	c.procs = append(c.procs, cmd)
	go func() {
		cmd.Wait()
		logf.Close()
		c.exited <- i
	}()
	fmt.Fprintf(o.Log, "started node-%d (pid %d, http %d, log %s)\n", i+1, cmd.Process.Pid, o.port(i, 0), filepath.Join(dir, "agent.log"))
	return nil
}

// waitReady polls the serving agent until the cluster has a leader and the
// model is listed.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	base := fmt.Sprintf("http://127.0.0.1:%d", c.opts.port(0, 0))
	for {
		select {
		case i := <-c.exited:
			return fmt.Errorf("node-%d exited during start-up; its log:\n%s", i+1, c.LogTail(i, 15))
		case <-ctx.Done():
			return fmt.Errorf("the cluster was not ready within 90 s; node-1's log:\n%s", c.LogTail(0, 15))
		case <-time.After(300 * time.Millisecond):
		}
		var st struct {
			Leader     string `json:"leader"`
			NodesAlive int    `json:"nodes_alive"`
		}
		if c.get(ctx, base+"/v1/status", &st) != nil || st.Leader == "" || st.NodesAlive < c.opts.Nodes {
			continue
		}
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if c.get(ctx, base+"/v1/models", &models) == nil {
			for _, m := range models.Data {
				if m.ID == c.Model {
					return nil
				}
			}
		}
	}
}

// get reads url as JSON into v with the admin key, or with key if given.
func (c *Cluster) get(ctx context.Context, url string, v any, key ...string) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+append(key, c.Token)[0])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// LogTail returns the last n lines of agent i's log.
func (c *Cluster) LogTail(i, n int) string {
	b, _ := os.ReadFile(filepath.Join(c.agentDir(i), "agent.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Exited reports agents that stop on their own.
func (c *Cluster) Exited() <-chan int { return c.exited }

// Stop asks every agent to leave (SIGINT), waits up to 15 s, then kills
// what is left.
func (c *Cluster) Stop() error {
	alive := map[int]bool{}
	for i, p := range c.procs {
		if p.Process != nil && p.ProcessState == nil {
			alive[i] = true
			_ = p.Process.Signal(os.Interrupt)
		}
	}
	deadline := time.After(15 * time.Second)
	var errs []error
	for len(alive) > 0 {
		select {
		case i := <-c.exited:
			delete(alive, i)
		case <-deadline:
			for i := range alive {
				_ = c.procs[i].Process.Kill()
				errs = append(errs, fmt.Errorf("node-%d did not stop within 15 s and was killed", i+1))
			}
			return errors.Join(errs...)
		}
	}
	return nil
}
