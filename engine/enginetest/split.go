package enginetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"shoal/engine/gguf"
)

// SplitGGUF writes the model file image as n parts the way gguf-split does
// (stem-0000I-of-0000N.gguf in dir): every part carries split.no,
// split.count and split.tensors.count, the first also the model's
// metadata, each a run of the tensors with their data. It returns the
// parts' paths in order.
func SplitGGUF(t testing.TB, image []byte, dir, stem string, n int) []string {
	t.Helper()
	f, err := gguf.Parse(image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var paths []string
	per := (len(f.Tensors) + n - 1) / n
	for p := range n {
		var b bytes.Buffer
		w := gguf.NewWriter(&b)
		if p == 0 {
			for _, kv := range f.KVs {
				if err := w.AddKV(kv.Key, kv.Value); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, kv := range []gguf.KV{{Key: "split.no", Value: uint16(p)}, {Key: "split.count", Value: uint16(n)}, {Key: "split.tensors.count", Value: int32(len(f.Tensors))}} {
			if err := w.AddKV(kv.Key, kv.Value); err != nil {
				t.Fatal(err)
			}
		}
		ts := f.Tensors[min(p*per, len(f.Tensors)):min((p+1)*per, len(f.Tensors))]
		for _, ti := range ts {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims...); err != nil {
				t.Fatal(err)
			}
		}
		for i := range ts {
			if err := w.WriteTensor(ts[i].Name, f.Data(&ts[i])); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("%s-%05d-of-%05d.gguf", stem, p+1, n))
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	return paths
}
