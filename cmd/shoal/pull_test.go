package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"shoal/engine/enginetest"
	"shoal/hub/hubtest"
)

func TestPullCommand(t *testing.T) {
	const repo = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
	body := []byte(strings.Repeat("GGUF model bytes ", 4000))
	srv := hubtest.New(t)
	srv.AddRepo(repo, map[string][]byte{
		"qwen2.5-0.5b-instruct-q4_k_m.gguf": body,
		"qwen2.5-0.5b-instruct-q8_0.gguf":   []byte("other"),
	})
	t.Setenv("HF_ENDPOINT", srv.URL)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "")
	store := t.TempDir()
	blob := filepath.Join(store, "blobs", "sha256-"+hubtest.SHA256(body))

	out, err := execute(t, "", "pull", repo+":Q4_K_M", "--store", store)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "pulled qwen2.5-0.5b-instruct:q4_k_m") || !strings.Contains(out, blob) || !strings.Contains(out, "shoal run --model qwen2.5-0.5b-instruct:q4_k_m") {
		t.Fatalf("pull printed:\n%s", out)
	}
	if b, err := os.ReadFile(blob); err != nil || string(b) != string(body) {
		t.Fatalf("blob: %v", err)
	}

	// Again: nothing downloaded; --path prints the file alone.
	served := srv.TotalBytesServed()
	out, err = execute(t, "", "pull", repo, "--store", store, "--path")
	if err != nil || strings.TrimSpace(out) != blob || srv.TotalBytesServed() != served {
		t.Fatalf("second pull: %q %v (%d more bytes)", out, err, srv.TotalBytesServed()-served)
	}

	out, err = execute(t, "", "pull", "--list", "--store", store)
	if err != nil || !strings.Contains(out, "NAME") || !strings.Contains(out, "qwen2.5-0.5b-instruct:q4_k_m") || !strings.Contains(out, repo+":Q4_K_M") {
		t.Fatalf("list: %q %v", out, err)
	}
	out, err = execute(t, "", "pull", "--list", "--store", store, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		Name  string   `json:"name"`
		Ref   string   `json:"ref"`
		Size  int64    `json:"size"`
		Files []string `json:"files"`
		Parts []struct {
			Path, SHA256 string
		} `json:"parts"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list -o json: %v\n%s", err, out)
	}
	if len(list) != 1 || list[0].Name != "qwen2.5-0.5b-instruct:q4_k_m" || list[0].Size != int64(len(body)) || len(list[0].Files) != 1 || list[0].Files[0] != blob || list[0].Parts[0].SHA256 != hubtest.SHA256(body) {
		t.Fatalf("list -o json: %+v", list)
	}

	// Offline: the store only.
	if _, err := execute(t, "", "pull", repo+":Q8_0", "--store", store, "--offline"); err == nil || !strings.Contains(err.Error(), "not in the model store") {
		t.Fatalf("offline, not stored: %v", err)
	}
	if out, err := execute(t, "", "pull", repo+":q4_k_m", "--store", store, "--offline", "--path"); err != nil || strings.TrimSpace(out) != blob {
		t.Fatalf("offline, stored: %q %v", out, err)
	}

	// Gated without a token.
	srv.Gate(repo, 403, "tok")
	if _, err := execute(t, "", "pull", repo+":Q8_0", "--store", store); err == nil || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Fatalf("gated: %v", err)
	}
	t.Setenv("HF_TOKEN", "tok")
	if _, err := execute(t, "", "pull", repo+":Q8_0", "--store", store, "-q"); err != nil {
		t.Fatalf("gated with the token: %v", err)
	}

	if out, err := execute(t, "", "pull", "--rm", "qwen2.5-0.5b-instruct:q4_k_m", "--store", store); err != nil || !strings.Contains(out, "removed") {
		t.Fatalf("rm: %q %v", out, err)
	}
	if _, err := os.Stat(blob); !os.IsNotExist(err) {
		t.Fatalf("blob kept after rm: %v", err)
	}
	if _, err := execute(t, "", "pull", "--store", store); err == nil {
		t.Fatal("pull without a REF accepted")
	}
}

func TestPullHelpTeaches(t *testing.T) {
	out, err := execute(t, "", "pull", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "HF_TOKEN", "HF_ENDPOINT", "--offline", "--list", "shoal run --model"} {
		if !strings.Contains(out, want) {
			t.Errorf("pull --help lacks %q", want)
		}
	}
}

func TestPullProgressPlainLines(t *testing.T) {
	var b strings.Builder
	p := &pullProgress{w: &b, what: "x"}
	for d := int64(0); d <= 1000; d += 7 {
		p.update(d, 1000)
	}
	p.update(1000, 1000)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 11 || !strings.Contains(lines[0], "  0%") || !strings.Contains(lines[10], "100%") {
		t.Fatalf("plain progress:\n%s", b.String())
	}
}

// TestRunByHubReference: shoal run --model takes a hub reference (pulled
// into the store first) and then the store's name for it, and refuses a
// name that is neither a file, a stored model nor a reference.
func TestRunByHubReference(t *testing.T) {
	const repo = tinyRepo
	srv, body, _ := tinyHub(t)
	out, err := execute(t, "", "run", "--model", repo+":Q8_0", "-p", "Hello", "-n", "4", "--seed", "1")
	if err != nil {
		t.Fatalf("run by reference: %v\n%s", err, out)
	}
	served := srv.TotalBytesServed()
	if served < int64(len(body)) {
		t.Fatalf("the hub served %d bytes of a %d-byte model", served, len(body))
	}
	again, err := execute(t, "", "run", "--model", "tiny:q8_0", "-p", "Hello", "-n", "4", "--seed", "1")
	if err != nil || again != out || srv.TotalBytesServed() != served {
		t.Fatalf("run by store name: %v, output %q (first %q), %d more bytes served", err, again, out, srv.TotalBytesServed()-served)
	}
	if _, err := execute(t, "", "run", "--model", "no-such-model", "-p", "x"); err == nil || !strings.Contains(err.Error(), "not a hub reference") {
		t.Fatalf("unknown model: %v", err)
	}
	// A model of the store is served under its store name, not its file's
	// (sha256-...): by reference, by name; a file keeps its own name.
	for _, arg := range []string{repo + ":Q8_0", "tiny:q8_0"} {
		path, name, err := localModel(context.Background(), arg, io.Discard)
		if err != nil || name != "tiny:q8_0" || filepath.Base(path) != "sha256-"+hubtest.SHA256(body) {
			t.Errorf("localModel(%q) = %q, %q, %v; want the store's file named tiny:q8_0", arg, path, name, err)
		}
	}
	file := genModel(t, t.TempDir(), "--type", "q8_0")
	if path, name, err := localModel(context.Background(), file, io.Discard); err != nil || path != file || name != "" {
		t.Errorf("localModel(a file) = %q, %q, %v", path, name, err)
	}
}

// TestRunSplitModel: a model published as split GGUF parts is pulled
// whole, its parts joined once into one file in the store, and runs like
// the unsplit file (the same greedy text); `pull` says where the joined
// file is, and the second run reads the store only.
func TestRunSplitModel(t *testing.T) {
	const repo = "shoal-test/Split-GGUF"
	dir := t.TempDir()
	whole := genModel(t, dir, "--type", "q8_0")
	body, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, p := range enginetest.SplitGGUF(t, body, dir, "split-q8_0", 3) {
		if files[filepath.Base(p)], err = os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
	}
	srv := hubtest.New(t)
	srv.AddRepo(repo, files)
	t.Setenv("HF_ENDPOINT", srv.URL)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "")
	t.Setenv("SHOAL_MODELS", t.TempDir())
	out, err := execute(t, "", "pull", repo+":Q8_0")
	if err != nil || !strings.Contains(out, "3 parts joined into one GGUF") {
		t.Fatalf("pull: %v\n%s", err, out)
	}
	want, err := execute(t, "", "run", "--model", whole, "-p", "Hello", "-n", "6", "--seed", "1", "--temp", "0")
	if err != nil {
		t.Fatal(err)
	}
	served := srv.TotalBytesServed()
	got, err := execute(t, "", "run", "--model", "split:q8_0", "-p", "Hello", "-n", "6", "--seed", "1", "--temp", "0")
	if err != nil || got != want || srv.TotalBytesServed() != served {
		t.Fatalf("run of the split model: %v, %q; the whole file gives %q (%d more bytes from the hub)", err, got, want, srv.TotalBytesServed()-served)
	}
}
