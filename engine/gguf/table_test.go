package gguf

import (
	"reflect"
	"testing"
)

// ParseTable reads the tensor table from any prefix that holds it, checked
// against the file's size, and fails on a shorter prefix (the caller
// fetches more) or on a table that does not fit the size.
func TestParseTable(t *testing.T) {
	img := sample(t)
	full, err := Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(img))
	for _, n := range []uint64{full.DataOffset, full.DataOffset + 3, uint64(len(img))} {
		f, err := ParseTable(img[:n], size)
		if err != nil {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
		if !reflect.DeepEqual(f.Tensors, full.Tensors) || !reflect.DeepEqual(f.KVs, full.KVs) || f.DataOffset != full.DataOffset {
			t.Errorf("prefix of %d bytes: table differs from the whole file's", n)
		}
	}
	if _, err := ParseTable(img[:full.DataOffset-40], size); err == nil {
		t.Error("a prefix cut in the tensor table parsed")
	}
	if _, err := ParseTable(img[:full.DataOffset], int64(full.DataOffset)+4); err == nil {
		t.Error("a table running past the file's size parsed")
	}
}
