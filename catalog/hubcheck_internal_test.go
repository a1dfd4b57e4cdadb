package catalog

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/synth"
	"shoal/hub"
	"shoal/hub/hubtest"
	"shoal/placement"
	"shoal/shard"
)

// stateCluster is a cluster state in memory that takes model upserts.
type stateCluster struct {
	mu      sync.Mutex
	st      *coordinator.State
	upserts []coordinator.Model
}

func (c *stateCluster) State(context.Context) (*coordinator.State, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := *c.st
	st.Models = map[string]*coordinator.Model{}
	for k, m := range c.st.Models {
		mm := *m
		st.Models[k] = &mm
	}
	return &st, nil
}

func (c *stateCluster) Apply(_ context.Context, t coordinator.MessageType, req any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := req.(coordinator.ModelUpsertRequest); ok && t == coordinator.ModelUpsertType {
		m := r.Model
		c.st.Models[m.Name] = &m
		c.upserts = append(c.upserts, m)
	}
	return nil
}

func (c *stateCluster) ServerAddr() (string, error) { return "", nil }

func (c *stateCluster) model(name string) coordinator.Model {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.st.Models[name]
}

// manifests is a shard store that only keeps manifests.
type manifests struct {
	mu  sync.Mutex
	raw map[string][]byte
}

func (s *manifests) Manifest(sha string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.raw[sha]
	return b, ok
}

func (s *manifests) KeepManifest(sha string, raw []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raw[sha] = raw
}

func (s *manifests) Holdings(string) (*shard.HeldReader, bool) { return nil, false }

// hubCheckFixture is a hub model loaded by "loader" onto node "n1", which
// holds the whole file (its ranges fetched, unverified), seen from the
// catalog of agent id.
func hubCheckFixture(t *testing.T, id string) (*Catalog, *stateCluster, *manifests, coordinator.Model, []byte, *hubtest.Server) {
	t.Helper()
	path := enginetest.Write(t, "", synth.Spec{Name: "hubby", Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Type: "q8_0", Seed: 5})
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sha, _, err := shard.BuildManifest(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	gf, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	table, err := shard.TableOf(gf)
	gf.Close()
	if err != nil {
		t.Fatal(err)
	}
	table.FileSize = int64(len(file))
	pending, err := shard.UnverifiedManifest(sha, table, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := coordinator.NewState()
	for _, n := range []string{"loader", "leader", "n1"} {
		st.Nodes[n] = &coordinator.Node{ID: n, Name: n, Status: coordinator.StatusAlive, RPCAddr: n + ":1", StatusSince: time.Now()}
	}
	m := coordinator.Model{Name: "hubby", Digest: sha, Manifest: shard.ManifestID(pending), Unverified: true, SourceNode: "loader",
		Status: coordinator.ModelPlanned, Source: "hub:org/hubby-GGUF/hubby.gguf@main",
		Hub: &coordinator.HubFile{Repo: "org/hubby-GGUF", File: "hubby.gguf", SHA256: sha, Size: int64(len(file))}}
	st.Models["hubby"] = &m
	st.Plans["hubby"] = &placement.Plan{Version: 1, Model: "hubby", Pools: []placement.Pool{{Stages: []placement.Stage{{Lo: 0, Hi: 2, Members: []placement.Member{{Node: "n1"}}}}}}}
	st.Shards[coordinator.ShardKey("n1", "hubby")] = &coordinator.ShardStatus{Node: "n1", Model: "hubby", Hi: 2, State: coordinator.ShardVerifying, PlanVersion: 1}
	hs := hubtest.New(t)
	hs.AddRepo("org/hubby-GGUF", map[string][]byte{"hubby.gguf": file})
	cl := &stateCluster{st: st}
	store := &manifests{raw: map[string][]byte{sha: pending}}
	done := make(chan struct{})
	var bg sync.WaitGroup
	t.Cleanup(func() { close(done); bg.Wait() })
	c := &Catalog{id: id, name: id, log: zap.NewNop(), server: true, isLeader: func() bool { return id == "leader" }, cluster: cl,
		peers: &filePeers{raw: pending, data: file}, shards: func() Shards { return store },
		hub: func() *hub.Client { return &hub.Client{Endpoint: hs.URL} }, bg: &bg, done: done}
	return c, cl, store, m, pending, hs
}

// TestHubCheckerBecomesSource: the agent whose check of a hub file ends
// records the checked manifest and itself as the model's source, the node
// the others ask for that manifest. A loader restarted during a take-over
// may resume its check from a state that does not show the take-over yet:
// when its check ends first, the leader's stops (the manifest changed) and
// only the loader keeps the checked manifest, so a state naming the
// leader as source left every shard asking nodes without it.
func TestHubCheckerBecomesSource(t *testing.T) {
	c, cl, store, m, pending, _ := hubCheckFixture(t, "loader")
	cl.mu.Lock()
	cl.st.Models["hubby"].SourceNode = "leader" // the take-over landed meanwhile
	cl.mu.Unlock()
	c.bg.Add(1)
	c.checkHubFile(c.claimHubCheck(m.Name, m.Manifest), m, pending, nil)
	got := cl.model("hubby")
	if got.Unverified || got.Manifest == m.Manifest {
		t.Fatalf("the check recorded nothing: %+v", got)
	}
	raw, ok := store.Manifest(m.Digest)
	if !ok || shard.ManifestID(raw) != got.Manifest {
		t.Fatalf("the checker does not keep the manifest %s it recorded", got.Manifest)
	}
	if got.SourceNode != "loader" {
		t.Fatalf("the model's source is %q after loader's check ended; it keeps the checked manifest", got.SourceNode)
	}
}

// TestHubTakeOverWaitsForRestart: the leader takes over the check of a
// hub model only once its loading agent has been failed (or gone) for
// hubTakeOverAfter: one restarted at once resumes its own check.
func TestHubTakeOverWaitsForRestart(t *testing.T) {
	c, cl, _, _, _, _ := hubCheckFixture(t, "leader")
	cl.mu.Lock()
	loader := cl.st.Nodes["loader"]
	loader.Status, loader.StatusSince = coordinator.StatusFailed, time.Now().Add(-time.Second)
	cl.mu.Unlock()
	st, _ := cl.State(context.Background())
	c.resumeHubChecks(st)
	if hc := c.claimHubCheck("hubby", st.Models["hubby"].Manifest); hc != nil {
		c.releaseHubCheck("hubby", hc)
	} else {
		t.Fatal("the leader took the check over a second after the loader failed")
	}
	cl.mu.Lock()
	loader.StatusSince = time.Now().Add(-hubTakeOverAfter)
	cl.mu.Unlock()
	st, _ = cl.State(context.Background())
	c.resumeHubChecks(st)
	deadline := time.Now().Add(10 * time.Second)
	for cl.model("hubby").SourceNode != "leader" {
		if time.Now().After(deadline) {
			t.Fatalf("the leader did not take the check over %v after the loader failed", hubTakeOverAfter)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHubCheckNotStartedAgain: a check that ended here releases its claim
// once recorded, and the serving loop may pass a state read before that
// record: the check is not started again (it read the header from the hub
// and kept the unverified manifest over the checked one, which the nodes
// then asked this agent for in vain); the checked one is recorded.
func TestHubCheckNotStartedAgain(t *testing.T) {
	c, cl, store, m, pending, hs := hubCheckFixture(t, "loader")
	stale, _ := cl.State(context.Background())
	c.bg.Add(1)
	c.checkHubFile(c.claimHubCheck(m.Name, m.Manifest), m, pending, nil)
	checked, _ := store.Manifest(m.Digest)
	if cl.model("hubby").Unverified {
		t.Fatal("the check recorded nothing")
	}
	// The record lost (a leader change, say): the state still says
	// unverified, as the stale one does.
	cl.mu.Lock()
	cl.st.Models["hubby"] = &m
	cl.mu.Unlock()
	before := hs.TotalBytesServed()
	c.resumeHubChecks(stale)
	deadline := time.Now().Add(10 * time.Second)
	for cl.model("hubby").Unverified {
		if time.Now().After(deadline) {
			t.Fatal("the check done here was not recorded again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.bg.Wait()
	if raw, _ := store.Manifest(m.Digest); shard.ManifestID(raw) != shard.ManifestID(checked) {
		t.Errorf("the checked manifest was replaced by %s", shard.ManifestID(raw))
	}
	if got := cl.model("hubby"); got.Manifest != shard.ManifestID(checked) || got.SourceNode != "loader" {
		t.Errorf("recorded %+v", got)
	}
	if n := hs.TotalBytesServed() - before; n != 0 {
		t.Errorf("read %d bytes from the hub to start a check that had ended", n)
	}
}
