package enginetest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
)

// Tiny is the small model of tests that serve requests: a 2-layer Q8_0
// llama of 128 wide with 2 KV heads.
var Tiny = synth.Spec{Arch: "llama", NEmbd: 128, NLayer: 2, NHead: 4, NHeadKV: 2, NFF: 256, Type: "q8_0", Seed: 5, Std: 0.08}

// Vocab is the tokenizer metadata of the synthetic models: a byte-level
// BPE vocabulary of 300 pieces padded to 512 tokens.
func Vocab(t testing.TB) []gguf.KV {
	t.Helper()
	kvs, err := vocabKVs()
	if err != nil {
		t.Fatal(err)
	}
	return kvs
}

func vocabKVs() ([]gguf.KV, error) {
	v, err := tokenizer.ByteLevelVocab(300)
	if err != nil {
		return nil, err
	}
	v.Pad(512)
	return v.KVs(), nil
}

// Image returns the GGUF file of s, with Vocab when s has no tokenizer.
func Image(t testing.TB, s synth.Spec) []byte {
	t.Helper()
	if s.Tokenizer == nil {
		s.Tokenizer = Vocab(t)
	}
	var buf bytes.Buffer
	if err := synth.Write(&buf, s, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Write writes the model of s (see Image) to dir/NAME.gguf, NAME being
// s.Name or "model", and returns the path; dir "" is a new t.TempDir.
func Write(t testing.TB, dir string, s synth.Spec) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	name := s.Name
	if name == "" {
		name = "model"
	}
	path := filepath.Join(dir, name+".gguf")
	if err := os.WriteFile(path, Image(t, s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Open writes the model of s to a temporary folder and opens it; the model
// is closed when the test ends.
func Open(t testing.TB, s synth.Spec) *model.Model {
	t.Helper()
	return OpenPath(t, Write(t, "", s))
}

// OpenPath opens the model at path, closed when the test ends.
func OpenPath(t testing.TB, path string) *model.Model {
	t.Helper()
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Parse reads the GGUF file at path into memory and parses it: the bytes
// (which the file's tensor views alias) and the file.
func Parse(t testing.TB, path string) ([]byte, *gguf.File) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, f
}
