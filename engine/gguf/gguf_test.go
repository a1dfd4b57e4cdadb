package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"shoal/engine/quant"
)

// sample builds a small GGUF image with every metadata type and two tensors.
func sample(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	kvs := []struct {
		k string
		v any
	}{
		{"general.architecture", "llama"},
		{"u8", uint8(7)}, {"i8", int8(-7)}, {"u16", uint16(700)}, {"i16", int16(-700)},
		{"u32", uint32(70000)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"b", true},
		{"u64", uint64(1 << 40)}, {"i64", int64(-1 << 40)}, {"f64", 2.25},
		{"tokens", []string{"a", "", "ü"}}, {"scores", []float32{0, -1.5}}, {"types", []int32{1, 2, 3}},
		{"flags", []bool{true, false}},
	}
	for _, kv := range kvs {
		if err := w.AddKV(kv.k, kv.v); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.AddTensor("a", quant.F32, 4, 2); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("b", quant.Q8_0, 32); err != nil {
		t.Fatal(err)
	}
	a := make([]byte, 32)
	for i := 0; i < 8; i++ {
		binary.LittleEndian.PutUint32(a[4*i:], uint32(i))
	}
	if err := w.WriteTensor("a", a); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("b", bytes.Repeat([]byte{9}, 34)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	img := sample(t)
	f, err := Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || len(f.KVs) != 16 || len(f.Tensors) != 2 {
		t.Fatalf("version %d, %d kvs, %d tensors", f.Version, len(f.KVs), len(f.Tensors))
	}
	if s, _ := f.String("general.architecture"); s != "llama" {
		t.Errorf("architecture %q", s)
	}
	if v, _ := f.Int("i64"); v != -1<<40 {
		t.Errorf("i64 %d", v)
	}
	if v, _ := f.Uint("u16"); v != 700 {
		t.Errorf("u16 %d", v)
	}
	if _, ok := f.Uint("i8"); ok {
		t.Errorf("negative int8 read as uint")
	}
	if v, _ := f.Float("f64"); v != 2.25 {
		t.Errorf("f64 %v", v)
	}
	if s, _ := f.Strings("tokens"); !reflect.DeepEqual(s, []string{"a", "", "ü"}) {
		t.Errorf("tokens %q", s)
	}
	kv, _ := f.Lookup("scores")
	if !reflect.DeepEqual(kv.Value, []float32{0, -1.5}) {
		t.Errorf("scores %v", kv.Value)
	}
	kv, _ = f.Lookup("flags")
	if !reflect.DeepEqual(kv.Value, []bool{true, false}) {
		t.Errorf("flags %v", kv.Value)
	}
	ta, _ := f.Tensor("a")
	if ta.Rows() != 2 || ta.RowSize() != 16 || ta.Size != 32 {
		t.Errorf("tensor a %+v", ta)
	}
	if got := binary.LittleEndian.Uint32(f.Data(ta)[28:]); got != 7 {
		t.Errorf("tensor a value 7 has bits %d", got)
	}
	tb, _ := f.Tensor("b")
	if tb.Offset%32 != 0 || f.DataOffset%32 != 0 || len(f.Data(tb)) != 34 || f.Data(tb)[33] != 9 {
		t.Errorf("tensor b %+v", tb)
	}
}

func TestOpenFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(p, sample(t), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors) != 2 {
		t.Fatal("tensors")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); err == nil {
		t.Error("missing file opened")
	}
}

func TestCorrupt(t *testing.T) {
	img := sample(t)
	cases := map[string]struct {
		mutate func([]byte) []byte
		want   string
	}{
		"empty":        {func(b []byte) []byte { return nil }, "truncated"},
		"magic":        {func(b []byte) []byte { b[0] = 'X'; return b }, "bad magic"},
		"version":      {func(b []byte) []byte { b[4] = 9; return b }, "unsupported GGUF version 9"},
		"huge tensors": {func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<60); return b }, "tensor count"},
		"huge kvs":     {func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 1<<62); return b }, "metadata count"},
		"huge key":     {func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1<<50); return b }, "exceeds"},
		"truncated":    {func(b []byte) []byte { return b[:len(b)-40] }, "runs past the end"},
		"header only":  {func(b []byte) []byte { return b[:100] }, "cannot fit"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b := c.mutate(append([]byte(nil), img...))
			_, err := Parse(b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("not a FormatError: %T", err)
			}
		})
	}
}

func TestSharedVocab(t *testing.T) {
	p := filepath.Join("..", "..", "..", "shared", "tokenizer", "ggml-vocab-llama-spm.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skip("../shared absent")
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	toks, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(toks) != 32000 {
		t.Fatalf("tokens: %d", len(toks))
	}
	if m, _ := f.String("tokenizer.ggml.model"); m != "llama" {
		t.Errorf("model %q", m)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sample(f))
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Parse(b)
		if err != nil {
			return
		}
		for i := range g.Tensors {
			_ = g.Data(&g.Tensors[i])
		}
	})
}

func TestParseHeader(t *testing.T) {
	img := sample(t)
	full, err := Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	hdr := img[:full.DataOffset] // the header as a shard file keeps it: no tensor data
	f, err := ParseHeader(hdr)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 0 {
		t.Errorf("%d tensors, want none", len(f.Tensors))
	}
	if !reflect.DeepEqual(f.KVs, full.KVs) {
		t.Errorf("metadata differs from the whole file's")
	}
	if s, _ := f.String("general.architecture"); s != "llama" {
		t.Errorf("architecture %q", s)
	}
	if binary.LittleEndian.Uint64(hdr[8:]) != 2 {
		t.Error("ParseHeader changed its input")
	}
	cases := map[string]struct {
		hdr  []byte
		want string
	}{
		"empty":     {nil, "truncated"},
		"short":     {hdr[:20], "truncated"},
		"magic":     {append([]byte("GGUX"), hdr[4:]...), "bad magic"},
		"version 1": {append(append([]byte("GGUF"), 1, 0, 0, 0), hdr[8:]...), "unsupported GGUF version 1"},
		"cut kvs":   {hdr[:60], "cannot fit"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseHeader(c.hdr)
			var fe *FormatError
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &fe) {
				t.Fatalf("err %v, want a FormatError with %q", err, c.want)
			}
		})
	}
}

// The value-type tags are the format's numbers, written in its order.
func TestValueTypeNumbers(t *testing.T) {
	got := []ValueType{TypeUint8, TypeInt8, TypeUint16, TypeInt16, TypeUint32, TypeInt32, TypeFloat32,
		TypeBool, TypeString, TypeArray, TypeUint64, TypeInt64, TypeFloat64}
	for want, vt := range got {
		if int(vt) != want {
			t.Errorf("value type %d has number %d", want, vt)
		}
	}
}
