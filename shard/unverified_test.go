package shard

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file no node holds whole (a hub file read in place) is checked after
// the nodes fetched their ranges under an unverified manifest: the shards
// are held and served but never run; the file read back from them in
// order (padding as zeros) has the file's sha256 and manifest without
// another byte from the origin; under the checked manifest each shard is
// assembled again from its own copy and its peer's, every unit checked,
// and only then runs; the unverified copies are gone.
func TestUnverifiedThenChecked(t *testing.T) {
	m := writeModel(t, denseSpec)
	n := newTestNet(t, m)
	n.set(n.whole, "hub", true) // the origin: everything, at a cost
	loader, b, c := n.node(t, "loader"), n.node(t, "b"), n.node(t, "c")
	table := *m.table
	table.FileSize = int64(len(m.raw))
	p, err := UnverifiedManifest(m.sha, &table, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseManifest(p, ManifestID(p), m.sha); err != nil {
		t.Fatalf("the unverified manifest: %v", err)
	}
	loader.KeepManifest(m.sha, p)
	r0 := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPRank: 0, TPSize: 2, HeadLo: 0, HeadHi: 4, FFNLo: 0, FFNHi: 512, Embedding: true, Output: true}
	r1 := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: 512, FFNHi: 1024, Embedding: true, Output: true}
	holders := []Peer{peer("loader"), peer("b"), peer("c"), peer("hub")}
	want := func(spec ShardSpec, id string) []Want {
		return []Want{{Model: "dense", Spec: spec, Version: 1, Manifest: id, Holders: holders}}
	}
	rb, rc := &reports{last: map[string]Status{}}, &reports{last: map[string]Status{}}
	b.cfg.Report, c.cfg.Report = rb.report, rc.report
	waitFor(t, "both shards fetched under the unverified manifest", func() bool {
		b.Reconcile(want(r0, ManifestID(p)))
		c.Reconcile(want(r1, ManifestID(p)))
		return rb.get("dense").State == StateVerifying && rc.get("dense").State == StateVerifying
	})
	if len(b.Ready()) != 0 || len(c.Ready()) != 0 {
		t.Fatal("a shard of unchecked bytes is ready to run")
	}
	hubBytes := n.servedBy("hub")
	if hubBytes == 0 || hubBytes >= 2*int64(len(m.raw)) {
		t.Fatalf("the origin served %d bytes of a %d-byte file to two half shards", hubBytes, len(m.raw))
	}

	// The check reads the file from b and c only.
	man, err := ParseManifest(p, ManifestID(p), m.sha)
	if err != nil {
		t.Fatal(err)
	}
	var hs []Holder
	for _, name := range []string{"b", "c"} {
		_, held, err := n.Holdings(context.Background(), name, m.sha)
		if err != nil || len(held) == 0 {
			t.Fatalf("%s holds %v: %v", name, held, err)
		}
		hs = append(hs, Holder{ID: name, Name: name, Held: held, F: n.Ranges(name)})
	}
	r, hf := FileReader(context.Background(), man, hs)
	sha, full, err := BuildManifestFrom(&table, r, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	_, ref, _ := BuildManifestFrom(&table, bytes.NewReader(m.raw), 64<<10)
	if sha != m.sha || !bytes.Equal(full, ref) {
		t.Fatalf("read back from the shards: sha256 %s (want %s), manifest equal %v", sha, m.sha, bytes.Equal(full, ref))
	}
	served, _ := hf.Served()
	if served["b"] == 0 || served["c"] == 0 || n.servedBy("hub") != hubBytes {
		t.Fatalf("the check read %v from the shards and %d bytes from the origin", served, n.servedBy("hub")-hubBytes)
	}

	// Under the checked manifest: assembled again from b's and c's copies.
	loader.KeepManifest(m.sha, full)
	id := ManifestID(full)
	sb := waitReady(t, b, want(r0, id), r0)
	sc := waitReady(t, c, want(r1, id), r1)
	sameShard(t, m, sb.Shard, r0)
	sameShard(t, m, sc.Shard, r1)
	if got := n.servedBy("hub") - hubBytes; got != 0 {
		t.Errorf("the origin served %d more bytes for the checked assembly", got)
	}
	for _, mgr := range []*Manager{b, c} {
		left, _ := filepath.Glob(filepath.Join(mgr.cfg.Dir, "*"))
		for _, f := range left {
			if strings.Contains(f, "unverified") {
				t.Errorf("left behind: %s", filepath.Base(f))
			}
		}
		if raw, ok := mgr.Manifest(m.sha); !ok || ManifestID(raw) != id {
			t.Errorf("the node keeps manifest %.12s, want the checked %.12s", ManifestID(raw), id)
		}
	}
	if _, err := os.Stat(m.path); err != nil {
		t.Fatal(err)
	}
}

// A byte the origin corrupted for one node fails the read-back check, and
// under a manifest built elsewhere (the whole file streamed from the
// origin) that node's copy is caught unit by unit: the corrupted unit is
// fetched again, the rest comes from its own copy.
func TestUnverifiedCorruptCopy(t *testing.T) {
	m := writeModel(t, denseSpec)
	n := newTestNet(t, m)
	n.set(n.whole, "hub", true)
	loader, b := n.node(t, "loader"), n.node(t, "b")
	b.cfg.Origin = func(string) RangeFetcher { return n.Ranges("hub") } // the hub, read last
	table := *m.table
	table.FileSize = int64(len(m.raw))
	p, _ := UnverifiedManifest(m.sha, &table, 64<<10)
	loader.KeepManifest(m.sha, p)
	all := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPSize: 1, Embedding: true, Output: true}
	holders := []Peer{peer("loader")}
	rb := &reports{last: map[string]Status{}}
	b.cfg.Report = rb.report
	n.mu.Lock()
	n.flip["hub"] = int64(len(m.raw)) * 2 / 3
	n.mu.Unlock()
	waitFor(t, "the shard fetched under the unverified manifest", func() bool {
		b.Reconcile([]Want{{Model: "dense", Spec: all, Version: 1, Manifest: ManifestID(p), Holders: holders, Origin: "hub"}})
		return rb.get("dense").State == StateVerifying
	})
	n.mu.Lock()
	delete(n.flip, "hub")
	n.mu.Unlock()
	man, _ := ParseManifest(p, ManifestID(p), m.sha)
	_, held, _ := n.Holdings(context.Background(), "b", m.sha)
	r, _ := FileReader(context.Background(), man, []Holder{{ID: "b", Name: "b", Held: held, F: n.Ranges("b")}})
	if sha, _, err := BuildManifestFrom(&table, r, 64<<10); err != nil || sha == m.sha {
		t.Fatalf("corrupt copies read back: sha256 %s, %v", sha, err)
	}
	_, full, _ := BuildManifestFrom(&table, bytes.NewReader(m.raw), 64<<10)
	loader.KeepManifest(m.sha, full)
	hub0 := n.servedBy("hub")
	rd := waitReady(t, b, []Want{{Model: "dense", Spec: all, Version: 1, Manifest: ManifestID(full), Holders: holders, Origin: "hub"}}, all)
	sameShard(t, m, rd.Shard, all)
	if got := n.servedBy("hub") - hub0; got == 0 || got > 64<<10 {
		t.Errorf("the origin served %d bytes to mend a copy with one corrupt byte (units of %d bytes)", got, 64<<10)
	}
}

// A node that stops while its shard is unverified leaves the file behind;
// started again after the check, it assembles the shard under the checked
// manifest and removes the leftover.
func TestUnverifiedLeftoverRemoved(t *testing.T) {
	m := writeModel(t, denseSpec)
	n := newTestNet(t, m)
	n.set(n.whole, "hub", true)
	loader := n.node(t, "loader")
	dir := t.TempDir()
	b := NewManager(ManagerConfig{Dir: dir, Files: testFiles{}, Peers: n})
	table := *m.table
	table.FileSize = int64(len(m.raw))
	p, _ := UnverifiedManifest(m.sha, &table, 64<<10)
	loader.KeepManifest(m.sha, p)
	all := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPSize: 1, Embedding: true, Output: true}
	holders := []Peer{peer("loader"), peer("hub")}
	rb := &reports{last: map[string]Status{}}
	b.cfg.Report = rb.report
	waitFor(t, "the shard fetched under the unverified manifest", func() bool {
		b.Reconcile([]Want{{Model: "dense", Spec: all, Version: 1, Manifest: ManifestID(p), Holders: holders}})
		return rb.get("dense").State == StateVerifying
	})
	b.Close()
	left, _ := filepath.Glob(filepath.Join(dir, "*.unverified.shard"))
	if len(left) != 1 {
		t.Fatalf("unverified files after the stop: %v", left)
	}
	_, full, _ := BuildManifestFrom(&table, bytes.NewReader(m.raw), 64<<10)
	loader.KeepManifest(m.sha, full)
	b2 := NewManager(ManagerConfig{Dir: dir, Files: testFiles{}, Peers: n})
	t.Cleanup(b2.Close)
	rd := waitReady(t, b2, []Want{{Model: "dense", Spec: all, Version: 1, Manifest: ManifestID(full), Holders: holders}}, all)
	sameShard(t, m, rd.Shard, all)
	if left, _ := filepath.Glob(filepath.Join(dir, "*.unverified.shard")); len(left) != 0 {
		t.Errorf("left behind after the checked assembly: %v", left)
	}
}
