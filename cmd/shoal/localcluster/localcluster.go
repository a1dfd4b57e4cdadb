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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"shoal/api"
	"shoal/coordinator"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/node"
)

// Options describe the cluster.
type Options struct {
	Nodes   int    // agents (servers), 1 or more
	DataDir string // holds the model, the secret and one folder per agent
	Model   string // model file; empty = the built-in model in DataDir
	// ModelName is the name the model is served under (default: the
	// file's name without .gguf); an agent given the model whole gets it
	// as a model of the store by this name.
	ModelName string
	BasePort  int    // agent i listens on BasePort+10i (HTTP), +1 (QUIC), +2 (gossip)
	Binary    string // the shoal executable
	Log       io.Writer
	// Spread runs the model across every agent, a plan pinned to all of
	// them and loaded through the cluster API (what 'shoal model load
	// --nodes' does), instead of whole on node-1 (its --model). It applies
	// with 2 or more agents to a model that has layers (not an encoder).
	Spread bool
	// Strategy is how a spread model is split: pipeline (the default: a
	// stage of layers per agent), tensor (every layer's heads split over
	// the agents) or auto (the planner chooses).
	Strategy string
}

// Cluster is a running local cluster.
type Cluster struct {
	opts   Options
	since  time.Time // when this run started its agents
	procs  []*exec.Cmd
	exited chan int
	Token  string // the cluster secret: the admin key of the CLI
	// InferenceKey calls the OpenAI endpoint and nothing else.
	InferenceKey string
	Endpoint     string // OpenAI-compatible base URL of the serving agent
	Model        string // the served model's name
	// Earlier are the other models the cluster serves: loaded by an
	// earlier run on the same data dir (the cluster state keeps them).
	Earlier []string
	// Layout says where the model's layers run, read back from its
	// committed plan: "pipeline, node-1 layers 0-1, node-2 layer 2, ...".
	Layout string
	// Fallback says why the plan does not run the model as asked (the
	// strategy or every agent), when it does not.
	Fallback string
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
	switch o.Strategy {
	case "", "pipeline", "tensor", "auto":
	default:
		return nil, fmt.Errorf("--strategy %q: want pipeline, tensor or auto", o.Strategy)
	}
	modelPath := o.Model
	if modelPath == "" {
		if _, err := os.Stat(filepath.Join(o.DataDir, BuiltinModel)); err != nil {
			fmt.Fprintf(o.Log, "writing the built-in model to %s (first run only)\n", filepath.Join(o.DataDir, BuiltinModel))
		}
		var err error
		if modelPath, err = EnsureBuiltin(o.DataDir); err != nil {
			return nil, fmt.Errorf("built-in model: %w", err)
		}
	}
	tok, err := secret(o.DataDir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, Token: tok, exited: make(chan int, o.Nodes), since: time.Now()}
	c.Model = strings.TrimSuffix(filepath.Base(modelPath), ".gguf")
	if o.ModelName != "" {
		c.Model = o.ModelName
	}
	c.Endpoint = fmt.Sprintf("http://127.0.0.1:%d/v1", o.port(0, 0))
	// The model runs on these nodes: every agent when spread (loaded
	// through the API once the cluster is up), else node-1 (its --model).
	var load *api.LoadModelRequest
	on := []string{"node-1"}
	if o.Spread && o.Nodes > 1 {
		req, ok, err := spreadRequest(modelPath, c.Model, o)
		if err != nil {
			return nil, err
		}
		if ok {
			load, on = req, req.Nodes
		}
	}
	if err := c.recoverVoters(); err != nil {
		return nil, err
	}
	for i := 0; i < o.Nodes; i++ {
		if err := c.startAgent(i, modelPath, i == 0 && load == nil); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.waitReady(ctx, load, on); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.ensureInferenceKey(ctx); err != nil {
		c.Stop()
		return nil, fmt.Errorf("inference key: %w", err)
	}
	if ms, err := api.NewClient(c.Endpoint[:len(c.Endpoint)-len("/v1")], c.Token).Models(ctx); err == nil {
		c.Earlier = Others(ms, c.Model)
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

// spreadRequest is the load request that runs the model at path on every
// agent: its name, the agents by name, the strategy, and a KV cache of the
// model's context (at most 8192 tokens, as an agent's --model) for 4
// sequences. ok is false for a model that cannot be spread (an encoder,
// which its agent serves whole).
func spreadRequest(path, name string, o Options) (*api.LoadModelRequest, bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, false, err
	}
	f, err := gguf.Open(abs)
	if err != nil {
		return nil, false, fmt.Errorf("model %s: %w", path, err)
	}
	defer f.Close()
	if model.IsEncoder(f) {
		return nil, false, nil
	}
	cfg, err := model.ConfigFromGGUF(f)
	if err != nil {
		return nil, false, fmt.Errorf("model %s: %w", path, err)
	}
	req := &api.LoadModelRequest{Path: abs, Name: name, Ctx: min(cfg.NCtx, 8192), MaxSeqs: 4, Strategy: o.Strategy}
	if req.Strategy == "" {
		req.Strategy = "pipeline"
	} else if req.Strategy == "auto" {
		req.Strategy = ""
	}
	for i := 0; i < o.Nodes; i++ {
		req.Nodes = append(req.Nodes, fmt.Sprintf("node-%d", i+1))
	}
	return req, true, nil
}

// recoverVoters makes a data dir whose Raft configuration names voters
// this run does not start (an earlier run had more nodes, or another node
// led and made node-1 a non-voter to keep the voter count odd), or whose
// nodes' configurations differ, start with one leader: without a majority
// of its voters the cluster would never elect one, and with differing
// configurations two could lead. Every started node that has Raft state
// gets a recovery file naming those nodes (coordinator.WriteRecovery);
// nodes without state join as the leader adds them.
func (c *Cluster) recoverVoters() error {
	o := c.opts
	type held struct {
		i  int
		id string
		st *coordinator.Stored
	}
	var hs []held
	started := map[string]bool{}
	for i := 0; i < o.Nodes; i++ {
		dir := c.agentDir(i)
		st, err := coordinator.ReadStored(dir)
		if err != nil {
			return fmt.Errorf("node-%d's cluster state in %s: %w", i+1, dir, err)
		}
		if st == nil {
			continue
		}
		id, err := node.NodeID(dir)
		if err != nil {
			return err
		}
		hs = append(hs, held{i, id, st})
		started[id] = true
	}
	var missing []string
	confs := map[string]bool{}
	for _, h := range hs {
		var key []string
		for _, s := range h.st.Servers {
			if s.Voter && !started[s.ID] && !slices.Contains(missing, s.ID) {
				missing = append(missing, s.ID)
			}
			key = append(key, fmt.Sprintf("%s:%v", s.ID, s.Voter))
		}
		slices.Sort(key)
		confs[strings.Join(key, ",")] = true
	}
	var why string
	switch {
	case len(missing) > 0:
		names := c.namesOf(missing)
		slices.Sort(names)
		why = "names voters this run does not start (" + strings.Join(names, ", ") + ")"
	case len(confs) > 1:
		// Nodes that sat out a run keep the configuration they last had:
		// two of them could elect each other on it and lead beside the
		// node that led without them.
		why = "differs among the nodes (some sat out the last run)"
	default:
		return nil
	}
	// The nodes with the most recent log become the voters, the rest
	// non-voters that the leader brings up to date and promotes: with all
	// of them voters, two that sat out a run could elect one of them on
	// its older log, and the others would take that log over their own.
	var entries []coordinator.RecoveryEntry
	var on, behind []string
	for _, h := range hs {
		latest := true
		for _, x := range hs {
			latest = latest && !x.st.After(h.st)
		}
		entries = append(entries, coordinator.RecoveryEntry{ID: h.id, Address: net.JoinHostPort("127.0.0.1", strconv.Itoa(o.port(h.i, 1))), NonVoter: !latest})
		if latest {
			on = append(on, fmt.Sprintf("node-%d", h.i+1))
		} else {
			behind = append(behind, fmt.Sprintf("node-%d", h.i+1))
		}
	}
	for _, h := range hs {
		if err := coordinator.WriteRecovery(c.agentDir(h.i), entries); err != nil {
			return fmt.Errorf("node-%d: %w", h.i+1, err)
		}
	}
	msg := fmt.Sprintf("the cluster state in %s %s; %s start as its voters", o.DataDir, why, strings.Join(on, ", "))
	if len(behind) > 0 {
		msg += fmt.Sprintf(" (the most recent state), %s as non-voters the leader promotes", strings.Join(behind, ", "))
	}
	fmt.Fprintln(o.Log, msg)
	return nil
}

// namesOf names node IDs by the data dir (node-N) that holds each, or
// the ID where none does.
func (c *Cluster) namesOf(ids []string) []string {
	byID := map[string]string{}
	dirs, _ := filepath.Glob(filepath.Join(c.opts.DataDir, "node-*", "node-id"))
	for _, p := range dirs {
		if b, err := os.ReadFile(p); err == nil {
			byID[string(b)] = filepath.Base(filepath.Dir(p))
		}
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id
		if n, ok := byID[id]; ok {
			out[i] = n
		}
	}
	return out
}

func (c *Cluster) startAgent(i int, modelPath string, whole bool) error {
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
	if whole && o.ModelName != "" {
		args = append(args, "--model", o.ModelName) // the store's model: served under its name
	} else if whole {
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

// waitReady polls the serving agent until the cluster has a leader, then
// loads the model when load is set, and waits until the model's plan runs
// it on exactly the nodes on, ready and settled, and the model is listed.
func (c *Cluster) waitReady(ctx context.Context, load *api.LoadModelRequest, on []string) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	base := fmt.Sprintf("http://127.0.0.1:%d", c.opts.port(0, 0))
	cl := api.NewClient(base, c.Token)
	err := c.poll(ctx, "a leader and every agent alive", func() (bool, error) {
		st, err := cl.Status(ctx)
		return err == nil && st.Leader != "" && st.NodesAlive >= c.opts.Nodes, nil
	})
	if err != nil {
		return err
	}
	if load != nil {
		fmt.Fprintf(c.opts.Log, "loading %s across %s (strategy %s)\n", c.Model, strings.Join(load.Nodes, ", "), orAuto(load.Strategy))
		err := c.poll(ctx, "the model load", func() (bool, error) {
			_, err := cl.LoadModel(ctx, *load)
			var ae *api.APIError
			if errors.As(err, &ae) && ae.Code >= 400 && ae.Code < 500 {
				return false, fmt.Errorf("loading %s across the agents: %w", c.Model, err)
			}
			return err == nil, nil
		})
		if err != nil {
			return err
		}
	}
	if err := c.settle(ctx, cl, on); err != nil {
		return err
	}
	return c.poll(ctx, "the model listed at "+c.Endpoint+"/models", func() (bool, error) {
		return c.listed(ctx), nil
	})
}

func orAuto(s string) string {
	if s == "" {
		return "auto"
	}
	return s
}

// settle waits until this run's registration of the model (not an
// earlier run's, still in the state) is ready on exactly the nodes on,
// and its plan stands: the links among those nodes measured (a plan made
// before they are is weighed again when they arrive, and may move; after
// 15 s without them it goes on) and the plan's version unchanged for a
// second.
// It sets Layout from the plan. A model the cluster does not list (an
// encoder its agent serves alone) has no plan: Layout stays empty.
func (c *Cluster) settle(ctx context.Context, cl *api.Client, on []string) error {
	var version uint64
	var since, readyAt time.Time
	return c.poll(ctx, "the model ready on "+strings.Join(on, ", "), func() (bool, error) {
		ms, err := cl.Models(ctx)
		if err != nil {
			return false, nil
		}
		var m *api.ModelInfo
		for i := range ms {
			if ms[i].Name == c.Model {
				m = &ms[i]
			}
		}
		if m == nil {
			return c.listed(ctx), nil // served but not planned: an encoder its agent serves alone
		}
		if m.CreatedAt.Before(c.since) {
			// An earlier run's registration, on its nodes (one of them
			// may be gone: unservable): this run's load or node-1's
			// --model replaces it in a moment.
			return false, nil
		}
		switch m.Status {
		case "unservable", "failed":
			return false, fmt.Errorf("model %s is %s: %s", c.Model, m.Status, m.Reason)
		case "ready":
		default:
			return false, nil
		}
		var nodes []string
		for _, s := range m.Shards {
			nodes = append(nodes, s.NodeName)
		}
		p, err := cl.Placement(ctx, c.Model)
		if err != nil || p.Version != m.PlanVersion {
			return false, nil
		}
		if p.Fallback != "" {
			// No plan on exactly those nodes fits (a model of fewer
			// layers than agents): the planner's own choice stands.
			on = nodes
		}
		if !sameSet(nodes, on) {
			return false, nil // an earlier plan, not yet weighed again
		}
		if readyAt.IsZero() {
			readyAt = time.Now()
		}
		if measured(p.Links, on) < len(on)*(len(on)-1) && time.Since(readyAt) < 15*time.Second {
			return false, nil
		}
		if p.Version != version {
			version, since = p.Version, time.Now()
			return false, nil
		}
		if time.Since(since) < time.Second {
			return false, nil
		}
		c.Layout, c.Fallback = Layout(p), p.Fallback
		return true, nil
	})
}

// Others are the names of the models ms lists besides name, sorted.
func Others(ms []api.ModelInfo, name string) []string {
	var out []string
	for _, m := range ms {
		if m.Name != name && !slices.Contains(out, m.Name) {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// listed says whether the OpenAI endpoint lists the model.
func (c *Cluster) listed(ctx context.Context) bool {
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if c.get(ctx, c.Endpoint+"/models", &models) == nil {
		for _, m := range models.Data {
			if m.ID == c.Model {
				return true
			}
		}
	}
	return false
}

// measured counts the links between two of the nodes on.
func measured(links []api.Link, on []string) int {
	n := 0
	for _, l := range links {
		if l.From != l.To && slices.Contains(on, l.From) && slices.Contains(on, l.To) {
			n++
		}
	}
	return n
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// Layout says in one line where a plan runs a model's layers: its strategy,
// then each stage, "node-1 layers 0-1" or, for a tensor-parallel group,
// "layers 0-3 over node-1 heads 0-3 + node-2 heads 4-7".
func Layout(p *api.PlacementInfo) string {
	parts := []string{p.Strategy}
	for _, st := range p.Stages {
		pool := ""
		if st.Pool == "prefill" || st.Pool == "decode" {
			pool = st.Pool + " "
		}
		layers := "layers " + span(st.Lo, st.Hi)
		if st.Hi-st.Lo == 1 {
			layers = "layer " + span(st.Lo, st.Hi)
		}
		if len(st.Members) == 1 {
			parts = append(parts, fmt.Sprintf("%s%s %s", pool, st.Members[0].NodeName, layers))
			continue
		}
		var ms []string
		for _, m := range st.Members {
			ms = append(ms, fmt.Sprintf("%s heads %s", m.NodeName, span(m.HeadLo, m.HeadHi)))
		}
		parts = append(parts, fmt.Sprintf("%s%s over %s", pool, layers, strings.Join(ms, " + ")))
	}
	return strings.Join(parts, ", ")
}

// span writes [lo,hi) as "lo-(hi-1)", or "lo" for one.
func span(lo, hi int) string {
	if hi-lo <= 1 {
		return strconv.Itoa(lo)
	}
	return fmt.Sprintf("%d-%d", lo, hi-1)
}

// poll calls ready every 300 ms until it is true or fails, an agent
// exits, or ctx ends.
func (c *Cluster) poll(ctx context.Context, what string, ready func() (bool, error)) error {
	for {
		select {
		case i := <-c.exited:
			return fmt.Errorf("node-%d exited during start-up; its log:\n%s", i+1, c.LogTail(i, 15))
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return ctx.Err()
			}
			return fmt.Errorf("the cluster was not ready within 90 s (waiting for %s); node-1's log:\n%s", what, c.LogTail(0, 15))
		case <-time.After(300 * time.Millisecond):
		}
		ok, err := ready()
		if err != nil || ok {
			return err
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
