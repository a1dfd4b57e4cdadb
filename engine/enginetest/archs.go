package enginetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"shoal/engine/synth"
)

// ArchDir is the folder of the oracle cases of the architectures newer than
// ../shared/oracle's (testdata/archs beside this file), found from the
// test's working folder.
func ArchDir() string {
	return filepath.Join(moduleRoot(), "engine", "enginetest", "testdata", "archs")
}

var (
	archOnce  sync.Once
	archCases []OracleCase
	archErr   error
	archTmp   string
)

// ArchCases are the cases of testdata/archs (see its README): llama.cpp
// 0.7.0's logits for small random models of the newer architectures. A
// case keeps its model as model.gguf, or as spec.json, the synth.Spec
// (with Vocab) that writes it, and model.sha256: the file is written once
// per test process, to a temporary folder, and checked against the hash.
func ArchCases(t testing.TB) []OracleCase {
	t.Helper()
	archOnce.Do(func() { archCases, archErr = readArchCases() })
	if archErr != nil {
		t.Fatal(archErr)
	}
	return archCases
}

// ArchCase is the case of testdata/archs named name.
func ArchCase(t testing.TB, name string) OracleCase {
	t.Helper()
	for _, c := range ArchCases(t) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no case %s in testdata/archs", name)
	return OracleCase{}
}

func readArchCases() ([]OracleCase, error) {
	tjs, err := filepath.Glob(filepath.Join(ArchDir(), "*", "tokens.json"))
	if err != nil {
		return nil, err
	}
	var cases []OracleCase
	for _, tj := range tjs {
		dir := filepath.Dir(tj)
		c, err := readCaseAt(dir, archModel(dir))
		if err != nil {
			return nil, err
		}
		if c.Model, err = materializeArch(dir, c.Model); err != nil {
			return nil, err
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// archModel is where case dir's model is: its model.gguf, or where
// materializeArch writes it.
func archModel(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "spec.json")); err != nil {
		return filepath.Join(dir, "model.gguf")
	}
	return ""
}

// materializeArch writes the model of a case kept as spec.json and checks
// its hash; a case with model.gguf is returned as it is.
func materializeArch(dir, model string) (string, error) {
	if model != "" {
		return model, nil
	}
	spec, err := SpecOf(dir)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := synth.Write(&buf, spec, nil); err != nil {
		return "", err
	}
	want, err := os.ReadFile(filepath.Join(dir, "model.sha256"))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	if got := hex.EncodeToString(sum[:]); got != strings.TrimSpace(string(want)) {
		return "", &os.PathError{Op: "materialize", Path: dir, Err: errHash(got)}
	}
	if archTmp == "" {
		if archTmp, err = os.MkdirTemp("", "shoal-archs-"); err != nil {
			return "", err
		}
	}
	path := filepath.Join(archTmp, filepath.Base(dir)+".gguf")
	return path, os.WriteFile(path, buf.Bytes(), 0o644)
}

// SpecOf reads dir/spec.json: a synth.Spec whose tokenizer is Vocab's.
func SpecOf(dir string) (synth.Spec, error) {
	var s synth.Spec
	raw, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, &os.PathError{Op: "parse", Path: filepath.Join(dir, "spec.json"), Err: err}
	}
	if s.Tokenizer, err = vocabKVs(); err != nil {
		return s, err
	}
	return s, nil
}

type errHash string

func (e errHash) Error() string {
	return "the model written from spec.json has sha256 " + string(e) + ", not model.sha256's (did synth change?)"
}
