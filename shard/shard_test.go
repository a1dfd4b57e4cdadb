package shard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/kernels"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/placement"
)

// testModel is a small synth model on disk.
type testModel struct {
	path  string
	sha   string
	f     *gguf.File
	table *Table
	raw   []byte
}

var (
	modelsMu  sync.Mutex
	modelsDir string
	models    = map[string]*testModel{}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shard-test-")
	if err != nil {
		panic(err)
	}
	modelsDir = dir
	code := m.Run()
	for _, tm := range models {
		tm.f.Close()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// writeModel writes the synth model s once per test binary (tests only
// read it).
func writeModel(t *testing.T, s synth.Spec) *testModel {
	t.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if m, ok := models[s.Name]; ok {
		return m
	}
	path := enginetest.Write(t, modelsDir, s)
	m := &testModel{path: path}
	var err error
	if m.sha, err = FileSHA256(path); err != nil {
		t.Fatal(err)
	}
	if m.f, err = gguf.Open(path); err != nil {
		t.Fatal(err)
	}
	if m.table, err = TableOf(m.f); err != nil {
		t.Fatal(err)
	}
	if m.raw, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	models[s.Name] = m
	return m
}

// dense: 8 heads of 64 in 2 GQA groups (a group is 256 columns of
// attn_output: one Q4_K block), FFN 1024.
var denseSpec = synth.Spec{Arch: "llama", NEmbd: 512, NLayer: 4, NHead: 8, NHeadKV: 2, NFF: 1024, Type: "q4_k", Seed: 1, Name: "dense"}

var moeSpec = synth.Spec{Arch: "qwen2moe", NEmbd: 256, NLayer: 2, NHead: 4, NHeadKV: 4, NFF: 256, NFFShared: 512, NExpert: 4, NExpertUsed: 2, Type: "q8_0", Seed: 2, Name: "moe"}

// tpSpec is rank 1 of a 2-way TP group on layers [1,3) of the dense model.
func tpSpec(sha string) ShardSpec {
	return ShardSpec{Model: "dense", FileSHA: sha, Lo: 1, Hi: 3, TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: 512, FFNHi: 1024}
}

// rows returns rows [lo,hi) of a tensor, columns [clo,chi), from the raw file.
func (m *testModel) cut(t *testing.T, name string, lo, hi, clo, chi int) []byte {
	ti, ok := m.f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	data := m.f.Data(ti)
	rs := ti.RowSize()
	a, b := ti.Type.RowSize(clo), ti.Type.RowSize(chi)
	var out []byte
	for r := lo; r < hi; r++ {
		out = append(out, data[r*rs+a:r*rs+b]...)
	}
	return out
}

func TestSlicesAndNeeds(t *testing.T) {
	m := writeModel(t, denseSpec)
	spec := tpSpec(m.sha)
	sh, err := Open(m.path, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	for _, tc := range []struct {
		name             string
		lo, hi, clo, chi int
		segs             int
	}{
		{"blk.1.attn_q.weight", 256, 512, 0, 512, 1},
		{"blk.1.attn_k.weight", 64, 128, 0, 512, 1},
		{"blk.2.attn_v.weight", 64, 128, 0, 512, 1},
		{"blk.1.attn_output.weight", 0, 512, 256, 512, 512},
		{"blk.2.ffn_gate.weight", 512, 1024, 0, 512, 1},
		{"blk.2.ffn_up.weight", 512, 1024, 0, 512, 1},
		{"blk.1.ffn_down.weight", 0, 512, 512, 1024, 512},
		{"blk.1.attn_norm.weight", 0, 1, 0, 512, 1},
	} {
		tn, ok := sh.Tensor(tc.name)
		if !ok {
			t.Errorf("%s: missing", tc.name)
			continue
		}
		if len(tn.Segs) != tc.segs {
			t.Errorf("%s: %d segments, want %d", tc.name, len(tn.Segs), tc.segs)
		}
		if want := m.cut(t, tc.name, tc.lo, tc.hi, tc.clo, tc.chi); !bytes.Equal(tn.Data, want) {
			t.Errorf("%s: data differs from rows [%d,%d) cols [%d,%d) of the file", tc.name, tc.lo, tc.hi, tc.clo, tc.chi)
		}
	}
	for _, absent := range []string{"blk.0.attn_q.weight", "blk.3.ffn_up.weight", "token_embd.weight", "output.weight"} {
		if _, ok := sh.Tensor(absent); ok {
			t.Errorf("%s is held but not in the spec", absent)
		}
	}
	needs, err := spec.Needs(m.table)
	if err != nil {
		t.Fatal(err)
	}
	if needs[0].Off != 0 || needs[0].N < int64(m.f.DataOffset) {
		t.Errorf("first range %+v does not hold the header [0,%d)", needs[0], m.f.DataOffset)
	}
	for i := 1; i < len(needs); i++ {
		if needs[i].Off <= needs[i-1].End() {
			t.Fatalf("ranges %d and %d touch or overlap: %+v %+v", i-1, i, needs[i-1], needs[i])
		}
	}
	want := int64(m.f.DataOffset) + sh.Bytes()
	if got := total(needs); got != want {
		t.Errorf("needs %d bytes, the shard holds %d (+ header)", got, want)
	}

	// Experts: a subset becomes row runs of the stacked expert tensors.
	mm := writeModel(t, moeSpec)
	es := ShardSpec{Model: "moe", FileSHA: mm.sha, Lo: 0, Hi: 2, Experts: []int{0, 2, 3}, Embedding: true}
	sm, err := Open(mm.path, es)
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Close()
	for _, name := range []string{"blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight"} {
		tn, _ := sm.Tensor(name)
		per := tn.Info.Dim(1)
		if len(tn.RowRuns) != 2 || tn.RowRuns[0] != [2]int{0, per} || tn.RowRuns[1] != [2]int{2 * per, 4 * per} {
			t.Errorf("%s: row runs %v", name, tn.RowRuns)
		}
		want := append(mm.cut(t, name, 0, per, 0, tn.Info.Dim(0)), mm.cut(t, name, 2*per, 4*per, 0, tn.Info.Dim(0))...)
		if !bytes.Equal(tn.Data, want) {
			t.Errorf("%s: expert data differs", name)
		}
	}
	if _, ok := sm.Tensor("token_embd.weight"); !ok {
		t.Error("embedding not held")
	}
	if _, ok := sm.Tensor("blk.0.ffn_gate_inp.weight"); !ok {
		t.Error("router not held")
	}
}

func TestSplitErrors(t *testing.T) {
	m := writeModel(t, denseSpec)
	for _, tc := range []struct {
		spec ShardSpec
		want string
	}{
		{ShardSpec{FileSHA: m.sha, Lo: 0, Hi: 4, TPSize: 2, HeadLo: 6, HeadHi: 10, FFNLo: 0, FFNHi: 512}, "not within"},
		{ShardSpec{FileSHA: m.sha, Lo: 0, Hi: 4, TPSize: 2, HeadLo: 0, HeadHi: 4, FFNLo: 0, FFNHi: 2048}, "past the FFN size"},
		{ShardSpec{FileSHA: m.sha, Lo: 2, Hi: 9}, "not within"},
		{ShardSpec{FileSHA: m.sha, Lo: 0, Hi: 1, Experts: []int{0}}, "experts"},
	} {
		_, err := tc.spec.Needs(m.table)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", tc.spec, err, tc.want)
		}
	}
}

// TestUnalignedSplit checks that a column split off block boundaries (FFN
// [0,384) of a Q4_K ffn_down, whose blocks are 256 columns) holds the
// member's output rows of the whole matrix instead, as the engine expects.
func TestUnalignedSplit(t *testing.T) {
	m := writeModel(t, denseSpec)
	spec := ShardSpec{FileSHA: m.sha, Lo: 0, Hi: 1, TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: 384, FFNHi: 1024}
	sh, err := Open(m.path, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	tn, ok := sh.Tensor("blk.0.ffn_down.weight")
	if !ok {
		t.Fatal("ffn_down missing")
	}
	lo, hi := model.OutputRows(1, 2, 512)
	if tn.Cols() != 1024 || len(tn.RowRuns) != 1 || tn.RowRuns[0] != [2]int{lo, hi} {
		t.Errorf("ffn_down holds rows %v of %d columns, want rows [%d,%d) of 1024", tn.RowRuns, tn.Cols(), lo, hi)
	}
	if !bytes.Equal(tn.Data, m.cut(t, tn.Name, lo, hi, 0, 1024)) {
		t.Error("ffn_down data differs from the file's rows")
	}
	if tn, _ := sh.Tensor("blk.0.attn_output.weight"); tn.Cols() != 256 || tn.Rows() != 512 {
		t.Errorf("aligned attn_output holds %d x %d, want 512 x 256", tn.Rows(), tn.Cols())
	}
	if _, err := sh.Model(); err != nil {
		t.Errorf("the engine does not take the shard: %v", err)
	}
}

// TestOpenTouchesOnlyItsRanges counts the bytes Open takes from the mapped
// file: they must be the shard's size, within 5%, and far from the file's.
func TestOpenTouchesOnlyItsRanges(t *testing.T) {
	m := writeModel(t, denseSpec)
	spec := tpSpec(m.sha)
	var touched int64
	sh, err := openGGUF(m.f, spec, func(ti *gguf.TensorInfo, off, n int64) []byte {
		touched += n
		base := int64(m.f.DataOffset + ti.Offset)
		return m.f.Data(ti)[off-base : off-base+n]
	})
	if err != nil {
		t.Fatal(err)
	}
	size := sh.Bytes()
	if d := float64(touched-size) / float64(size); d < -0.05 || d > 0.05 {
		t.Errorf("touched %d bytes, the shard holds %d", touched, size)
	}
	if float64(touched) > 0.35*float64(len(m.raw)) {
		t.Errorf("touched %d bytes of a %d-byte file for a quarter of the layers' weights", touched, len(m.raw))
	}
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r io.ReaderAt
	n atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

func signedLayout(t *testing.T, m *testModel, spec ShardSpec, piece int64) *Layout {
	t.Helper()
	l, err := NewLayout(m.table, spec, piece)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Sign(bytes.NewReader(m.raw)); err != nil {
		t.Fatal(err)
	}
	return l
}

// sameAsLocal checks that the assembled shard at path holds exactly what
// Open gives from the whole file.
func sameAsLocal(t *testing.T, m *testModel, spec ShardSpec, path string) {
	t.Helper()
	got, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want, err := Open(m.path, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("assembled shard has %d tensors, local %d", len(got.Tensors), len(want.Tensors))
	}
	for i := range want.Tensors {
		g, w := &got.Tensors[i], &want.Tensors[i]
		if g.Name != w.Name || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("tensor %d: assembled %s (%d bytes) differs from local %s (%d bytes)", i, g.Name, len(g.Data), w.Name, len(w.Data))
		}
	}
	hdr, err := Header(path)
	if err != nil || !bytes.Equal(hdr, m.raw[:m.f.DataOffset]) {
		t.Fatalf("header differs (%v)", err)
	}
	if got.Config != want.Config {
		t.Fatalf("config %+v, want %+v", got.Config, want.Config)
	}
	// The engine makes the same resident (packed where the kernels have a
	// layout for it) copies of an assembled shard's weights as of the
	// local file's: it may drop the mapped pages of both.
	if runtime.GOOS == "linux" || runtime.GOOS == "darwin" {
		for i := range got.Tensors {
			if d := got.Tensors[i].Data; len(d) >= 1<<16 && !got.Release(d) {
				t.Fatalf("tensor %s of the assembled shard (%d bytes, mapped): Release dropped nothing", got.Tensors[i].Name, len(d))
			}
		}
	}
	if got.Release(make([]byte, 1<<16)) {
		t.Fatal("Release dropped bytes the shard does not map")
	}
	gm, err := got.Model()
	if err != nil {
		t.Fatal(err)
	}
	wm, err := want.Model()
	if err != nil {
		t.Fatal(err)
	}
	for l := spec.Lo; l < spec.Hi; l++ {
		g, w := &gm.W.Layers[l], &wm.W.Layers[l]
		for j, pair := range [][2]*kernels.Matrix{{g.Wq, w.Wq}, {g.Wo, w.Wo}, {g.Gate, w.Gate}, {g.Down, w.Down}} {
			if pair[0] != nil && pair[1] != nil && pair[0].Packed != pair[1].Packed {
				t.Fatalf("layer %d matrix %d: packed %v from the assembled shard, %v from the file", l, j, pair[0].Packed, pair[1].Packed)
			}
		}
	}
}

// TestAssembleReadsOnlyItsRanges assembles a TP shard from a local fetcher
// over a counting reader: the bytes read are the shard's, within 5%.
func TestAssembleReadsOnlyItsRanges(t *testing.T) {
	m := writeModel(t, denseSpec)
	spec := tpSpec(m.sha)
	l := signedLayout(t, m, spec, 64<<10)
	src := &countingReaderAt{r: bytes.NewReader(m.raw)}
	var lf LocalFetcher
	lf.Add(m.sha, src)
	path := filepath.Join(t.TempDir(), l.ID()[:16]+".shard")
	var calls int
	var last Progress
	pr, err := Assemble(context.Background(), path, l, &lf, AssembleOptions{Progress: func(p Progress) { calls++; last = p }})
	if err != nil {
		t.Fatal(err)
	}
	size := l.Bytes()
	if d := float64(src.n.Load()-size) / float64(size); d < -0.05 || d > 0.05 {
		t.Errorf("read %d bytes from the model file, the shard is %d", src.n.Load(), size)
	}
	if float64(size) > 0.35*float64(len(m.raw)) {
		t.Errorf("shard is %d bytes of a %d-byte file", size, len(m.raw))
	}
	if pr.Done != pr.Pieces || pr.Fetched != size || pr.Refetched != 0 || calls != len(l.Pieces) || last.Done != pr.Pieces {
		t.Errorf("progress %+v after %d calls (last %+v), %d pieces of %d bytes", pr, calls, last, len(l.Pieces), size)
	}
	sameAsLocal(t, m, spec, path)

	// Assembling again fetches nothing.
	pr, err = Assemble(context.Background(), path, l, &lf, AssembleOptions{})
	if err != nil || pr.Fetched != 0 || pr.Resumed != pr.Pieces {
		t.Errorf("second assembly: %+v, %v", pr, err)
	}
	// Another shard's layout refuses the file.
	other := signedLayout(t, m, ShardSpec{Model: "dense", FileSHA: m.sha, Lo: 0, Hi: 1, Embedding: true}, 64<<10)
	if _, err := Assemble(context.Background(), path, other, &lf, AssembleOptions{}); !errors.Is(err, ErrMismatch) {
		t.Errorf("assembling another shard into the file: %v", err)
	}
}

// recordingFetcher serves from the file, optionally failing once a byte
// budget is spent or flipping a byte in the first fetch of one range, and
// records what it served.
type recordingFetcher struct {
	inner   RangeFetcher
	mu      sync.Mutex
	budget  int64 // bytes before every fetch fails; < 0 for no limit
	corrupt int64 // flip the first byte of the first fetch at this offset; < 0 for none
	served  []Range
	bytes   int64
}

type limitReader struct {
	r    io.ReadCloser
	f    *recordingFetcher
	flip bool
}

func (lr *limitReader) Read(p []byte) (int, error) {
	lr.f.mu.Lock()
	if lr.f.budget >= 0 {
		if lr.f.budget == 0 {
			lr.f.mu.Unlock()
			return 0, errors.New("connection reset by peer")
		}
		p = p[:min(int64(len(p)), lr.f.budget)]
	}
	lr.f.mu.Unlock()
	n, err := lr.r.Read(p)
	lr.f.mu.Lock()
	if lr.f.budget >= 0 {
		lr.f.budget -= int64(n)
	}
	lr.f.bytes += int64(n)
	lr.f.mu.Unlock()
	if lr.flip && n > 0 {
		p[0] ^= 0x40
		lr.flip = false
	}
	return n, err
}

func (lr *limitReader) Close() error { return lr.r.Close() }

func (f *recordingFetcher) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	rc, err := f.inner.Fetch(ctx, sha, off, n)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.served = append(f.served, Range{off, n})
	flip := off == f.corrupt
	if flip {
		f.corrupt = -1
	}
	return &limitReader{r: rc, f: f, flip: flip}, nil
}

// TestAssembleResumes interrupts an assembly (the fetcher dies after 40% of
// the bytes), then resumes it: the second run fetches exactly the pieces
// the first did not complete.
func TestAssembleResumes(t *testing.T) {
	m := writeModel(t, denseSpec)
	spec := tpSpec(m.sha)
	l := signedLayout(t, m, spec, 32<<10)
	var lf LocalFetcher
	lf.Add(m.sha, bytes.NewReader(m.raw))
	path := filepath.Join(t.TempDir(), "s.shard")
	total := l.Bytes()

	dying := &recordingFetcher{inner: &lf, budget: total * 4 / 10, corrupt: -1}
	pr1, err := Assemble(context.Background(), path, l, dying, AssembleOptions{Parallel: 3, SyncBytes: 1})
	if err == nil {
		t.Fatal("assembly with a dying fetcher succeeded")
	}
	if pr1.Done == 0 || pr1.Done == pr1.Pieces {
		t.Fatalf("first run completed %d of %d pieces; want some but not all", pr1.Done, pr1.Pieces)
	}
	if _, err := OpenFile(path); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("opening a partial shard: %v", err)
	}
	sf, err := openFile(path, l)
	if err != nil {
		t.Fatal(err)
	}
	have := map[int64]bool{} // source offsets of segments in present pieces
	for i, p := range l.Pieces {
		if sf.state[i] == 1 {
			for _, s := range p.Segs {
				have[s.Src] = true
			}
		}
	}
	sf.f.Close()

	fresh := &recordingFetcher{inner: &lf, budget: -1, corrupt: -1}
	pr2, err := Assemble(context.Background(), path, l, fresh, AssembleOptions{Parallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	if pr2.Resumed != pr1.Done {
		t.Errorf("resumed %d pieces, the first run completed %d", pr2.Resumed, pr1.Done)
	}
	if pr2.Fetched != total-pr1.DoneBytes || fresh.bytes != pr2.Fetched {
		t.Errorf("second run fetched %d bytes (fetcher served %d), want %d - %d", pr2.Fetched, fresh.bytes, total, pr1.DoneBytes)
	}
	for _, r := range fresh.served {
		if have[r.Off] {
			t.Fatalf("range %+v was fetched again though its piece was complete", r)
		}
	}
	t.Logf("first run: %d of %d pieces (%d of %d bytes); second run fetched %d bytes in %d ranges", pr1.Done, pr1.Pieces, pr1.DoneBytes, total, pr2.Fetched, len(fresh.served))
	sameAsLocal(t, m, spec, path)
}

// TestAssembleRefetchesCorruption: a fetcher that flips a byte is caught by
// the piece checksum and the piece is fetched again; so is a piece damaged
// on disk, found when the assembly resumes.
func TestAssembleRefetchesCorruption(t *testing.T) {
	m := writeModel(t, denseSpec)
	spec := tpSpec(m.sha)
	l := signedLayout(t, m, spec, 32<<10)
	var lf LocalFetcher
	lf.Add(m.sha, bytes.NewReader(m.raw))
	path := filepath.Join(t.TempDir(), "s.shard")
	target := l.Pieces[len(l.Pieces)/2].Segs[0].Src
	bad := &recordingFetcher{inner: &lf, budget: -1, corrupt: target}
	pr, err := Assemble(context.Background(), path, l, bad, AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pr.Refetched != 1 || pr.Fetched != l.Bytes()+l.Pieces[len(l.Pieces)/2].Size() {
		t.Errorf("progress %+v: want one refetch of piece %d (%d bytes)", pr, len(l.Pieces)/2, l.Pieces[len(l.Pieces)/2].Size())
	}
	sameAsLocal(t, m, spec, path)

	// Damage a piece on disk; the next assembly finds and refetches it.
	sf, err := openFile(path, l)
	if err != nil {
		t.Fatal(err)
	}
	victim := 1
	seg := l.Pieces[victim].Segs[0]
	b := []byte{0}
	sf.f.ReadAt(b, sf.dataOff+seg.Dst)
	b[0] ^= 1
	if _, err := sf.f.WriteAt(b, sf.dataOff+seg.Dst); err != nil {
		t.Fatal(err)
	}
	sf.f.Close()
	fresh := &recordingFetcher{inner: &lf, budget: -1, corrupt: -1}
	pr, err = Assemble(context.Background(), path, l, fresh, AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pr.Resumed != len(l.Pieces)-1 || pr.Fetched != l.Pieces[victim].Size() {
		t.Errorf("after damage: %+v; want piece %d (%d bytes) refetched alone", pr, victim, l.Pieces[victim].Size())
	}
	sameAsLocal(t, m, spec, path)

	// A fetcher that always corrupts gives up after the attempts.
	always := &corruptAll{inner: &lf}
	path2 := filepath.Join(t.TempDir(), "s2.shard")
	if _, err := Assemble(context.Background(), path2, l, always, AssembleOptions{Attempts: 2}); err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Errorf("always-corrupt fetcher: %v", err)
	}
}

type corruptAll struct{ inner RangeFetcher }

func (c *corruptAll) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	rc, err := c.inner.Fetch(ctx, sha, off, n)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if len(b) > 0 {
		b[len(b)-1] ^= 0xff
	}
	return io.NopCloser(bytes.NewReader(b)), err
}

// TestPlanSpecsSlice plans the synth models on a few clusters and checks
// that every node's specs slice cleanly (the planner's head and FFN units
// match the block rules here) and that, together, the nodes hold every
// byte of every layer tensor exactly once for split tensors.
func TestPlanSpecsSlice(t *testing.T) {
	for _, s := range []synth.Spec{denseSpec, moeSpec} {
		m := writeModel(t, s)
		prof, err := placement.ProfileFromGGUF(m.f)
		if err != nil {
			t.Fatal(err)
		}
		for _, strategy := range []placement.Strategy{placement.Tensor, placement.Pipeline} {
			var nodes []placement.Node
			for i := range 3 {
				nodes = append(nodes, placement.Node{ID: fmt.Sprintf("n%d", i), Status: placement.StatusAlive, MemFree: uint64(8+4*i) << 20, GFLOPS: float64(100 * (i + 1)), MemGBps: 20})
			}
			plan, err := placement.Place(prof, nodes, placement.LinkMatrix{}, placement.Options{Strategy: strategy, Overhead: 1 << 20, Context: 64})
			if err != nil {
				t.Fatalf("%s %s: %v", s.Name, strategy, err)
			}
			held := map[string]int64{}
			for _, n := range nodes {
				for _, spec := range SpecsFor(plan, n.ID, m.sha) {
					sl, err := spec.Slices(m.table)
					if err != nil {
						t.Fatalf("%s %s node %s: %v\n%s", s.Name, strategy, n.ID, err, plan)
					}
					for i := range sl {
						held[sl[i].Name] += sl[i].Size()
					}
					sh, err := Open(m.path, spec)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := sh.Model(); err != nil {
						t.Errorf("%s %s node %s: the engine does not take the shard: %v", s.Name, strategy, n.ID, err)
					}
					sh.Close()
				}
			}
			for _, ti := range m.f.Tensors {
				_, role, ok := model.LayerTensor(ti.Name)
				if !ok || !strings.Contains(role, "attn_") && !strings.Contains(role, "ffn_") || strings.Contains(role, "norm") || strings.Contains(role, "gate_inp") {
					continue
				}
				if held[ti.Name] != int64(ti.Size) {
					t.Errorf("%s %s: %s held %d bytes in all, it has %d\n%s", s.Name, strategy, ti.Name, held[ti.Name], ti.Size, plan)
				}
			}
		}
	}
}

// total is the number of bytes in rs.
func total(rs []Range) int64 {
	n := int64(0)
	for _, r := range rs {
		n += r.N
	}
	return n
}
