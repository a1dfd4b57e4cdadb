package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/engine/gguf"
	"shoal/shard"
	"shoal/transport"
)

// countBuilds counts the layouts built (shard.NewLayout) until the test ends.
// The agent builds them on its RPC goroutines: the count is atomic.
func countBuilds(t *testing.T) *atomic.Int64 {
	n := new(atomic.Int64)
	orig := buildLayout
	buildLayout = func(tb *shard.Table, spec shard.ShardSpec, piece int64) (*shard.Layout, error) {
		n.Add(1)
		return orig(tb, spec, piece)
	}
	t.Cleanup(func() { buildLayout = orig })
	return n
}

// TestLayoutPieceSizeBounded: a peer that asks Weights.Layout for pieces
// of one byte (a reply of 67 bytes per byte of the shard), or of a size
// that makes signing read gigabytes at once, is refused with a 400 that
// says what to ask, and no layout is built; the default and 64 KiB pieces
// are still served.
func TestLayoutPieceSizeBounded(t *testing.T) {
	f := newWeightsFixture(t, nil)
	builds := countBuilds(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := f.tpShard()
	for _, piece := range []int64{1, 4096, minLayoutPiece - 1, maxLayoutPiece + 1, 1 << 40} {
		_, err := fetchLayout(ctx, f.client, f.srcEP.Addr().String(), spec, piece)
		var re *transport.RPCError
		if !errors.As(err, &re) || re.Code != http.StatusBadRequest || !strings.Contains(err.Error(), "piece size") {
			t.Fatalf("piece size %d: %v, want a 400 about the piece size", piece, err)
		}
		if n := builds.Load(); n != 0 {
			t.Fatalf("piece size %d: %d layouts built before the request was refused", piece, n)
		}
		t.Logf("piece size %d: %v", piece, err)
	}
	for _, piece := range []int64{0, minLayoutPiece} {
		l, err := fetchLayout(ctx, f.client, f.srcEP.Addr().String(), spec, piece)
		if err != nil {
			t.Fatalf("piece size %d: %v", piece, err)
		}
		t.Logf("piece size %d: %d pieces", piece, len(l.Pieces))
	}
}

// TestLayoutReplyBoundedBeforeBuilt: a shard whose checksums would not
// fit an RPC frame even in the smallest pieces allowed is refused from its
// piece count (413), before a piece is built.
func TestLayoutReplyBoundedBeforeBuilt(t *testing.T) {
	f := newWeightsFixture(t, nil)
	builds := countBuilds(t)
	g, err := gguf.Open(f.path)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := shard.TableOf(g)
	g.Close()
	if err != nil {
		t.Fatal(err)
	}
	req := layoutRequest{Spec: f.tpShard(), PieceSize: minLayoutPiece}
	if err := checkLayoutSize(tb, req); err != nil {
		t.Fatalf("the fixture's shard: %v", err)
	}
	// The same table with an 8 GiB header: 131,072 pieces of 64 KiB, a
	// reply of 8.8 MB.
	big := *tb
	big.DataOffset += 8 << 30
	big.FileSize += 8 << 30
	err = checkLayoutSize(&big, req)
	var ce interface{ HTTPStatus() int }
	if !errors.As(err, &ce) || ce.HTTPStatus() != http.StatusRequestEntityTooLarge || !strings.Contains(err.Error(), "frame limit") {
		t.Fatalf("an 8 GiB shard in 64 KiB pieces: %v, want a 413 about the frame limit", err)
	}
	t.Log(err)
	// The handler itself refuses before building too.
	body, _ := json.Marshal(layoutRequest{Spec: f.tpShard(), PieceSize: 1})
	if _, err := f.source.layouts.serve(f.source.files, "source", body); err == nil {
		t.Fatal("a 1-byte piece size was served")
	}
	if n := builds.Load(); n != 0 {
		t.Fatalf("%d layouts built for refused requests", n)
	}
}

// specialFiles makes a FIFO, a directory and a socket in a temporary
// directory and names them with /dev/null (a device).
func specialFiles(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.gguf")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	sock := filepath.Join(dir, "s.gguf")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return map[string]string{"a named pipe": fifo, "a directory": dir, "a socket": sock, "a device": os.DevNull}
}

// withinASecond runs f and fails the test if it takes more than a second.
func withinASecond(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Second):
		t.Fatalf("%s still runs after a second", what)
		return nil
	}
}

// TestModelLoadRefusesSpecialFiles: model load of a FIFO (which a plain
// open would wait on for a writer forever), a directory, a socket or a
// device is a 400 within a second that names what the path is (an agent's
// --model: node's TestLocalModelRefusesSpecialFiles); and a file the
// registry served that became a FIFO is dropped at start, not waited on.
func TestModelLoadRefusesSpecialFiles(t *testing.T) {
	b := &Catalog{name: "n1"}
	for what, path := range specialFiles(t) {
		err := withinASecond(t, "model load of "+what, func() error {
			_, err := b.RegisterFile(t.Context(), api.LoadModelRequest{Path: path}, nil)
			return err
		})
		var ce interface{ HTTPStatus() int }
		if !errors.As(err, &ce) || ce.HTTPStatus() != http.StatusBadRequest || !strings.Contains(err.Error(), what) {
			t.Fatalf("model load of %s: %v, want a 400 that says it is %s", what, err, what)
		}
		t.Logf("model load of %s: %v", what, err)
	}
	// files.json names a file that is a FIFO now.
	dir := t.TempDir()
	fifo := filepath.Join(dir, "was-a-model.gguf")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	list, _ := json.Marshal([]localFile{{SHA: strings.Repeat("ab", 32), Path: fifo, Size: 1}})
	if err := os.WriteFile(filepath.Join(dir, filesFile), list, 0o600); err != nil {
		t.Fatal(err)
	}
	_ = withinASecond(t, "reopening the served files", func() error {
		r := openFileRegistry(dir, zap.NewNop())
		defer r.close()
		if _, ok := r.get(strings.Repeat("ab", 32)); ok {
			t.Error("a FIFO was registered as a model file")
		}
		return nil
	})
}
