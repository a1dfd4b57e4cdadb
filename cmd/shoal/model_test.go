package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/api"
	tc "shoal/node/nodetest"
)

// TestModelCommands drives model load/ls/unload and placement show against
// a one-agent cluster, errors included.
func TestModelCommands(t *testing.T) {
	dir := t.TempDir()
	path := genModel(t, dir)
	c := tc.New(t, 1)
	tc.Eventually(t, 15*time.Second, "a leader", func() bool {
		s, err := c.Client(0, "").Status(t.Context())
		return err == nil && s.Leader != "" && s.NodesAlive == 1
	})
	flags := []string{"--addr", c.Members[0].Agent.HTTPAddr(), "--token", tc.Secret}
	run := func(args ...string) (string, error) { return execute(t, "", append(args, flags...)...) }

	if _, err := run("model", "load", filepath.Join(dir, "missing.gguf")); err == nil || !strings.Contains(err.Error(), "file not found") {
		t.Errorf("missing file: %v", err)
	}
	notGGUF := filepath.Join(dir, "notes.gguf")
	os.WriteFile(notGGUF, []byte("hello, not a model"), 0o644)
	if _, err := run("model", "load", notGGUF); err == nil || !strings.Contains(err.Error(), "not a GGUF") {
		t.Errorf("not a GGUF: %v", err)
	}
	if _, err := run("model", "load", path, "--max-seqs", "-1"); err == nil || !strings.Contains(err.Error(), "--max-seqs") {
		t.Errorf("negative --max-seqs: %v", err)
	}
	if _, err := run("model", "load", path, "--replicas", "-1"); err == nil || !strings.Contains(err.Error(), "--replicas") {
		t.Errorf("negative --replicas: %v", err)
	}
	out, err := run("model", "load", path, "--name", "tiny", "--ctx", "512", "--max-seqs", "4", "--queue", "2", "--overhead", "16MiB", "--wait", "30s")
	if err != nil || !strings.Contains(out, "model tiny is ready") {
		t.Fatalf("load: %q %v", out, err)
	}
	out, err = run("model", "ls")
	t.Logf("shoal model ls:\n%s", out)
	if err != nil || !strings.Contains(out, "tiny") || !strings.Contains(out, "ready") || !strings.Contains(out, "[0,2)") ||
		!strings.Contains(out, "COPIES") || !strings.Contains(out, "1/2") {
		t.Errorf("ls: %q %v", out, err)
	}
	out, err = run("model", "ls", "--json")
	var ms []api.ModelInfo
	if err != nil || json.Unmarshal([]byte(out), &ms) != nil || len(ms) != 1 || ms[0].Status != "ready" || ms[0].Shards[0].Source != "local" ||
		ms[0].Replicas != 2 || ms[0].Copies != 1 || len(ms[0].Holders) != 1 || !ms[0].Holders[0].Source {
		t.Errorf("ls --json: %q %v", out, err)
	}
	t.Logf("shoal model ls:\n%s", out)
	out, err = run("placement", "show", "tiny")
	t.Logf("shoal placement show tiny:\n%s", out)
	if err != nil || !strings.Contains(out, "predicted") || !strings.Contains(out, "server-0") || !strings.Contains(out, "compute") ||
		!strings.Contains(out, "context 512 x 4 sequence(s) (max-seqs), queue 2, KV reserved") {
		t.Errorf("placement show: %q %v", out, err)
	}
	out, err = run("placement", "show", "tiny", "-o", "json")
	var p api.PlacementInfo
	if err != nil || json.Unmarshal([]byte(out), &p) != nil || len(p.Stages) != 1 || p.Cost.MsPerToken <= 0 ||
		p.Replicas != 2 || len(p.Holders) != 1 || p.Holders[0].NodeName != "server-0" {
		t.Errorf("placement show -o json: %q %v", out, err)
	}
	// The plan reserves KV for 4 sequences of 512 tokens, counted in the
	// node's memory.
	if p.Context != 512 || p.Batch != 4 || p.Queue != 2 || len(p.Nodes) != 1 || p.KVBytes == 0 ||
		p.Nodes[0].KVBytes != p.KVBytes || p.Stages[0].Members[0].KVBytes != p.KVBytes || p.Nodes[0].MemBytes <= p.KVBytes {
		t.Errorf("placement show -o json: context %d batch %d queue %d KV %d, nodes %+v", p.Context, p.Batch, p.Queue, p.KVBytes, p.Nodes)
	}
	if _, err := run("placement", "show", "nope"); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := run("model", "unload", "nope"); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("unload unknown: %v", err)
	}
	if out, err := run("model", "unload", "tiny"); err != nil || !strings.Contains(out, "unloaded") {
		t.Errorf("unload: %q %v", out, err)
	}
	if out, err := run("model", "ls"); err != nil || !strings.Contains(out, "no models") {
		t.Errorf("ls after unload: %q %v", out, err)
	}
	for _, args := range [][]string{{"model", "load", "--help"}, {"placement", "show", "--help"}, {"model", "ls", "--help"}, {"model", "unload", "--help"}} {
		if out, err := execute(t, "", args...); err != nil || !strings.Contains(out, "shoal ") {
			t.Errorf("%v: %q %v", args, out, err)
		}
	}
}

// TestPrintFileHolders: model ls counts the live copies of each model's
// file against those wanted and lists the nodes with it; placement show
// lists them too.
func TestPrintFileHolders(t *testing.T) {
	holders := []api.FileHolder{
		{NodeName: "a", NodeStatus: "failed", Source: true, State: "ready"},
		{NodeName: "b", NodeStatus: "alive", State: "ready"},
		{NodeName: "c", NodeStatus: "alive", State: "no-room", Error: "a copy needs 1 GiB"},
		{NodeName: "d", NodeStatus: "alive", State: "failed", Error: "sha256 mismatch"},
	}
	var b strings.Builder
	printModels(&b, []api.ModelInfo{{Name: "m", Status: "ready", SourceName: "a", Replicas: 2, Copies: 1, Holders: holders,
		Shards: []api.ShardInfo{{NodeName: "b", Lo: 0, Hi: 2, State: "ready"}},
		Draft:  &api.DraftInfo{Path: "/models/small.gguf", Bytes: 3 << 20, Layers: 1, Max: 6, NodeName: "b", State: "ready"}}})
	out := b.String()
	t.Logf("model ls:\n%s", out)
	for _, want := range []string{
		"m: file on a (source, failed node), b (copy), c (no-room), d (copy failed: sha256 mismatch)",
		"m: drafts with /models/small.gguf (3.0 MiB, 1 layers, up to 6 tokens a step, ready on b)",
	} {
		if !strings.Contains(out, "COPIES") || !strings.Contains(out, "1/2") || !strings.Contains(out, want) {
			t.Errorf("model ls without %q:\n%s", want, out)
		}
	}
	b.Reset()
	printPlacement(&b, &api.PlacementInfo{Model: "m", Status: "ready", Version: 2, Replicas: 2, Holders: holders,
		Stages: []api.PlacementStage{{Lo: 0, Hi: 2, Members: []api.PlacementMember{{NodeName: "b", TPSize: 1}}}}})
	if out := b.String(); !strings.Contains(out, "file (2 live node(s) wanted): a (source, failed node), b (copy)") {
		t.Errorf("placement show:\n%s", out)
	}
}

// TestRunsOn: 'model load --nodes' waits for a plan on exactly those nodes
// (by name or ID): a model loaded again with other nodes is ready on its
// previous plan until the leader plans it anew.
func TestRunsOn(t *testing.T) {
	m := &api.ModelInfo{Shards: []api.ShardInfo{{Node: "id-1", NodeName: "node-1"}, {Node: "id-2", NodeName: "node-2"}}}
	for _, tc := range []struct {
		on   []string
		want bool
	}{
		{nil, true},
		{[]string{"node-2", "node-1"}, true},
		{[]string{"id-1", "node-2"}, true},
		{[]string{"node-1"}, false},
		{[]string{"node-1", "node-2", "node-3"}, false},
		{[]string{"node-1", "node-3"}, false},
	} {
		if got := runsOn(m, tc.on); got != tc.want {
			t.Errorf("runsOn(%v) = %v, want %v", tc.on, got, tc.want)
		}
	}
}
