package hub_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/hub"
	"shoal/hub/hubtest"
)

const repo = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"

func data(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// setup starts a fake hub with a typical GGUF repository.
func setup(t *testing.T) (*hubtest.Server, *hub.Store, *hub.Client, map[string][]byte) {
	t.Helper()
	files := map[string][]byte{
		"README.md":                         []byte("# readme\n"),
		"qwen2.5-0.5b-instruct-q4_k_m.gguf": data(300_000, 1),
		"qwen2.5-0.5b-instruct-q8_0.gguf":   data(200_000, 2),
		"qwen2.5-0.5b-instruct-q4_k.gguf":   data(100_000, 3),
	}
	srv := hubtest.New(t)
	srv.AddRepo(repo, files)
	st, err := hub.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &hub.Client{Endpoint: srv.URL, Backoff: time.Millisecond}
	return srv, st, c, files
}

func blobs(t *testing.T, st *hub.Store) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(st.Dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func checkBlob(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the hub's %d", path, len(got), len(want))
	}
	if filepath.Base(path) != "sha256-"+hubtest.SHA256(want) {
		t.Fatalf("blob %s is not named by its sha256", path)
	}
}

func TestPullDefaultsToQ4KMWithProgressAndName(t *testing.T) {
	srv, st, c, files := setup(t)
	var last, total int64
	calls := 0
	m, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: c, Progress: func(d, tot int64) {
		if d < last && d != 0 {
			t.Errorf("progress went back from %d to %d", last, d)
		}
		last, total = d, tot
		calls++
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := files["qwen2.5-0.5b-instruct-q4_k_m.gguf"]
	if m.Name != "qwen2.5-0.5b-instruct:q4_k_m" || len(m.Parts) != 1 || m.Parts[0].Path != "qwen2.5-0.5b-instruct-q4_k_m.gguf" {
		t.Fatalf("manifest %+v", m)
	}
	if last != int64(len(want)) || total != int64(len(want)) || calls < 3 {
		t.Fatalf("progress ended at %d of %d after %d calls, want %d", last, total, calls, len(want))
	}
	checkBlob(t, st.Paths(*m)[0], want)
	if n := srv.TotalBytesServed(); n != int64(len(want)) {
		t.Fatalf("served %d bytes, want %d", n, len(want))
	}
	// The token stays on the hub's host; the CDN is another host.
	for _, r := range srv.Requests() {
		if r.Auth {
			t.Fatalf("request %+v carried Authorization without a token", r)
		}
	}
}

func TestQuantSelection(t *testing.T) {
	_, st, c, files := setup(t)
	ctx := context.Background()
	m, err := st.Pull(ctx, repo+":q8_0", hub.PullOptions{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "qwen2.5-0.5b-instruct:q8_0" {
		t.Fatalf("name %q", m.Name)
	}
	checkBlob(t, st.Paths(*m)[0], files["qwen2.5-0.5b-instruct-q8_0.gguf"])
	// Q4_K must not match q4_k_m.
	m, err = st.Pull(ctx, repo+":Q4_K", hub.PullOptions{Client: c})
	if err != nil || m.Parts[0].Path != "qwen2.5-0.5b-instruct-q4_k.gguf" {
		t.Fatalf("Q4_K: %v %+v", err, m)
	}
	if _, err := st.Pull(ctx, repo+":Q2_K", hub.PullOptions{Client: c}); !errors.Is(err, hub.ErrNotFound) || !strings.Contains(err.Error(), "q8_0.gguf") {
		t.Fatalf("missing quant: %v", err)
	}
	// An explicit file in a subfolder.
	m, err = st.Pull(ctx, repo+"/qwen2.5-0.5b-instruct-q8_0.gguf", hub.PullOptions{Client: c, Name: "mine"})
	if err != nil || m.Name != "mine" {
		t.Fatalf("explicit file: %v %+v", err, m)
	}
}

func TestAmbiguity(t *testing.T) {
	srv := hubtest.New(t)
	srv.AddRepo("a/Two-GGUF", map[string][]byte{
		"two-q8_0.gguf":       data(10, 1),
		"two-f16.gguf":        data(10, 2),
		"other/two-q8_0.gguf": data(10, 3),
	})
	st, _ := hub.OpenStore(t.TempDir())
	c := &hub.Client{Endpoint: srv.URL}
	_, err := st.Pull(context.Background(), "a/Two-GGUF", hub.PullOptions{Client: c})
	if err == nil || !strings.Contains(err.Error(), "several models") || !strings.Contains(err.Error(), "two-f16.gguf") {
		t.Fatalf("no quant, no Q4_K_M: %v", err)
	}
	_, err = st.Pull(context.Background(), "a/Two-GGUF:Q8_0", hub.PullOptions{Client: c})
	if err == nil || !strings.Contains(err.Error(), "ambiguous") || !strings.Contains(err.Error(), "other/two-q8_0.gguf") {
		t.Fatalf("two q8_0 files: %v", err)
	}
	m, err := st.Pull(context.Background(), "a/Two-GGUF/other/two-q8_0.gguf", hub.PullOptions{Client: c})
	if err != nil || m.Name != "two:q8_0" {
		t.Fatalf("explicit file in a subfolder: %v %+v", err, m)
	}
}

func TestResumeAfterCut(t *testing.T) {
	for _, cross := range []bool{true, false} {
		srv, st, c, files := setup(t)
		srv.CrossHost(cross)
		const f = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
		want := files[f]
		srv.CutOnce(repo, f, 123_457)
		m, err := st.Pull(context.Background(), repo+":Q4_K_M", hub.PullOptions{Client: c})
		if err != nil {
			t.Fatal(err)
		}
		checkBlob(t, st.Paths(*m)[0], want)
		if n := srv.BytesServed(repo, f); n > int64(len(want))*101/100 {
			t.Fatalf("served %d bytes for a %d-byte file", n, len(want))
		}
		ranged := false
		for _, r := range srv.Requests() {
			ranged = ranged || r.Range == "bytes=123457-" && r.Status == http.StatusPartialContent
		}
		if !ranged {
			t.Fatalf("no resumed range request: %+v", srv.Requests())
		}
	}
}

func TestServerIgnoringRangeRestarts(t *testing.T) {
	srv, st, c, files := setup(t)
	const f = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
	srv.CutOnce(repo, f, 1000)
	srv.IgnoreRange(true)
	m, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	checkBlob(t, st.Paths(*m)[0], files[f])
}

func TestResumeAcrossRuns(t *testing.T) {
	srv, st, _, files := setup(t)
	const f = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
	srv.CutOnce(repo, f, 50_000)
	one := &hub.Client{Endpoint: srv.URL, MaxAttempts: 1}
	if _, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: one}); err == nil || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("cut with one attempt: %v", err)
	}
	m, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: one})
	if err != nil {
		t.Fatal(err)
	}
	checkBlob(t, st.Paths(*m)[0], files[f])
	if n := srv.BytesServed(repo, f); n != int64(len(files[f])) {
		t.Fatalf("served %d bytes over two runs, want %d", n, len(files[f]))
	}
}

func TestChecksumMismatch(t *testing.T) {
	srv, st, c, _ := setup(t)
	srv.WrongSHA(repo, "qwen2.5-0.5b-instruct-q4_k_m.gguf")
	_, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: c})
	if !errors.Is(err, hub.ErrChecksum) || !strings.Contains(err.Error(), "sha256 mismatch: got ") || !strings.Contains(err.Error(), "corrupted or the file changed") {
		t.Fatalf("wrong sha256: %v", err)
	}
	if b := blobs(t, st); len(b) != 0 {
		t.Fatalf("blobs left after a mismatch: %v", b)
	}
	if ms, _ := st.List(); len(ms) != 0 {
		t.Fatalf("manifest written after a mismatch: %+v", ms)
	}
}

func TestSplitModel(t *testing.T) {
	srv := hubtest.New(t)
	parts := map[string][]byte{}
	for i, name := range []string{"Q4_K_M/big-q4_k_m-00001-of-00003.gguf", "Q4_K_M/big-q4_k_m-00002-of-00003.gguf", "Q4_K_M/big-q4_k_m-00003-of-00003.gguf"} {
		parts[name] = data(50_000+i, uint64(i+10))
	}
	files := map[string][]byte{"big-q8_0.gguf": data(10, 9)}
	for k, v := range parts {
		files[k] = v
	}
	srv.AddRepo("u/Big-GGUF", files)
	st, _ := hub.OpenStore(t.TempDir())
	c := &hub.Client{Endpoint: srv.URL}
	var last, total int64
	m, err := st.Pull(context.Background(), "u/Big-GGUF:Q4_K_M", hub.PullOptions{Client: c, Progress: func(d, tot int64) { last, total = d, tot }})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "big:q4_k_m" || len(m.Parts) != 3 || last != total || total != 150_003 {
		t.Fatalf("manifest %+v, progress %d/%d", m, last, total)
	}
	paths := st.Paths(*m)
	for i, p := range m.Parts {
		if !strings.HasSuffix(p.Path, []string{"00001-of-00003.gguf", "00002-of-00003.gguf", "00003-of-00003.gguf"}[i]) {
			t.Fatalf("part %d is %s", i, p.Path)
		}
		checkBlob(t, paths[i], parts[p.Path])
	}
	// Naming the second part selects the whole model too.
	m2, err := st.Pull(context.Background(), "u/Big-GGUF/Q4_K_M/big-q4_k_m-00002-of-00003.gguf", hub.PullOptions{Client: c})
	if err != nil || len(m2.Parts) != 3 {
		t.Fatalf("second part: %v %+v", err, m2)
	}
	got, err := st.Resolve("big:q4_k_m")
	if err != nil || len(got) != 3 || got[0] != paths[0] {
		t.Fatalf("resolve: %v %v", got, err)
	}
	// Joined once into a blob of its own, which the store keeps while the
	// model is there (removing another model collects only that one's).
	if _, ok := st.LoadPath(*m); ok {
		t.Fatal("a split model has a load path before it is joined")
	}
	calls := 0
	join := func(w io.Writer) error {
		calls++
		for _, p := range paths {
			b, _ := os.ReadFile(p)
			w.Write(b)
		}
		return nil
	}
	if m, err = st.Join("big:q4_k_m", join); err != nil {
		t.Fatal(err)
	}
	if _, err = st.Join("big:q4_k_m", join); err != nil || calls != 1 {
		t.Fatalf("second join: %v, %d writes", err, calls)
	}
	load, ok := st.LoadPath(*m)
	if !ok || m.Joined == nil || m.Joined.Size != 150_003 {
		t.Fatalf("joined: %+v %q", m.Joined, load)
	}
	if err := st.Remove("big:q8_0"); err == nil {
		t.Fatal("removed a model never pulled")
	}
	if _, err := st.Pull(context.Background(), "u/Big-GGUF:Q8_0", hub.PullOptions{Client: c}); err != nil {
		t.Fatal(err)
	}
	if err := st.Remove("big:q8_0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(load); err != nil {
		t.Fatalf("the joined file was collected: %v", err)
	}
	if err := st.Remove("big:q4_k_m"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(load); !os.IsNotExist(err) {
		t.Fatalf("the joined file outlived its model: %v", err)
	}
}

func TestGatedRepo(t *testing.T) {
	for _, status := range []int{401, 403} {
		srv, st, _, files := setup(t)
		srv.Gate(repo, status, "secret")
		_, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: &hub.Client{Endpoint: srv.URL}})
		if !errors.Is(err, hub.ErrGated) || !strings.Contains(err.Error(), "accept the license") || !strings.Contains(err.Error(), "HF_TOKEN") || !strings.Contains(err.Error(), "GatedRepo") {
			t.Fatalf("gated without a token: %v", err)
		}
		t.Setenv("HF_TOKEN", "secret")
		t.Setenv("HF_ENDPOINT", srv.URL)
		c := hub.NewClient()
		c.Backoff = time.Millisecond
		m, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: c})
		if err != nil {
			t.Fatal(err)
		}
		checkBlob(t, st.Paths(*m)[0], files["qwen2.5-0.5b-instruct-q4_k_m.gguf"])
		for _, r := range srv.Requests() {
			if r.Auth != (r.Host == strings.TrimPrefix(srv.URL, "http://")) {
				t.Fatalf("Authorization sent to the wrong host: %+v", r)
			}
		}
	}
}

func TestNotFound(t *testing.T) {
	_, st, c, _ := setup(t)
	_, err := st.Pull(context.Background(), "nobody/Nothing-GGUF", hub.PullOptions{Client: c})
	if !errors.Is(err, hub.ErrNotFound) || !strings.Contains(err.Error(), "no such repo or file") {
		t.Fatalf("missing repo: %v", err)
	}
	_, err = st.Pull(context.Background(), repo+"/nope.gguf", hub.PullOptions{Client: c})
	if !errors.Is(err, hub.ErrNotFound) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestSecondPullDownloadsNothingAndOffline(t *testing.T) {
	srv, st, c, _ := setup(t)
	ctx := context.Background()
	if _, err := st.Pull(ctx, repo, hub.PullOptions{Client: c, Offline: true}); !errors.Is(err, hub.ErrNotInStore) {
		t.Fatalf("offline before a pull: %v", err)
	}
	if len(srv.Requests()) != 0 {
		t.Fatal("offline pull touched the network")
	}
	m1, err := st.Pull(ctx, repo, hub.PullOptions{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	before, reqs := srv.TotalBytesServed(), len(srv.Requests())
	var last, total int64
	m2, err := st.Pull(ctx, repo+":Q4_K_M", hub.PullOptions{Client: c, Progress: func(d, tot int64) { last, total = d, tot }})
	if err != nil {
		t.Fatal(err)
	}
	if srv.TotalBytesServed() != before || len(srv.Requests()) != reqs {
		t.Fatalf("second pull downloaded %d bytes", srv.TotalBytesServed()-before)
	}
	if m1.Name != m2.Name || last != total || total == 0 {
		t.Fatalf("second pull: %+v, progress %d/%d", m2, last, total)
	}
	// Offline: the store alone, by reference or name.
	srv.Close()
	for _, ref := range []string{repo, repo + ":q4_k_m", repo + "/qwen2.5-0.5b-instruct-q4_k_m.gguf"} {
		m, err := st.Pull(ctx, ref, hub.PullOptions{Client: c, Offline: true})
		if err != nil || m.Name != m1.Name {
			t.Fatalf("offline %s: %v", ref, err)
		}
	}
	if _, err := st.Pull(ctx, repo+":Q8_0", hub.PullOptions{Client: c, Offline: true}); !errors.Is(err, hub.ErrNotInStore) {
		t.Fatalf("offline, other quant: %v", err)
	}
	for _, q := range []string{m1.Name, repo + ":Q4_K_M"} {
		if p, err := st.Resolve(q); err != nil || len(p) != 1 || p[0] != st.Paths(*m1)[0] {
			t.Fatalf("resolve %s: %v %v", q, p, err)
		}
	}
}

func TestRemoveKeepsSharedBlobs(t *testing.T) {
	_, st, c, _ := setup(t)
	ctx := context.Background()
	a, err := st.Pull(ctx, repo, hub.PullOptions{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pull(ctx, repo, hub.PullOptions{Client: c, Name: "alias"}); err != nil {
		t.Fatal(err)
	}
	if len(blobs(t, st)) != 1 {
		t.Fatalf("two names of one file stored twice: %v", blobs(t, st))
	}
	if err := st.Remove(a.Name); err != nil {
		t.Fatal(err)
	}
	if len(blobs(t, st)) != 1 {
		t.Fatal("a blob still named by alias was removed")
	}
	if err := st.Remove("alias"); err != nil {
		t.Fatal(err)
	}
	if b := blobs(t, st); len(b) != 0 {
		t.Fatalf("orphan blobs kept: %v", b)
	}
	if err := st.Remove("alias"); !errors.Is(err, hub.ErrNotInStore) {
		t.Fatalf("removing twice: %v", err)
	}
}

func TestCancel(t *testing.T) {
	_, st, c, _ := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := st.Pull(ctx, repo, hub.PullOptions{Client: c, Progress: func(d, tot int64) {
		if d > 0 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled pull: %v", err)
	}
}

func TestTreePagination(t *testing.T) {
	srv, st, c, files := setup(t)
	srv.PageSize(1)
	m, err := st.Pull(context.Background(), repo+":Q8_0", hub.PullOptions{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	checkBlob(t, st.Paths(*m)[0], files["qwen2.5-0.5b-instruct-q8_0.gguf"])
}

func TestParseRef(t *testing.T) {
	for in, want := range map[string]hub.Ref{
		"Qwen/Qwen2.5-0.5B-Instruct-GGUF":        {Repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF"},
		"Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M": {Repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF", Quant: "Q4_K_M"},
		"hf.co/a/b:q8_0":                         {Repo: "a/b", Quant: "q8_0"},
		"a/b/sub/x-00001-of-00002.gguf":          {Repo: "a/b", File: "sub/x-00001-of-00002.gguf"},
	} {
		got, err := hub.ParseRef(in)
		if err != nil || got != want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "justaname", "a/b:", "a/b/readme.md", "a/b/../x.gguf", "a/b/x.gguf:Q4"} {
		if _, err := hub.ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

func TestRevisionAndOfflineName(t *testing.T) {
	_, st, c, _ := setup(t)
	ctx := context.Background()
	if _, err := st.Pull(ctx, repo, hub.PullOptions{Client: c, Revision: "v9"}); !errors.Is(err, hub.ErrNotFound) || !strings.Contains(err.Error(), "RevisionNotFound") {
		t.Fatalf("unknown revision: %v", err)
	}
	if _, err := st.Pull(ctx, repo+":Q8_0", hub.PullOptions{Client: c, Name: "small"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pull(ctx, repo+":Q8_0", hub.PullOptions{Name: "small", Offline: true}); err != nil {
		t.Fatalf("offline by name: %v", err)
	}
	if _, err := st.Pull(ctx, repo+":Q4_K_M", hub.PullOptions{Name: "small", Offline: true}); !errors.Is(err, hub.ErrNotInStore) {
		t.Fatalf("offline, name of another model: %v", err)
	}
	if _, err := st.Pull(ctx, repo+":Q8_0", hub.PullOptions{Client: c, Name: "../evil"}); err == nil {
		t.Fatal("a name with a slash was accepted")
	}
}

func TestConcurrentPullsOfOneFile(t *testing.T) {
	srv, st, c, files := setup(t)
	const f = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: c})
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	m, err := st.Pull(context.Background(), repo, hub.PullOptions{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	checkBlob(t, st.Paths(*m)[0], files[f])
	if b := blobs(t, st); len(b) != 1 {
		t.Fatalf("blobs: %v", b)
	}
	if n := srv.BytesServed(repo, f); n > int64(len(files[f]))*101/100 {
		t.Fatalf("three concurrent pulls fetched %d bytes of a %d-byte file", n, len(files[f]))
	}
}

// TestStoredAnswersWithoutTheHub: PullOptions.Stored answers a model the
// store holds without the network: by quantization or file; a bare
// repository by its Q4_K_M file or by the model that same reference
// pulled, never by another stored file of it (the hub may choose another).
func TestStoredAnswersWithoutTheHub(t *testing.T) {
	srv, st, c, _ := setup(t)
	srv.AddRepo("solo/One-GGUF", map[string][]byte{"one-f16.gguf": data(50_000, 4)})
	ctx := context.Background()
	for _, ref := range []string{repo + ":Q8_0", "solo/One-GGUF"} {
		if _, err := st.Pull(ctx, ref, hub.PullOptions{Client: c}); err != nil {
			t.Fatal(err)
		}
	}
	down := &hub.Client{Endpoint: "http://127.0.0.1:1", Backoff: time.Millisecond, MaxAttempts: 1}
	stored := func(ref string) (string, error) {
		m, err := st.Pull(ctx, ref, hub.PullOptions{Client: down, Stored: true})
		if err != nil {
			return "", err
		}
		return m.Name, nil
	}
	for ref, want := range map[string]string{repo + ":q8_0": "qwen2.5-0.5b-instruct:q8_0", repo + "/qwen2.5-0.5b-instruct-q8_0.gguf": "qwen2.5-0.5b-instruct:q8_0", "solo/One-GGUF": "one:f16"} {
		if got, err := stored(ref); err != nil || got != want {
			t.Errorf("%s from the store: %q %v, want %s", ref, got, err, want)
		}
	}
	if got, err := stored(repo); err == nil {
		t.Errorf("bare %s answered by %s, a file the hub would not choose", repo, got)
	}
	if _, err := st.Pull(ctx, repo, hub.PullOptions{Client: c}); err != nil {
		t.Fatal(err)
	}
	if got, err := stored(repo); err != nil || got != "qwen2.5-0.5b-instruct:q4_k_m" {
		t.Errorf("bare %s once its Q4_K_M is stored: %q %v", repo, got, err)
	}
	if _, err := stored(repo + ":Q4_K"); err == nil {
		t.Error("a quantization never pulled answered from the store")
	}
}
