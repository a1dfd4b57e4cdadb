package enginetest_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/synth"
)

var writeArchs = flag.String("write-archs", "", "write the models of testdata/archs' spec.json cases into this folder as CASE.gguf (for llama-oracle's case) and their hashes into each case's model.sha256")

// TestArchCases: every case of testdata/archs has its model (written from
// spec.json with the recorded hash, or kept as model.gguf), which opens,
// and logits for each of its tokens.
func TestArchCases(t *testing.T) {
	if *writeArchs != "" {
		specs, _ := filepath.Glob(filepath.Join(enginetest.ArchDir(), "*", "spec.json"))
		for _, sj := range specs {
			dir := filepath.Dir(sj)
			s, err := enginetest.SpecOf(dir)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := synth.Write(&buf, s, nil); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(buf.Bytes())
			if err := os.WriteFile(filepath.Join(dir, "model.sha256"), []byte(hex.EncodeToString(sum[:])+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(*writeArchs, filepath.Base(dir)+".gguf"), buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := enginetest.ArchCases(t)
	if len(cases) == 0 {
		t.Fatal("no cases in testdata/archs")
	}
	for _, c := range cases {
		m, err := model.Open(c.Model)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if m.NVocab != c.NVocab || len(c.Logits) != len(c.Tokens)*c.NVocab {
			t.Errorf("%s: n_vocab %d, the case's %d; %d logits for %d tokens", c.Name, m.NVocab, c.NVocab, len(c.Logits), len(c.Tokens))
		}
		m.Close()
	}
}
