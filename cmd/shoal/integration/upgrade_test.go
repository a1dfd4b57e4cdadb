//go:build integration

package integration

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"shoal/internal/version"
)

// oldCommit is the earlier commit of main the mixed-version test builds:
// the last before protocols were named (its agents speak protocol 1, offer
// only ALPN shoal/1, write Raft entries and snapshots without a protocol),
// with the two changes a rolling upgrade from it needs: its config file
// can ask Raft for early snapshots (so the test has an old snapshot to
// restore), and a driver whose model moves away finishes its streams
// instead of cutting them (without it, draining a node that drives a
// model ends the streams it carries, whatever the release after it does).
// Move it forward to the release before the current one when a release
// drops protocol 1.
const oldCommit = "741b30c99911dda75b095c6059b34658f4d40fe7"

// buildOld builds cmd/shoal of oldCommit from the repository's history
// into dir; it skips the test when the history is not here (a shallow
// clone).
func buildOld(t *testing.T, dir string) string {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", oldCommit+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("commit %s is not in this clone's history (a shallow clone?): %v %s", oldCommit[:12], err, out)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", root, oldCommit, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v %s", oldCommit[:12], err, out)
	}
	bin := filepath.Join(dir, "shoal-old")
	t0 := time.Now()
	build := exec.Command("go", "build", "-o", bin, "./cmd/shoal")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", oldCommit[:12], err, out)
	}
	t.Logf("MEASURED built the old binary (%s) in %v", oldCommit[:12], time.Since(t0).Round(time.Second))
	return bin
}

// TestMixedVersionUpgrade (#41): a cluster of two releases (the old
// commit's binary on two servers, this one on the third server and a
// client) serves a model spread over both; then every node is upgraded
// (or restarted) one at a time in the order shoal upgrade-check gives
// (drain, SIGTERM, this binary on the same data dir, undrain) while four
// clients stream completions: every stream that starts completes without
// an error event, through members and drivers that move; afterwards the Raft state
// (nodes, tokens, the model and its plan) is intact, the cluster records
// this build's protocol, shoal upgrade-check says it can take the next release, and
// each upgraded server started from a snapshot the old release wrote.
func TestMixedVersionUpgrade(t *testing.T) {
	e := setup(t, 5)
	old := buildOld(t, e.dir)
	servers, client, box := e.nodes[:3], e.nodes[3], e.nodes[4]
	client.name, box.name = "c3", "box"
	f := &faultEnv{env: e, box: box}

	model := filepath.Join(e.dir, "spread.gguf")
	if out, err := runIn(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "256", "--n-layer", "8",
		"--n-head", "4", "--n-head-kv", "2", "--n-ff", "768", "--vocab-size", "512", "--ctx", "2048", "--seed", "5", "-q", "--out", model); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	// Raft snapshots early (every 32 entries, looked at every 2-4 s), so
	// the old servers have written one before they are upgraded.
	cfg := filepath.Join(e.dir, "agent.json")
	if err := os.WriteFile(cfg, []byte(`{"tuning": {"snapshot_threshold": 32, "snapshot_interval": "2s"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	const memLimit = "12MiB" // the model needs two nodes
	for i, p := range servers {
		p.args = append(p.args, "--memory-limit", memLimit, "--threads", "1", "--config", cfg)
		if i < 2 {
			p.bin = old
		}
		e.start(p)
	}
	e.waitHealthy(servers[0], 3, 90*time.Second)
	join := f.token(t, servers[0], "--description", "upgrade client")
	client.args = []string{"agent", "--name", client.name, "--data-dir", client.dir, "--bind", client.ip, "--join", servers[2].ip,
		"--token", join, "--memory-limit", memLimit, "--threads", "1", "--config", cfg, "--log-level", "info"}
	e.start(client)
	e.waitHealthy(servers[0], 4, 60*time.Second)
	f.key = f.token(t, servers[0], "--kind", "inference", "--description", "upgrade streams")
	f.ca = filepath.Join(servers[0].dir, "tls", "https-ca.pem")
	f.refreshIDs(t, servers[0])

	// What each node runs, as gossip says it (shoal members of an agent
	// of this release): a leader of the old release keeps no protocol in
	// the state, so node ls shows protocol 1 for every node until a
	// leader of this release has registered them again.
	versions := func() map[string]nodeVersionInfo {
		t.Helper()
		var ns []nodeVersionInfo
		var err error
		for _, p := range e.nodes[:4] {
			if p.cmd == nil || p.bin != "" {
				continue // stopped, or of the old release
			}
			if err = e.cli(p, &ns, "members"); err == nil {
				break
			}
		}
		if err != nil || len(ns) == 0 {
			t.Fatalf("no agent of this release answers shoal members: %v", err)
		}
		out := map[string]nodeVersionInfo{}
		for _, n := range ns {
			out[n.Name] = n
		}
		return out
	}
	vs := versions()
	oldVersion, newVersion := vs[servers[0].name].Version, vs[servers[2].name].Version
	t.Logf("MEASURED mixed cluster: %s", describeVersions(vs))
	if oldVersion == newVersion || vs[servers[2].name].Protocol != version.Protocol || vs[servers[0].name].Protocol != 1 {
		t.Fatalf("the cluster is not of two releases: %s", describeVersions(vs))
	}

	// The model spreads over an old and a new node: the other two are
	// drained while it is planned.
	for _, p := range []*proc{servers[1], client} {
		if err := e.cli(servers[0], nil, "node", "drain", p.name); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.cli(servers[0], nil, "model", "load", model, "--name", "spread", "--ctx", "700", "--max-seqs", "4", "--overhead", "1MiB",
		"--strategy", "pipeline", "--wait", "180s"); err != nil {
		t.Fatal(err)
	}
	pl := f.waitServed(t, servers[0], 180*time.Second)
	inPlan := append([]string{pl.driver}, pl.members...)
	if !slices.Contains(inPlan, f.ids[servers[0].name]) || !slices.Contains(inPlan, f.ids[servers[2].name]) {
		t.Fatalf("the plan (driver %s, members %v) is not spread over %s (old) and %s (new): %v", pl.driver, pl.members, servers[0].name, servers[2].name, f.ids)
	}
	for _, p := range []*proc{servers[1], client} {
		if err := e.cli(servers[0], nil, "node", "undrain", p.name); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("MEASURED plan v%d spread over an old and a new node", pl.version)
	if code, body := f.chat(f.entry(pl), 8); code != 200 {
		t.Fatalf("a completion through the mixed plan: %d %s", code, body)
	}

	// The old servers write a snapshot of their own before they go.
	for i := 0; ; i++ {
		a, b := snapshotsOf(servers[0]), snapshotsOf(servers[1])
		if len(a) > 0 && len(b) > 0 {
			t.Logf("MEASURED the old servers wrote snapshots after %d extra commands: %s %v, %s %v", i, servers[0].name, a, servers[1].name, b)
			break
		}
		if i == 200 {
			t.Fatalf("no snapshot from the old servers after 200 commands: %v %v", a, b)
		}
		_ = f.token(t, servers[2], "--description", fmt.Sprintf("filler %d", i))
		time.Sleep(100 * time.Millisecond)
	}
	before := stateOf(t, f)

	// Four clients stream, one request after another, through every
	// agent in turn, until the upgrade is done.
	stop := make(chan struct{})
	var hosts sync.Map
	for _, p := range e.nodes[:4] {
		hosts.Store(p.ip, true)
	}
	var wg sync.WaitGroup
	res := make([]upgradeStreams, 4)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = f.streamUntil(t, i, e.nodes[:4], &hosts, stop)
		}()
	}

	// The order shoal upgrade-check gives (clients, followers, the leader
	// last), for a release that works with protocol 1: every node in
	// turn, the old ones to this release, the others restarted on it.
	var check struct {
		Ready bool     `json:"ready"`
		Order []string `json:"order"`
	}
	if err := e.cli(servers[2], &check, "upgrade-check", "--min-protocol", "1"); err != nil || !check.Ready || len(check.Order) != 4 {
		t.Fatalf("upgrade-check --min-protocol 1 on the mixed cluster: %+v %v", check, err)
	}
	t.Logf("MEASURED upgrade-check's order: %v", check.Order)
	byName := map[string]*proc{}
	for _, p := range e.nodes[:4] {
		byName[p.name] = p
	}
	t0 := time.Now()
	moves, drivers := 0, 0
	for _, name := range check.Order {
		p := byName[name]
		step := time.Now()
		cur := f.waitServed(t, f.alive(t), 120*time.Second)
		inPlan, drives := slices.Contains(append([]string{cur.driver}, cur.members...), f.ids[p.name]), cur.driver == f.ids[p.name]
		if err := e.cli(f.alive(t), nil, "node", "drain", p.name); err != nil {
			t.Fatal(err)
		}
		// The plan moves off the node before it stops.
		for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			cur := f.waitServed(t, f.alive(t), 120*time.Second)
			if cur.driver != f.ids[p.name] && !slices.Contains(cur.members, f.ids[p.name]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the plan still uses drained %s after 120 s", p.name)
			}
		}
		hosts.Store(p.ip, false)
		stopDraining(t, p) // drains the requests in flight at it, leaves, exits
		wasOld := p.bin == old
		p.bin = ""
		e.start(p)
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if n := versions()[p.name]; n.Version == newVersion && n.Protocol == version.Protocol && n.Status == "alive" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is not listed alive with %s 90 s after its restart: %+v", p.name, newVersion, versions()[p.name])
			}
		}
		if err := e.cli(f.alive(t), nil, "node", "undrain", p.name); err != nil {
			t.Fatal(err)
		}
		hosts.Store(p.ip, true)
		if wasOld {
			logb, _ := os.ReadFile(filepath.Join(e.dir, p.name+".log"))
			if !strings.Contains(string(logb), `restored a snapshot`) || !strings.Contains(string(logb), `"written_by": "protocol 1"`) {
				t.Errorf("%s did not start from the snapshot its old release wrote (no \"restored a snapshot\" written by protocol 1 in its log)", p.name)
			}
		}
		if inPlan {
			moves++
		}
		if drives {
			drivers++
		}
		t.Logf("MEASURED upgraded %s (old release: %v, in the plan: %v, its driver: %v) in %v", p.name, wasOld, inPlan, drives, time.Since(step).Round(time.Second))
		time.Sleep(3 * time.Second) // streams run on the upgraded node too
	}
	// Then the driver moves under the streams on this release too: the
	// node that drives now is drained, and undrained once the plan has
	// moved (the order above moves it only when it meets the driver).
	{
		cur := f.waitServed(t, f.alive(t), 120*time.Second)
		var p *proc
		for _, q := range e.nodes[:4] {
			if f.ids[q.name] == cur.driver {
				p = q
			}
		}
		if p == nil {
			t.Fatalf("no agent drives the plan (driver %s)", cur.driver)
		}
		if err := e.cli(f.alive(t), nil, "node", "drain", p.name); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if now := f.waitServed(t, f.alive(t), 120*time.Second); now.driver != f.ids[p.name] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the plan is still driven by drained %s after 120 s", p.name)
			}
		}
		time.Sleep(3 * time.Second) // the moved driver finishes its streams
		if err := e.cli(f.alive(t), nil, "node", "undrain", p.name); err != nil {
			t.Fatal(err)
		}
		drivers++
		t.Logf("MEASURED drained %s, which drove the plan, under the streams; the plan moved its driver", p.name)
	}
	close(stop)
	wg.Wait()
	t.Logf("MEASURED rolling upgrade of the 4 nodes took %v: %d of them were in the plan when drained, %d drove it", time.Since(t0).Round(time.Second), moves, drivers)
	if moves == 0 {
		t.Error("no node was in the plan when it was drained: the upgrade moved nothing under the streams")
	}

	total, refused := 0, 0
	for i, r := range res {
		total += r.complete
		refused += r.refused
		t.Logf("MEASURED client %d: %d streams complete, %d requests refused before a stream began (retried elsewhere)", i, r.complete, r.refused)
		for _, b := range r.bad {
			t.Error(b)
		}
		if r.complete == 0 {
			t.Errorf("client %d completed no stream", i)
		}
	}
	t.Logf("MEASURED %d streams completed during the upgrade, %d refused requests retried", total, refused)

	// Afterwards: every node of this release, in the state too, and the
	// state intact.
	var ns []nodeVersionInfo
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		if err := e.cli(f.alive(t), &ns, "node", "ls"); err != nil {
			t.Fatal(err)
		}
		vs = map[string]nodeVersionInfo{}
		ok := len(ns) == 4
		for _, n := range ns {
			vs[n.Name] = n
			ok = ok && n.Version == newVersion && n.Protocol == version.Protocol && n.Status == "alive"
		}
		if ok || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("MEASURED upgraded cluster: %s", describeVersions(vs))
	for name, n := range vs {
		if n.Version != newVersion || n.Protocol != version.Protocol || n.Status != "alive" {
			t.Errorf("%s after the upgrade: %+v", name, n)
		}
	}
	f.waitServed(t, f.alive(t), 120*time.Second)
	after := stateOf(t, f)
	if !slices.Equal(before.tokens, after.tokens) {
		t.Errorf("tokens changed across the upgrade: %v -> %v", before.tokens, after.tokens)
	}
	if !slices.Equal(before.models, after.models) || !slices.Equal(before.nodes, after.nodes) {
		t.Errorf("the state changed across the upgrade: models %v -> %v, nodes %v -> %v", before.models, after.models, before.nodes, after.nodes)
	}
	f.waitServed(t, f.alive(t), 120*time.Second)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		var s struct {
			Protocol int `json:"protocol"`
		}
		if e.cli(f.alive(t), &s, "status") == nil && s.Protocol == version.Protocol {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster does not record protocol %d a minute after the upgrade: %+v", version.Protocol, s)
		}
	}
	var after2 struct {
		Ready    bool     `json:"ready"`
		Problems []string `json:"problems"`
	}
	if err := e.cli(f.alive(t), &after2, "upgrade-check"); err != nil || !after2.Ready {
		t.Errorf("upgrade-check after the upgrade: %+v %v", after2, err)
	}
}

// stopDraining stops p as its service manager would: SIGTERM, and the time
// its drain takes (--drain-timeout, 30 s, and a margin; env.kill gives 10
// s, then SIGKILL, which would cut the streams the drain lets finish).
func stopDraining(t *testing.T, p *proc) {
	t.Helper()
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t0 := time.Now()
	for p.cmd.ProcessState == nil && time.Since(t0) < 45*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	if p.cmd.ProcessState == nil {
		t.Errorf("%s did not exit 45 s after SIGTERM", p.name)
		_ = p.cmd.Process.Kill()
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("MEASURED %s drained and exited %v after SIGTERM", p.name, time.Since(t0).Round(time.Millisecond))
	p.cmd = nil
}

type nodeVersionInfo struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	Protocol int    `json:"protocol"`
	Status   string `json:"status"`
}

func describeVersions(vs map[string]nodeVersionInfo) string {
	var out []string
	for _, n := range vs {
		out = append(out, fmt.Sprintf("%s %s p%d %s", n.Name, n.Version, n.Protocol, n.Status))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// snapshotsOf lists the Raft snapshots in p's data dir.
func snapshotsOf(p *proc) []string {
	dirs, _ := filepath.Glob(filepath.Join(p.dir, "raft", "snapshots", "*"))
	var out []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "state.bin")); err == nil {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}

// clusterState is what the upgrade must keep: the tokens, the models
// with their status, the nodes (ID and name).
type clusterState struct {
	tokens, models, nodes []string
}

func stateOf(t *testing.T, f *faultEnv) clusterState {
	t.Helper()
	var s clusterState
	var toks []struct {
		ID      string `json:"id"`
		Kind    string `json:"kind"`
		Revoked bool   `json:"revoked"`
	}
	if err := f.cli(f.alive(t), &toks, "token", "ls"); err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		s.tokens = append(s.tokens, fmt.Sprintf("%s/%s/%v", tk.ID, tk.Kind, tk.Revoked))
	}
	var ms []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Digest string `json:"digest"`
	}
	if err := f.cli(f.alive(t), &ms, "model", "ls"); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		s.models = append(s.models, m.Name+"/"+m.Digest) // its status moves with its plan
	}
	var ns []nodeInfo
	if err := f.cli(f.alive(t), &ns, "node", "ls"); err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		s.nodes = append(s.nodes, n.ID+"/"+n.Name)
	}
	sort.Strings(s.tokens)
	sort.Strings(s.models)
	sort.Strings(s.nodes)
	return s
}

type upgradeStreams struct {
	complete, refused int
	bad               []string
}

// streamUntil streams completions, one after another, through the agents
// hosts marks up (in turn, starting at client i's), until stop closes. A
// request refused before its stream begins (the agent draining or
// stopped, 503, or not yet knowing the model's route, 404) goes to the
// next agent, as a client behind a load balancer sees it; a stream that
// began must end with [DONE] and no error event.
func (f *faultEnv) streamUntil(t *testing.T, i int, agents []*proc, hosts *sync.Map, stop <-chan struct{}) upgradeStreams {
	var r upgradeStreams
	for k := i; ; k++ {
		select {
		case <-stop:
			return r
		default:
		}
		if k-i > 2000 {
			return r
		}
		p := agents[k%len(agents)]
		if up, _ := hosts.Load(p.ip); up != true {
			continue
		}
		body := fmt.Sprintf(`{"model":"spread","stream":true,"messages":[{"role":"user","content":"upgrade %d/%d"}],"max_tokens":120,"temperature":0.7,"seed":%d}`, i, k, k)
		resp, cancel, err := f.post(p.ip, body, 2*time.Minute)
		if err != nil {
			cancel()
			r.refused++
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			cancel()
			if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusBadGateway {
				r.bad = append(r.bad, fmt.Sprintf("client %d: %s answered HTTP %d", i, p.name, resp.StatusCode))
			}
			r.refused++
			time.Sleep(200 * time.Millisecond)
			continue
		}
		done, errEvent, tokens := false, "", 0
		rd := bufio.NewReader(resp.Body)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				break
			}
			switch ev := sseLine(line); {
			case ev.done:
				done = true
			case ev.err != "":
				errEvent = ev.err
			case ev.token:
				tokens++
			}
		}
		resp.Body.Close()
		cancel()
		switch {
		case errEvent != "":
			r.bad = append(r.bad, fmt.Sprintf("client %d: the stream through %s ended with an error event after %d tokens: %s", i, p.name, tokens, errEvent))
		case !done:
			r.bad = append(r.bad, fmt.Sprintf("client %d: the stream through %s ended after %d tokens without [DONE]", i, p.name, tokens))
		default:
			r.complete++
		}
	}
}
