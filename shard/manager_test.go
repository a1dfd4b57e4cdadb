package shard

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testFiles is LocalFiles over a map.
type testFiles map[string]string

func (f testFiles) LocalPath(sha string) (string, bool) { p, ok := f[sha]; return p, ok }

// testPeers serves one model's layout and ranges from memory, or fails.
type testPeers struct {
	m    *testModel
	fail error
}

func (p *testPeers) Layout(ctx context.Context, addr string, spec ShardSpec) (*Layout, error) {
	if p.fail != nil {
		return nil, p.fail
	}
	l, err := NewLayout(p.m.table, spec, 0)
	if err != nil {
		return nil, err
	}
	return l, l.Sign(bytes.NewReader(p.m.raw))
}

func (p *testPeers) Holdings(ctx context.Context, addr, sha string) ([]byte, []Range, error) {
	return nil, nil, errors.New("no holdings")
}

func (p *testPeers) Ranges(addr string) RangeFetcher {
	var lf LocalFetcher
	lf.Add(p.m.sha, bytes.NewReader(p.m.raw))
	return &lf
}

// reports collects a manager's reports.
type reports struct {
	mu   sync.Mutex
	last map[string]Status
	all  []Status
}

func (r *reports) report(s Status) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[s.Model] = s
	r.all = append(r.all, s)
	return nil
}

// since is every report from the n-th on.
func (r *reports) since(n int) []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Status(nil), r.all[min(n, len(r.all)):]...)
}

func (r *reports) get(model string) Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[model]
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The manager opens a shard from the node's own copy of the file,
// assembles another from a peer, reports both, retries a failure, and
// releases a shard no longer wanted (its member first, then its file).
func TestManager(t *testing.T) {
	m := writeModel(t, denseSpec)
	peers := &testPeers{m: m, fail: errors.New("peer unreachable")}
	rep := &reports{last: map[string]Status{}}
	var released []string
	var relMu sync.Mutex
	dir := t.TempDir()
	mgr := NewManager(ManagerConfig{Dir: dir, Files: testFiles{}, Peers: peers, Report: rep.report, HoldFor: 300 * time.Millisecond,
		BeforeRelease: func(key string) { relMu.Lock(); released = append(released, key); relMu.Unlock() }})
	defer mgr.Close()
	local := NewManager(ManagerConfig{Dir: dir, Files: testFiles{m.sha: m.path}, Report: rep.report})
	defer local.Close()

	spec := tpSpec(m.sha)
	src := Peer{ID: "src-id", Name: "src", Addr: "127.0.0.1:1"}
	local.Reconcile([]Want{{Model: "local", Spec: spec, Version: 1}})
	waitFor(t, "the local shard", func() bool { return len(local.Ready()) == 1 && rep.get("local").State == StateReady })
	if s := rep.get("local"); s.State != StateReady || s.Source != "local" || s.Done != s.Bytes || s.Lo != 1 || s.Hi != 3 {
		t.Errorf("local report %+v", s)
	}
	meta, err := local.Meta("local")
	if err != nil || meta.Path() != m.path {
		t.Fatalf("meta of a local model: %v", err)
	}
	meta.Close()

	mgr.Reconcile([]Want{{Model: "dense", Spec: spec, Version: 2, Source: Peer{Name: "src", Addr: "x", Down: "failed"}}})
	waitFor(t, "a failure report", func() bool { return rep.get("dense").State == StateFailed })
	if s := rep.get("dense"); s.Error != "the node with the model file (src) is failed" {
		t.Errorf("failure %+v", s)
	}
	peers.fail = nil
	for end := time.Now().Add(10 * time.Second); len(mgr.Ready()) == 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		mgr.Reconcile([]Want{{Model: "dense", Spec: spec, Version: 2, Source: src}}) // retried once the back-off passed
	}
	waitFor(t, "the ready report", func() bool { return rep.get("dense").State == StateReady })
	rd := mgr.Ready()
	if len(rd) != 1 || rd[0].Key != Key(spec) || rd[0].Version != 2 || rd[0].Model != "dense" {
		t.Fatalf("ready %+v", rd)
	}
	if s := rep.get("dense"); s.State != StateReady || s.Source != "src-id" || s.Fetched == 0 || s.PlanVersion != 2 {
		t.Errorf("fetched report %+v", s)
	}
	meta, err = mgr.Meta("dense")
	if err != nil || meta.Has("general.architecture") != true || len(meta.Tensors) != 0 {
		t.Fatalf("meta from an assembled shard's header: %v", err)
	}
	meta.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "dense-*.shard"))
	if len(files) != 1 {
		t.Fatalf("shard files %v", files)
	}

	mgr.Reconcile(nil)
	// The released shard's file serves its ranges to peers for HoldFor,
	// then goes.
	waitFor(t, "the release", func() bool { _, ok := mgr.Holdings(m.sha); return ok && len(mgr.Ready()) == 0 })
	if _, err := os.Stat(files[0]); err != nil {
		t.Fatalf("the released file was not kept: %v", err)
	}
	waitGone(t, mgr, files[0], "the held file to expire")
	if _, ok := mgr.Holdings(m.sha); ok {
		t.Error("an expired file is still held")
	}
	relMu.Lock()
	defer relMu.Unlock()
	if len(released) != 1 || released[0] != Key(spec) || len(mgr.Ready()) != 0 {
		t.Errorf("released %v, ready %d", released, len(mgr.Ready()))
	}
	if _, err := mgr.Meta("dense"); err == nil {
		t.Error("meta of a released model")
	}
}

// TestReclaim: a released shard's file is held for the nodes still loading
// a plan of its model and removed once none is (HoldGrace past), long
// before HoldFor; assembled files nothing claims (a stopped process's)
// are removed once OrphanAge old, while manifests and fresh files stay.
func TestReclaim(t *testing.T) {
	m := writeModel(t, denseSpec)
	dir := t.TempDir()
	var fetching sync.Map // model → true while a plan of it loads
	mgr := NewManager(ManagerConfig{Dir: dir, Files: testFiles{}, Peers: &testPeers{m: m}, Report: (&reports{last: map[string]Status{}}).report,
		HoldFor: time.Hour, HoldGrace: 100 * time.Millisecond, OrphanAge: 200 * time.Millisecond,
		Fetching: func(model string) bool { _, ok := fetching.Load(model); return ok }})
	defer mgr.Close()
	old := time.Now().Add(-time.Hour)
	stray := func(name string, at time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	orphan := stray("gone-0123456789abcdef.shard", old)
	manifest := stray("0123.manifest", old)

	spec := tpSpec(m.sha)
	mgr.Reconcile([]Want{{Model: "dense", Spec: spec, Version: 1, Source: Peer{ID: "src", Name: "src", Addr: "x"}}})
	waitFor(t, "the shard", func() bool { return len(mgr.Ready()) == 1 })
	files, _ := filepath.Glob(filepath.Join(dir, "dense-*.shard"))
	if len(files) != 1 {
		t.Fatalf("shard files %v", files)
	}
	fetching.Store("dense", true) // re-planned: its new nodes load it
	mgr.Reconcile(nil)
	waitFor(t, "the release", func() bool { _, ok := mgr.Holdings(m.sha); return ok })
	time.Sleep(300 * time.Millisecond) // past HoldGrace and OrphanAge
	mgr.Reconcile(nil)
	if _, err := os.Stat(files[0]); err != nil {
		t.Fatalf("the released file went while nodes still load the model: %v", err)
	}
	waitGone(t, mgr, orphan, "the orphan removed")
	// written just now, as far as OrphanAge goes
	fresh := stray("new-0123456789abcdef.shard", time.Now().Add(time.Hour))
	fetching.Delete("dense") // the new plan is loaded
	waitGone(t, mgr, files[0], "the held file removed")
	if _, ok := mgr.Holdings(m.sha); ok {
		t.Error("a removed file is still held")
	}
	for _, p := range []string{manifest, fresh} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", filepath.Base(p), err)
		}
	}
}

// waitGone reconciles mgr (with nothing wanted) until path is gone.
func waitGone(t *testing.T, mgr *Manager, path, what string) {
	t.Helper()
	waitFor(t, what, func() bool {
		mgr.Reconcile(nil)
		_, err := os.Stat(path)
		return errors.Is(err, os.ErrNotExist)
	})
}

// TestNoRoom: a shard the disk cannot take fails before a byte is written,
// reported as no room (the planner moves the plan off the node), and the
// disk is asked again at the retry.
func TestNoRoom(t *testing.T) {
	m := writeModel(t, denseSpec)
	dir := t.TempDir()
	var free atomic.Uint64
	rep := &reports{last: map[string]Status{}}
	mgr := NewManager(ManagerConfig{Dir: dir, Files: testFiles{}, Peers: &testPeers{m: m}, Report: rep.report,
		DiskFree: func(string) (uint64, bool) { return free.Load(), true }})
	defer mgr.Close()
	free.Store(1 << 20)
	want := []Want{{Model: "dense", Spec: tpSpec(m.sha), Version: 1, Source: Peer{ID: "src", Name: "src", Addr: "x"}}}
	mgr.Reconcile(want)
	waitFor(t, "the failure", func() bool { return rep.get("dense").State == StateFailed })
	if s := rep.get("dense"); !s.NoRoom || !strings.Contains(s.Error, "no room on disk for the shard") || !strings.Contains(s.Error, "1.0 MiB is free") {
		t.Fatalf("report %+v", s)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*.shard")); len(files) != 0 {
		t.Fatalf("wrote %v without room", files)
	}
	// The retry, still without room: while it runs, its report keeps
	// saying no room (a "fetching" report without it let the planner
	// plan on the node again; TestDiskFullMoves read one on a loaded host).
	n := len(rep.since(0))
	waitFor(t, "a retry", func() bool {
		mgr.Reconcile(want)
		for _, s := range rep.since(n) {
			if s.State == StateFetching {
				return true
			}
		}
		return false
	})
	for _, s := range rep.since(n) {
		if !s.NoRoom {
			t.Fatalf("a report during the retry without room: %+v", s)
		}
	}
	free.Store(1 << 30)
	waitFor(t, "the shard once there is room", func() bool { mgr.Reconcile(want); return rep.get("dense").State == StateReady })
	if s := rep.get("dense"); s.NoRoom {
		t.Fatalf("ready, still reported without room: %+v", s)
	}
}
