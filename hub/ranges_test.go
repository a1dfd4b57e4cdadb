package hub_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"shoal/hub"
)

// Resolve names one single-file GGUF with its size and LFS sha256, and
// refuses a split model (it is pulled instead).
func TestResolve(t *testing.T) {
	srv, _, c, files := setup(t)
	r, f, err := c.Resolve(context.Background(), repo+":Q8_0", "")
	if err != nil {
		t.Fatal(err)
	}
	const name = "qwen2.5-0.5b-instruct-q8_0.gguf"
	if r.Repo != repo || f.Path != name || f.Size != int64(len(files[name])) || f.SHA256 == "" {
		t.Fatalf("resolved %+v %+v", r, f)
	}
	srv.AddRepo("o/split-GGUF", map[string][]byte{"m-q4_0-00001-of-00002.gguf": data(10, 1), "m-q4_0-00002-of-00002.gguf": data(10, 2)})
	if _, _, err := c.Resolve(context.Background(), "o/split-GGUF:Q4_0", ""); err == nil || !strings.Contains(err.Error(), "split model") || !strings.Contains(err.Error(), "shoal pull") {
		t.Fatalf("split model: %v", err)
	}
	if _, _, err := c.Resolve(context.Background(), "o/none:Q4_0", ""); !errors.Is(err, hub.ErrNotFound) {
		t.Fatalf("missing repo: %v", err)
	}
}

// ReadRange reads exactly the bytes asked for with one Range request, and
// a connection cut mid-range resumes from the first byte not delivered.
func TestReadRangeResumesAfterCut(t *testing.T) {
	srv, _, c, files := setup(t)
	const f = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
	want := files[f][1000:201000]
	srv.CutOnce(repo, f, 50_000)
	rc := c.ReadRange(context.Background(), repo, "", f, 1000, 200_000)
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the file's [1000,+200000)", len(got))
	}
	var ranges []string
	for _, r := range srv.Requests() {
		if r.Status == http.StatusPartialContent {
			ranges = append(ranges, r.Range)
		}
	}
	if strings.Join(ranges, " ") != "bytes=1000-200999 bytes=51000-200999" {
		t.Fatalf("range requests %q", ranges)
	}
	if n := srv.BytesServed(repo, f); n != 200_000 {
		t.Fatalf("served %d bytes for a 200000-byte range", n)
	}
}
