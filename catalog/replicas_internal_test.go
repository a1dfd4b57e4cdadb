package catalog

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/engine/enginetest"
	"shoal/engine/synth"
	"shoal/shard"
)

// filePeers is a node with a model file (the bytes in data) and its
// manifest, as shard.Peers.
type filePeers struct {
	mu   sync.Mutex
	raw  []byte
	data []byte
}

func (p *filePeers) bytes() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.data
}

func (p *filePeers) Layout(context.Context, string, shard.ShardSpec) (*shard.Layout, error) {
	panic("not used")
}

func (p *filePeers) Holdings(context.Context, string, string) ([]byte, []shard.Range, error) {
	return p.raw, []shard.Range{{Off: 0, N: int64(len(p.bytes()))}}, nil
}

func (p *filePeers) Ranges(string) shard.RangeFetcher { return p }

func (p *filePeers) Fetch(_ context.Context, _ string, off, n int64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(p.bytes()[off : off+n])), nil
}

// TestReplicaVerifiedBeforeReported: a node chosen to copy a model file
// reports itself a holder only once the copy matched the manifest and the
// digest: bytes that fail leave no file and a failed report, and the next
// try with the right bytes registers the copy, which a restart keeps.
// A node without the disk says no-room; a copy no model has is removed,
// unless the state is older than the copy.
func TestReplicaVerifiedBeforeReported(t *testing.T) {
	path := enginetest.Write(t, "", synth.Spec{Name: "tiny", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q8_0", Seed: 3})
	sha, raw, err := shard.BuildManifest(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[len(bad)-100] ^= 0xff
	peers := &filePeers{raw: raw, data: bad}

	dir := t.TempDir()
	reg := openFileRegistry(dir, zap.NewNop())
	r := newReplicator("me", dir, reg, peers, 0, nil, zap.NewNop())
	r.retry = 0
	var mu sync.Mutex
	var reports []coordinator.ModelHolder
	r.report = func(_ context.Context, model string, h coordinator.ModelHolder) error {
		mu.Lock()
		defer mu.Unlock()
		if model != "tiny" || h.Node != "me" || h.Digest != sha {
			t.Errorf("report about %s: %+v", model, h)
		}
		reports = append(reports, h)
		return nil
	}
	last := func() coordinator.ModelHolder {
		mu.Lock()
		defer mu.Unlock()
		if len(reports) == 0 {
			return coordinator.ModelHolder{}
		}
		return reports[len(reports)-1]
	}
	st := coordinator.NewState()
	st.Index = 10
	for _, id := range []string{"src", "me"} {
		st.Nodes[id] = &coordinator.Node{ID: id, Name: id, Status: coordinator.StatusAlive, RPCAddr: id + ":1"}
	}
	st.Models["tiny"] = &coordinator.Model{Name: "tiny", Digest: sha, Manifest: shard.ManifestID(raw), Bytes: uint64(len(good)), SourceNode: "src", Status: coordinator.ModelPlanned}
	settle := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			r.mu.Lock()
			idle := len(r.running) == 0 && len(r.inflight) == 0
			r.mu.Unlock()
			if idle {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the copy did not end")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	replicaFiles := func() []string {
		ents, _ := os.ReadDir(filepath.Join(dir, ReplicasDir))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}

	// Wrong bytes: failed, nothing kept.
	r.reconcile(st)
	settle()
	if h := last(); h.State != coordinator.HolderFailed || h.Error == "" {
		t.Fatalf("after a copy with a corrupt byte: %+v", reports)
	}
	if _, ok := reg.get(sha); ok || len(replicaFiles()) != 0 {
		t.Fatalf("a copy that failed verification was kept: %v", replicaFiles())
	}
	for _, h := range reports {
		if h.State == coordinator.HolderReady {
			t.Fatalf("reported ready: %+v", reports)
		}
	}

	// The right bytes: ready, registered, served.
	st.Models["tiny"].Holders = map[string]*coordinator.ModelHolder{"me": {Node: "me", Digest: sha, State: coordinator.HolderFailed}}
	peers.mu.Lock()
	peers.data = good
	peers.mu.Unlock()
	r.reconcile(st)
	settle()
	if h := last(); h.State != coordinator.HolderReady {
		t.Fatalf("after a good copy: %+v", reports)
	}
	rd, size, ok := reg.OpenWeights(sha)
	if !ok || size != int64(len(good)) {
		t.Fatal("the copy is not served")
	}
	got := make([]byte, size)
	if _, err := rd.ReadAt(got, 0); err != nil || !bytes.Equal(got, good) {
		t.Fatalf("the copy reads back wrong: %v", err)
	}
	if m, ok := reg.manifest(sha); !ok || !bytes.Equal(m, raw) {
		t.Fatal("the copy's manifest is not kept")
	}

	// A restart keeps it, trusted by its size and time.
	r.close()
	reg.close()
	reg = openFileRegistry(dir, zap.NewNop())
	defer func() { reg.close() }()
	r = newReplicator("me", dir, reg, peers, 0, nil, zap.NewNop())
	r.report = func(context.Context, string, coordinator.ModelHolder) error { t.Error("reported again"); return nil }
	if lp, ok := reg.LocalPath(sha); !ok || filepath.Dir(lp) != filepath.Join(dir, ReplicasDir) {
		t.Fatalf("after a restart: %q %v", lp, ok)
	}
	st.Models["tiny"].Holders["me"].State = coordinator.HolderReady
	r.reconcile(st)
	settle()

	// A state from before the copy does not remove it; one without the
	// model does.
	old := coordinator.NewState()
	old.Index = 5
	r.reconcile(old)
	if _, ok := reg.get(sha); !ok {
		t.Fatal("an older state removed the copy")
	}
	gone := coordinator.NewState()
	gone.Index = 20
	gone.Nodes = st.Nodes
	r.reconcile(gone)
	if _, ok := reg.get(sha); ok || len(replicaFiles()) != 0 {
		t.Fatalf("the copy of an unloaded model stays: %v", replicaFiles())
	}
	if _, ok := reg.manifest(sha); ok {
		t.Fatal("the manifest of an unloaded model's copy stays")
	}
	r.close()

	// Without the disk: no-room, once.
	r = newReplicator("me", dir, reg, peers, uint64(len(good)), nil, zap.NewNop())
	var noRoom []coordinator.ModelHolder
	r.report = func(_ context.Context, _ string, h coordinator.ModelHolder) error {
		mu.Lock()
		noRoom = append(noRoom, h)
		mu.Unlock()
		return nil
	}
	delete(st.Models["tiny"].Holders, "me")
	r.reconcile(st)
	settle()
	if len(noRoom) != 1 || noRoom[0].State != coordinator.HolderNoRoom || !strings.Contains(noRoom[0].Error, "free") {
		t.Fatalf("without the disk: %+v", noRoom)
	}
	st.Models["tiny"].Holders["me"] = &noRoom[0]
	r.reconcile(st)
	settle()
	if len(noRoom) != 1 || len(replicaFiles()) != 0 {
		t.Fatalf("a node out of disk tried again: %+v %v", noRoom, replicaFiles())
	}
	r.close()
}
