package shard

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// testNet is a cluster of in-memory nodes for the managers: a node has
// the whole model file (with its manifest) or its manager's shard files;
// a node can be down, and can serve corrupted bytes.
type testNet struct {
	m       *testModel
	raw     []byte // the manifest
	mu      sync.Mutex
	whole   map[string]bool
	mgrs    map[string]*Manager
	down    map[string]bool
	corrupt map[string]bool
	flip    map[string]int64 // addr → a file offset served inverted
	served  map[string]int64
}

func newTestNet(t *testing.T, m *testModel) *testNet {
	sha, raw, err := BuildManifest(m.path, 64<<10)
	if err != nil || sha != m.sha {
		t.Fatalf("manifest: %v (sha %s, want %s)", err, sha, m.sha)
	}
	return &testNet{m: m, raw: raw, whole: map[string]bool{}, mgrs: map[string]*Manager{}, down: map[string]bool{}, corrupt: map[string]bool{}, flip: map[string]int64{}, served: map[string]int64{}}
}

func (n *testNet) state(addr string) (whole bool, mgr *Manager, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down[addr] {
		return false, nil, fmt.Errorf("%s is unreachable", addr)
	}
	return n.whole[addr], n.mgrs[addr], nil
}

func (n *testNet) Layout(ctx context.Context, addr string, spec ShardSpec) (*Layout, error) {
	whole, _, err := n.state(addr)
	if err != nil {
		return nil, err
	}
	if !whole {
		return nil, fmt.Errorf("%s has no file", addr)
	}
	l, err := NewLayout(n.m.table, spec, 0)
	if err != nil {
		return nil, err
	}
	return l, l.Sign(bytes.NewReader(n.m.raw))
}

func (n *testNet) Holdings(ctx context.Context, addr, sha string) ([]byte, []Range, error) {
	whole, mgr, err := n.state(addr)
	if err != nil {
		return nil, nil, err
	}
	if whole {
		return n.raw, []Range{{0, int64(len(n.m.raw))}}, nil
	}
	man, _ := mgr.Manifest(sha)
	hr, ok := mgr.Holdings(sha)
	if !ok {
		return man, nil, nil
	}
	return man, hr.Ranges(), nil
}

func (n *testNet) Ranges(addr string) RangeFetcher { return netFetcher{n, addr} }

type netFetcher struct {
	n    *testNet
	addr string
}

func (f netFetcher) Fetch(ctx context.Context, sha string, off, k int64) (io.ReadCloser, error) {
	whole, mgr, err := f.n.state(f.addr)
	if err != nil {
		return nil, err
	}
	var r io.ReaderAt = bytes.NewReader(f.n.m.raw)
	if !whole {
		hr, ok := mgr.Holdings(sha)
		if !ok || !hr.Holds(off, k) {
			return nil, fmt.Errorf("%s does not hold [%d,+%d)", f.addr, off, k)
		}
		r = hr
	}
	b := make([]byte, k)
	if _, err := r.ReadAt(b, off); err != nil {
		return nil, err
	}
	f.n.mu.Lock()
	if f.n.corrupt[f.addr] && k > 0 {
		b[k/2] ^= 0x5a
	}
	if x, ok := f.n.flip[f.addr]; ok && x >= off && x < off+k {
		b[x-off] ^= 0xff
	}
	f.n.served[f.addr] += k
	f.n.mu.Unlock()
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (n *testNet) node(t *testing.T, name string) *Manager {
	mgr := NewManager(ManagerConfig{Dir: t.TempDir(), Files: testFiles{}, Peers: n})
	t.Cleanup(mgr.Close)
	n.mu.Lock()
	n.mgrs[name] = mgr
	n.mu.Unlock()
	return mgr
}

func (n *testNet) set(m map[string]bool, addr string, v bool) {
	n.mu.Lock()
	m[addr] = v
	n.mu.Unlock()
}

func (n *testNet) servedBy(addr string) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.served[addr]
}

func peer(name string) Peer { return Peer{ID: name + "-id", Name: name, Addr: name} }

// waitReady reconciles mgr to want until one shard of spec is ready.
func waitReady(t *testing.T, mgr *Manager, want []Want, spec ShardSpec) Ready {
	t.Helper()
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		mgr.Reconcile(want)
		for _, r := range mgr.Ready() {
			if r.Key == Key(spec) {
				return r
			}
		}
	}
	mgr.mu.Lock()
	defer mgr.mu.Unlock()
	for _, j := range mgr.jobs {
		t.Logf("job %d-%d: %s %s", j.spec.Lo, j.spec.Hi, j.state, j.err)
	}
	t.Fatalf("shard [%d,%d) never ready", spec.Lo, spec.Hi)
	return Ready{}
}

// sameShard checks that sh holds exactly what Open takes from the file.
func sameShard(t *testing.T, m *testModel, sh *Shard, spec ShardSpec) {
	t.Helper()
	ref, err := Open(m.path, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if len(ref.Tensors) != len(sh.Tensors) {
		t.Fatalf("%d tensors, want %d", len(sh.Tensors), len(ref.Tensors))
	}
	for i := range ref.Tensors {
		if !bytes.Equal(ref.Tensors[i].Data, sh.Tensors[i].Data) {
			t.Fatalf("tensor %s differs from the file", ref.Tensors[i].Name)
		}
	}
}

// A model loaded from A and planned tensor-parallel over B and C survives
// A's death: a re-plan giving B every layer is assembled from B's and C's
// shard files (each row of a column-split matrix from both halves),
// verified against the manifest, with A down.
func TestReplanWithoutSource(t *testing.T) {
	m := writeModel(t, denseSpec)
	n := newTestNet(t, m)
	n.set(n.whole, "a", true)
	b, c := n.node(t, "b"), n.node(t, "c")
	id := ManifestID(n.raw)
	r0 := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPRank: 0, TPSize: 2, HeadLo: 0, HeadHi: 4, FFNLo: 0, FFNHi: 512, Embedding: true, Output: true}
	r1 := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: 512, FFNHi: 1024, Embedding: true, Output: true}
	src := peer("a")
	holders := []Peer{src, peer("b"), peer("c")}
	wb := []Want{{Model: "dense", Spec: r0, Version: 1, Source: src, Manifest: id, Holders: holders}}
	wc := []Want{{Model: "dense", Spec: r1, Version: 1, Source: src, Manifest: id, Holders: holders}}
	waitReady(t, b, wb, r0)
	waitReady(t, c, wc, r1)
	if _, ok := b.Manifest(m.sha); !ok {
		t.Fatal("b kept no manifest")
	}
	// Peers read a node's ranges one unit at a time: its reader is built
	// once for the files it holds.
	h1, _ := b.Holdings(m.sha)
	if h2, _ := b.Holdings(m.sha); h2 != h1 {
		t.Error("the reader of unchanged holdings was rebuilt")
	}

	n.set(n.down, "a", true)
	src.Down = "failed"
	aServed := n.servedBy("a")
	all := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 4, TPSize: 1, Embedding: true, Output: true}
	// c is no longer in the plan: its shard is released but kept for peers.
	c.Reconcile(nil)
	rd := waitReady(t, b, []Want{{Model: "dense", Spec: all, Version: 2, Source: src, Manifest: id, Holders: holders}}, all)
	sameShard(t, m, rd.Shard, all)
	if h2, _ := b.Holdings(m.sha); heldBytes(h2) <= heldBytes(h1) {
		t.Errorf("b holds %d bytes with every layer, %d before", heldBytes(h2), heldBytes(h1))
	}
	if n.servedBy("c") == 0 || n.servedBy("a") != aServed {
		t.Errorf("served by c %d, by a after its death %d", n.servedBy("c"), n.servedBy("a")-aServed)
	}

	// Without the manifest anchor nothing else is trusted: the old error.
	d := n.node(t, "d")
	d.Reconcile([]Want{{Model: "dense", Spec: r1, Version: 2, Source: src, Holders: holders}})
	waitFor(t, "d to fail", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, j := range d.jobs {
			j.mu.Lock()
			defer j.mu.Unlock()
			return j.state == StateFailed && j.err == "the node with the model file (a) is failed"
		}
		return false
	})
}

func heldBytes(r *HeldReader) (n int64) {
	for _, rg := range r.Ranges() {
		n += rg.N
	}
	return n
}

// A holder serving corrupted bytes is caught by the manifest's unit sums
// and passed over for another holder of the same ranges.
func TestCorruptHolder(t *testing.T) {
	m := writeModel(t, denseSpec)
	n := newTestNet(t, m)
	n.set(n.whole, "a", true)
	b, c, d := n.node(t, "b"), n.node(t, "c"), n.node(t, "d")
	id := ManifestID(n.raw)
	src := peer("a")
	holders := []Peer{peer("b"), peer("c"), peer("d")}
	first := ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 2, Embedding: true}
	for _, mgr := range []*Manager{b, c} {
		waitReady(t, mgr, []Want{{Model: "dense", Spec: first, Version: 1, Source: src, Manifest: id, Holders: holders}}, first)
	}
	n.set(n.down, "a", true)
	n.set(n.corrupt, "b", true)
	src.Down = "failed"
	rd := waitReady(t, d, []Want{{Model: "dense", Spec: first, Version: 2, Source: src, Manifest: id, Holders: holders}}, first)
	sameShard(t, m, rd.Shard, first)
	if n.servedBy("b") == 0 || n.servedBy("c") == 0 {
		t.Errorf("served by b %d, c %d: the corrupt holder was not tried first or not passed over", n.servedBy("b"), n.servedBy("c"))
	}
	d.mu.Lock()
	for _, j := range d.jobs {
		if j.source != "c-id" {
			t.Errorf("source %q, want c-id", j.source)
		}
	}
	d.mu.Unlock()

	// With the corrupt holder alone, the shard fails instead of taking
	// its bytes.
	e := n.node(t, "e")
	e.Reconcile([]Want{{Model: "dense", Spec: first, Version: 2, Source: src, Manifest: id, Holders: []Peer{peer("b")}}})
	waitFor(t, "e to fail", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, j := range e.jobs {
			j.mu.Lock()
			defer j.mu.Unlock()
			return j.state == StateFailed
		}
		return false
	})
	if len(e.Ready()) != 0 {
		t.Fatal("a shard of corrupted bytes is ready")
	}
}

// The manifest's units cover every byte a shard needs and no padding,
// and ParseManifest refuses a manifest that is not the recorded one.
func TestManifest(t *testing.T) {
	m := writeModel(t, moeSpec)
	sha, raw, err := BuildManifest(m.path, 4096)
	if err != nil || sha != m.sha {
		t.Fatal(err)
	}
	man, err := ParseManifest(raw, ManifestID(raw), m.sha)
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range Units(man.Table, man.UnitSize) {
		if !checkSum(m.raw[u.Off:u.End()], man.Sums[i]) {
			t.Fatalf("unit %d sum", i)
		}
	}
	bad := bytes.Replace(raw, []byte(man.Sums[3]), []byte(man.Sums[4]), 1)
	if _, err := ParseManifest(bad, ManifestID(raw), m.sha); err == nil {
		t.Fatal("a changed manifest was accepted")
	}
	if _, err := ParseManifest(raw, ManifestID(raw), "00"); err == nil {
		t.Fatal("a manifest of another file was accepted")
	}
	var lf LocalFetcher
	lf.Add(m.sha, bytes.NewReader(m.raw))
	hf := NewHolderFetcher(man, []Holder{{ID: "x", Held: []Range{{0, int64(len(m.raw))}}, F: &lf}})
	spec := ShardSpec{Model: "moe", FileSHA: m.sha, Lo: 0, Hi: 2, TPRank: 1, TPSize: 2, HeadLo: 2, HeadHi: 4, FFNLo: 256, FFNHi: 512, Experts: []int{1, 3}, Output: true}
	l, err := NewLayout(man.Table, spec, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := hf.Covers(l.Ranges()); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/moe.shard"
	if _, err := Assemble(context.Background(), path, l, hf, AssembleOptions{}); err != nil {
		t.Fatal(err)
	}
	sh, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	sameShard(t, m, sh, spec)
	if !l.Signed() {
		t.Fatal("the layout was not signed from the verified bytes")
	}
	if _, err := Assemble(context.Background(), path, l, &lf, AssembleOptions{}); err != nil {
		t.Fatalf("resuming the signed file: %v", err)
	}
	l2, _ := NewLayout(man.Table, spec, 0)
	if _, err := Assemble(context.Background(), t.TempDir()+"/x", l2, &lf, AssembleOptions{}); err == nil {
		t.Fatal("an unsigned layout was assembled from unverified bytes")
	}
}

// TestFileVerifier: a whole file written through the verifier passes;
// a changed byte of a unit fails the write there, and bytes the units do
// not cover (a truncated or extended file) fail the check.
func TestFileVerifier(t *testing.T) {
	m := writeModel(t, denseSpec)
	sha, raw, err := BuildManifest(m.path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	man, err := ParseManifest(raw, ManifestID(raw), sha)
	if err != nil {
		t.Fatal(err)
	}
	write := func(b []byte) (*FileVerifier, error) {
		v := NewFileVerifier(man)
		for len(b) > 0 { // in odd pieces, as a stream delivers them
			k := min(len(b), 7777)
			if _, err := v.Write(b[:k]); err != nil {
				return v, err
			}
			b = b[k:]
		}
		return v, nil
	}
	v, err := write(m.raw)
	if err != nil || v.Check() != nil {
		t.Fatalf("the file itself: write %v, check %v", err, v.Check())
	}
	bad := bytes.Clone(m.raw)
	bad[len(bad)/2] ^= 1
	if _, err := write(bad); err == nil || !strings.Contains(err.Error(), "manifest checksum") {
		t.Errorf("a changed byte: %v", err)
	}
	if v, err := write(m.raw[:len(m.raw)-1]); err != nil || v.Check() == nil {
		t.Errorf("a truncated file: write %v, check passed", err)
	}
	if v, err := write(append(bytes.Clone(m.raw), 0)); err != nil || v.Check() == nil || !strings.Contains(v.Check().Error(), "sha256") {
		t.Errorf("an extended file: write %v, check %v", err, v.Check())
	}
}

// stripes is a holder of stripes of a file, as a tensor-parallel member
// holds half of each row: it counts its requests and fails every one when
// broken; batchStripes batches.
type stripes struct {
	data     []byte
	broken   bool
	mu       sync.Mutex
	requests int
}

func (s *stripes) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	return s.fetch([]Range{{off, n}})
}

func (s *stripes) fetch(rs []Range) (io.ReadCloser, error) {
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	if s.broken {
		return nil, fmt.Errorf("broken")
	}
	var b []byte
	for _, r := range rs {
		b = append(b, s.data[r.Off:r.End()]...)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

type batchStripes struct{ *stripes }

func (s batchStripes) FetchRanges(ctx context.Context, sha string, rs []Range) (io.ReadCloser, error) {
	return s.fetch(rs)
}

// TestFileReaderBatchesHolders: the file read back from two holders that
// each hold every other 300-byte stripe (the halves of tensor-parallel
// rows) takes one request per unit from each holder that batches, not one
// per stripe; one that does not batch gets one per stripe. A holder whose
// batch fails is passed over for the next holding those bytes.
func TestFileReaderBatchesHolders(t *testing.T) {
	m := writeModel(t, denseSpec)
	sha, raw, err := BuildManifest(m.path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	verified, err := ParseManifest(raw, ManifestID(raw), sha)
	if err != nil {
		t.Fatal(err)
	}
	pending, err := UnverifiedManifest(sha, verified.Table, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	unverified, err := ParseManifest(pending, ManifestID(pending), sha)
	if err != nil {
		t.Fatal(err)
	}
	const stripe = 300
	size := int64(len(m.raw))
	var even, odd []Range
	for off := int64(0); off < size; off += stripe {
		r := Range{off, min(stripe, size-off)}
		if off/stripe%2 == 0 {
			even = append(even, r)
		} else {
			odd = append(odd, r)
		}
	}
	units := len(Units(verified.Table, verified.UnitSize))
	for _, c := range []struct {
		name      string
		man       *Manifest
		batchOdd  bool
		brokenOdd bool
	}{
		{"verified", verified, true, false},
		{"unverified", unverified, true, false},
		{"odd holder does not batch", verified, false, false},
		{"odd holder fails", unverified, true, true},
	} {
		a := &stripes{data: m.raw}
		b := &stripes{data: m.raw, broken: c.brokenOdd}
		var fb RangeFetcher = b
		if c.batchOdd {
			fb = batchStripes{b}
		}
		whole := &stripes{data: m.raw}
		holders := []Holder{{ID: "a", Name: "a", Held: even, F: batchStripes{a}}, {ID: "b", Name: "b", Held: odd, F: fb},
			{ID: "w", Name: "whole", Held: []Range{{0, size}}, F: batchStripes{whole}, Last: true}}
		r, _ := FileReader(context.Background(), c.man, holders)
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, m.raw) {
			t.Fatalf("%s: read back %d bytes (%v), want the file's %d", c.name, len(got), err, size)
		}
		switch {
		case c.brokenOdd:
			if whole.requests == 0 {
				t.Errorf("%s: the bytes of the failing holder were not read from the next", c.name)
			}
		case c.batchOdd:
			if a.requests > units || b.requests > units || whole.requests != 0 {
				t.Errorf("%s: %d and %d requests to the holders, %d to the last, for %d units", c.name, a.requests, b.requests, whole.requests, units)
			}
		default:
			if a.requests > units || b.requests < len(odd) {
				t.Errorf("%s: %d requests to the batching holder, %d to the other for its %d stripes (%d units)", c.name, a.requests, b.requests, len(odd), units)
			}
		}
		t.Logf("%s: %d units, %d stripes: requests %d, %d, %d", c.name, units, len(even)+len(odd), a.requests, b.requests, whole.requests)
	}
}
