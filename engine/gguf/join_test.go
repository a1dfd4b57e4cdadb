package gguf_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
)

// TestJoin: a model split in three parts joins into a file with the
// model's metadata (no split keys) and every tensor with the same bytes;
// parts out of order, missing or not split are refused before anything
// is written.
func TestJoin(t *testing.T) {
	src := enginetest.Image(t, enginetest.Tiny)
	f, err := gguf.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	parts := enginetest.SplitGGUF(t, src, dir, "tiny", 3)
	var out bytes.Buffer
	if err := gguf.Join(parts, &out); err != nil {
		t.Fatal(err)
	}
	j, err := gguf.Parse(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := gguf.Split(j); ok || j.Has("split.no") {
		t.Fatal("the joined file still has split keys")
	}
	if len(j.KVs) != len(f.KVs) || len(j.Tensors) != len(f.Tensors) {
		t.Fatalf("joined: %d keys %d tensors, the model %d and %d", len(j.KVs), len(j.Tensors), len(f.KVs), len(f.Tensors))
	}
	for i := range f.Tensors {
		a, b := &f.Tensors[i], &j.Tensors[i]
		if a.Name != b.Name || a.Type != b.Type || !bytes.Equal(f.Data(a), j.Data(b)) {
			t.Fatalf("tensor %d: %s differs after the join", i, a.Name)
		}
	}
	whole := filepath.Join(dir, "whole.gguf")
	if err := os.WriteFile(whole, src, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		paths []string
		want  string
	}{
		{"out of order", []string{parts[1], parts[0], parts[2]}, "expected part 0"},
		{"missing a part", parts[:2], "3 parts"},
		{"not split", []string{whole, parts[1], parts[2]}, "no split.count"},
		{"a part twice", []string{parts[0], parts[1], parts[1]}, "expected part 2"},
	} {
		var sink bytes.Buffer
		if err := gguf.Join(tc.paths, &sink); err == nil || !strings.Contains(err.Error(), tc.want) || sink.Len() != 0 {
			t.Errorf("%s: %v (wrote %d bytes), want an error saying %q", tc.name, err, sink.Len(), tc.want)
		}
	}
}
