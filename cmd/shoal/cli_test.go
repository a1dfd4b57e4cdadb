package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"shoal/engine/kernels"
	"shoal/internal/version"
)

// execute runs the CLI in-process with args and stdin, returning stdout and
// the error main would print (and exit 1 on).
func execute(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out, errb bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	err := cmd.Execute()
	return out.String(), err
}

func genModel(t *testing.T, dir string, args ...string) string {
	t.Helper()
	path := filepath.Join(dir, "m.gguf")
	base := []string{"gen-model", "--arch", "llama", "--n-embd", "256", "--n-layer", "2", "--n-head", "4", "--n-head-kv", "2",
		"--n-ff", "512", "--type", "q4_k", "--seed", "3", "-q", "--out", path}
	if _, err := execute(t, "", append(base, args...)...); err != nil {
		t.Fatalf("gen-model: %v", err)
	}
	return path
}

func TestRunGeneratesTokens(t *testing.T) {
	dir := t.TempDir()
	path := genModel(t, dir)
	out, err := execute(t, "", "run", "-m", path, "-p", "Once upon a time", "-n", "16", "--seed", "1", "--stats=false")
	if err != nil {
		t.Fatal(err)
	}
	if len(strings.TrimSpace(out)) == 0 {
		t.Fatal("run printed no text")
	}
	again, _ := execute(t, "", "run", "-m", path, "-p", "Once upon a time", "-n", "16", "--seed", "1", "--stats=false")
	if again != out {
		t.Fatalf("same seed, different text:\n%q\n%q", out, again)
	}
	greedy, err := execute(t, "", "run", "-m", path, "-p", "Once upon a time", "-n", "16", "--temp", "0", "--stats=false")
	if err != nil || len(strings.TrimSpace(greedy)) == 0 {
		t.Fatalf("greedy run: %q %v", greedy, err)
	}
}

func TestLogitsCommand(t *testing.T) {
	dir := t.TempDir()
	path := genModel(t, dir)
	out := filepath.Join(dir, "l.f32")
	if _, err := execute(t, "", "logits", "-m", path, "--tokens", "1,2,3", "--out", out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 3*2048*4 {
		t.Fatalf("logits file has %d bytes, want 3 x 2048 floats", len(b))
	}
	for i := 0; i < len(b); i += 4 {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(b[i:])); math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %d is %v", i/4, v)
		}
	}
	if _, err := execute(t, "", "logits", "-m", path, "--tokens", "1,99999", "--out", out); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Fatalf("out-of-range token: %v", err)
	}
}

func TestTokenizeCommand(t *testing.T) {
	vocab := "../../../shared/tokenizer/ggml-vocab-llama-spm.gguf"
	if _, err := os.Stat(vocab); err != nil {
		t.Skip("../shared/tokenizer absent")
	}
	out, err := execute(t, "Hello world", "tokenize", "-m", vocab, "--no-special")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "15043 3186" {
		t.Fatalf("got %q", out)
	}
	out, _ = execute(t, "Hello world", "tokenize", "-m", vocab)
	if strings.TrimSpace(out) != "1 15043 3186" {
		t.Fatalf("with BOS: got %q", out)
	}
}

// TestCorruptModel checks that every command refuses a damaged file with a
// one-line reason instead of crashing.
func TestCorruptModel(t *testing.T) {
	dir := t.TempDir()
	path := genModel(t, dir)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A tensor whose rank field is damaged, and one whose first dimension
	// no longer matches its data.
	flipped := append([]byte(nil), good...)
	at := bytes.Index(flipped, []byte("token_embd.weight")) + len("token_embd.weight")
	flipped[at] = 9
	reshaped := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(reshaped[at+4:], 4096)
	bad := map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)/2],
		"header":    good[:64],
		"garbage":   bytes.Repeat([]byte("shoal"), 1000),
		"flipped":   flipped,
		"reshaped":  reshaped,
	}
	for name, data := range bad {
		p := filepath.Join(dir, name+".gguf")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"run", "-m", p, "-p", "hi", "-n", "2"},
			{"logits", "-m", p, "--tokens", "1,2", "--out", filepath.Join(dir, "o.f32")},
			{"tokenize", "-m", p},
			{"bench", "-m", p, "-p", "4", "-n", "2", "-r", "1"},
		} {
			_, err := execute(t, "hi", args...)
			if err == nil {
				t.Errorf("%s: %s accepted a corrupt file", name, args[0])
				continue
			}
			if msg := oneLine(err); strings.Contains(msg, "\n") || msg == "" {
				t.Errorf("%s: %s: reason is not one line: %q", name, args[0], msg)
			}
		}
	}
}

// TestAgentFlagsFromEnv: every agent flag reads SHOAL_<FLAG> when the
// command line does not set it; the command line wins; a bad value is a
// clear error naming the variable.
func TestAgentFlagsFromEnv(t *testing.T) {
	t.Setenv("SHOAL_CTX", "512")
	t.Setenv("SHOAL_DISK_LIMIT", "5GiB")
	t.Setenv("SHOAL_JOIN", "a:7947,b")
	t.Setenv("SHOAL_THREADS", "3")
	cmd := agentCmd()
	if err := cmd.Flags().Parse([]string{"--threads", "2"}); err != nil {
		t.Fatal(err)
	}
	if err := flagsFromEnv(cmd); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	if get("ctx") != "512" || get("disk-limit") != "5GiB" || get("join") != "[a:7947,b]" || get("threads") != "2" {
		t.Fatalf("ctx %s, disk-limit %s, join %s, threads %s", get("ctx"), get("disk-limit"), get("join"), get("threads"))
	}
	t.Setenv("SHOAL_MAX_SEQS", "many")
	err := flagsFromEnv(agentCmd())
	if err == nil || !strings.Contains(err.Error(), "SHOAL_MAX_SEQS") {
		t.Fatalf("SHOAL_MAX_SEQS=many: %v", err)
	}
}

// TestExitStatus: an unknown subcommand of a command group, and a piped
// chat whose request fails, end with an error (a non-zero exit), as a
// script expects; a group alone still prints its help.
func TestExitStatus(t *testing.T) {
	for _, args := range [][]string{{"model", "rm", "x"}, {"node", "frobnicate"}, {"token", "nope"}} {
		if _, err := execute(t, "", args...); err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("shoal %s: %v, want an unknown command error", strings.Join(args, " "), err)
		}
	}
	if out, err := execute(t, "", "model"); err != nil || !strings.Contains(out, "Available Commands") {
		t.Errorf("shoal model: %v\n%s", err, out)
	}
	// An agent that refuses the chat's model.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"message":"model \"nosuch\" is not served","type":"invalid_request_error","code":"model_not_found"}}`))
	}))
	defer srv.Close()
	_, err := execute(t, "hi\n", "chat", "--addr", srv.URL, "--token", "k", "-m", "nosuch")
	if err == nil || !strings.Contains(err.Error(), "1 request(s) failed") || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("piped chat with a refused model: %v, want an error", err)
	}
}

// TestCLIFindsLocalUp: with no --addr, SHOAL_ADDR or SHOAL_TOKEN, the CLI
// in the directory where `shoal up` runs uses that cluster's address and
// admin key; an explicit address or key wins.
func TestCLIFindsLocalUp(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv("SHOAL_ADDR", "")
	t.Setenv("SHOAL_TOKEN", "")
	t.Setenv("SHOAL_CACERT", "")
	if addr, _, _ := agentAddr("", ""); addr != "http://127.0.0.1:7948" || cliToken("", "") != "" {
		t.Fatalf("without a local cluster: %s %q", addr, cliToken("", ""))
	}
	if err := os.MkdirAll(upDataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeUpFile(upDataDir, upFile{Addr: "http://127.0.0.1:8080", AdminKey: "admin-key", InferenceKey: "k"}); err != nil {
		t.Fatal(err)
	}
	if addr, _, _ := agentAddr("", ""); addr != "http://127.0.0.1:8080" || cliToken("", "") != "admin-key" {
		t.Fatalf("with shoal up here: %s %q", addr, cliToken("", ""))
	}
	if addr, _, _ := agentAddr("10.0.0.9:7948", ""); addr != "http://10.0.0.9:7948" || cliToken("", "10.0.0.9:7948") != "" {
		t.Fatalf("--addr given: %s %q (the local cluster's key must not go to another address)", addr, cliToken("", "10.0.0.9:7948"))
	}
	if cliToken("mine", "") != "mine" {
		t.Fatal("--token lost")
	}
}

// TestVersion: `shoal --version` is a flag as users try it first, and both
// it and `shoal version` name the build: its release, the protocol it
// speaks and the oldest it works with, its Go version and kernel set, and
// the GPUs it finds (or why none); -o json says the same to scripts.
func TestVersion(t *testing.T) {
	flag, err := execute(t, "", "--version")
	if err != nil {
		t.Fatalf("--version: %v", err)
	}
	sub, err := execute(t, "", "version")
	if err != nil {
		t.Fatal(err)
	}
	if flag != sub || !strings.HasPrefix(flag, "shoal "+version.Release) {
		t.Errorf("--version printed %q, version %q", flag, sub)
	}
	for _, want := range []string{fmt.Sprintf("protocol  %d (works with nodes of protocols %d-%d)", version.Protocol, version.MinProtocol, version.Protocol),
		"go ", "kernels   " + kernels.Path(), "gpus "} {
		if !strings.Contains(sub, want) {
			t.Errorf("shoal version lacks %q:\n%s", want, sub)
		}
	}
	js, err := execute(t, "", "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Release  string   `json:"release"`
		Version  string   `json:"version"`
		Protocol int      `json:"protocol"`
		Min      int      `json:"min_protocol"`
		Kernels  string   `json:"kernels"`
		GPUs     []string `json:"gpus"`
		Go       string   `json:"go"`
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatalf("%v: %s", err, js)
	}
	if r.Release != version.Release || r.Protocol != version.Protocol || r.Min != version.MinProtocol || r.Kernels != kernels.Path() || r.GPUs == nil || r.Go == "" ||
		!strings.HasPrefix(r.Version, version.Release) {
		t.Errorf("version -o json: %+v", r)
	}
}

// TestRunEmbeddingModel: `shoal run` of an embedding model says what the
// file is and where it serves, not which Go function would open it.
func TestRunEmbeddingModel(t *testing.T) {
	path := genModel(t, t.TempDir(), "--arch", "bert", "--type", "f16", "--n-head-kv", "4")
	_, err := execute(t, "", "run", "-m", path, "-p", "hi", "-n", "4")
	if err == nil {
		t.Fatal("run generated text with an embedding model")
	}
	if msg := err.Error(); !strings.Contains(msg, "/v1/embeddings") || strings.Contains(msg, "model.Open") {
		t.Errorf("run of an embedding model: %v", err)
	}
}
