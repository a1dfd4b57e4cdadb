package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"shoal/api"
	"shoal/cmd/shoal/localcluster"
	"shoal/hub/hubtest"
)

const tinyRepo = "shoal-test/Tiny-GGUF"

// tinyHub serves a small model as shoal-test/Tiny-GGUF:Q8_0 on a fake hub
// (HF_ENDPOINT) and gives shoal an empty store ($SHOAL_MODELS).
func tinyHub(t *testing.T) (srv *hubtest.Server, body []byte, store string) {
	t.Helper()
	body, err := os.ReadFile(genModel(t, t.TempDir(), "--type", "q8_0"))
	if err != nil {
		t.Fatal(err)
	}
	srv = hubtest.New(t)
	srv.AddRepo(tinyRepo, map[string][]byte{"tiny-q8_0.gguf": body})
	t.Setenv("HF_ENDPOINT", srv.URL)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "")
	store = t.TempDir()
	t.Setenv("SHOAL_MODELS", store)
	return srv, body, store
}

// tinyStore is tinyHub with the model pulled, as tiny:q8_0; it returns the
// model's file.
func tinyStore(t *testing.T) (*hubtest.Server, string) {
	t.Helper()
	srv, body, store := tinyHub(t)
	if out, err := execute(t, "", "pull", tinyRepo+":Q8_0", "-q"); err != nil {
		t.Fatalf("pull: %v\n%s", err, out)
	}
	return srv, filepath.Join(store, "blobs", "sha256-"+hubtest.SHA256(body))
}

// fakeLoads is an agent that registers every model load request it gets
// (and answers nothing else): the requests come back in order.
func fakeLoads(t *testing.T) (string, func() []api.LoadModelRequest) {
	var mu sync.Mutex
	var got []api.LoadModelRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req api.LoadModelRequest
		if r.Method != "POST" || r.URL.Path != "/v1/cluster/models" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		json.NewEncoder(w).Encode(api.ModelInfo{Name: req.Name, Path: req.Path, Layers: 2})
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []api.LoadModelRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]api.LoadModelRequest(nil), got...)
	}
}

// TestStoreFileKeepsStoreName: the file of a stored model, given by its
// path (what 'shoal pull --path' prints), is served and loaded under the
// store's name, not its blob's (sha256-...); another file keeps its own.
func TestStoreFileKeepsStoreName(t *testing.T) {
	_, blob := tinyStore(t)
	if path, name, err := localModel(context.Background(), blob, io.Discard); err != nil || path != blob || name != "tiny:q8_0" {
		t.Errorf("localModel(the store's file) = %q, %q, %v; want it named tiny:q8_0", path, name, err)
	}
	addr, loads := fakeLoads(t)
	out, err := execute(t, "", "model", "load", blob, "--wait", "0", "--addr", addr, "--token", "k")
	if err != nil || len(loads()) != 1 || loads()[0].Name != "tiny:q8_0" || loads()[0].Path != blob {
		t.Fatalf("model load of the store's file: %v %q, requests %+v", err, out, loads())
	}
	// --name still wins.
	if _, err := execute(t, "", "model", "load", blob, "--name", "mine", "--wait", "0", "--addr", addr, "--token", "k"); err != nil || loads()[1].Name != "mine" {
		t.Fatalf("model load --name: %v %+v", err, loads())
	}
	file := genModel(t, t.TempDir(), "--type", "q8_0")
	if _, err := execute(t, "", "model", "load", file, "--wait", "0", "--addr", addr, "--token", "k"); err != nil || loads()[2].Name != "" || loads()[2].Path != file {
		t.Fatalf("model load of another file: %v %+v", err, loads())
	}
}

// TestLoadAndTokenizeByStoreName: model load and tokenize take a model of
// the store by its name (and by the hub reference it was pulled with), as
// run does; load never downloads: a reference the store lacks is an error
// that says how to get it, and the hub is not asked.
func TestLoadAndTokenizeByStoreName(t *testing.T) {
	_, blob := tinyStore(t)
	asked := downHub(t)
	addr, loads := fakeLoads(t)
	for i, arg := range []string{"tiny:q8_0", tinyRepo + ":Q8_0"} {
		out, err := execute(t, "", "model", "load", arg, "--wait", "0", "--addr", addr, "--token", "k")
		if err != nil || len(loads()) != i+1 || loads()[i].Path != blob || loads()[i].Name != "tiny:q8_0" {
			t.Fatalf("model load %s: %v %q, requests %+v", arg, err, out, loads())
		}
	}
	_, err := execute(t, "", "model", "load", tinyRepo+":F16", "--wait", "0", "--addr", addr, "--token", "k")
	if err == nil || !strings.Contains(err.Error(), "shoal pull "+tinyRepo+":F16") || !strings.Contains(err.Error(), "--hub") || len(loads()) != 2 {
		t.Fatalf("model load of a reference not stored: %v (%d loads)", err, len(loads()))
	}
	if _, err := execute(t, "", "model", "load", "no-such:q8_0", "--wait", "0", "--addr", addr, "--token", "k"); err == nil || !strings.Contains(err.Error(), "shoal pull --list") {
		t.Fatalf("model load of an unknown name: %v", err)
	}
	want, err := execute(t, "Hello world", "tokenize", "--model", blob)
	if err != nil || strings.TrimSpace(want) == "" {
		t.Fatalf("tokenize the file: %q %v", want, err)
	}
	if got, err := execute(t, "Hello world", "tokenize", "--model", "tiny:q8_0"); err != nil || got != want {
		t.Fatalf("tokenize --model tiny:q8_0: %q %v, want %q", got, err, want)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the hub was asked %d times for models in the store", n)
	}
}

// downHub points HF_ENDPOINT at a hub that answers every request 503 and
// counts them.
func downHub(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	t.Setenv("HF_ENDPOINT", srv.URL)
	return &n
}

// TestPullPrintsStoreName: pull names the model by its store name, and
// tells how to use it by that name; the file is a field of its own, and
// -o json has it as path.
func TestPullPrintsStoreName(t *testing.T) {
	_, blob := tinyStore(t)
	out, err := execute(t, "", "pull", tinyRepo+":Q8_0", "-q")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "pulled tiny:q8_0 ") || strings.Contains(lines[0], "sha256") ||
		strings.Fields(lines[1])[1] != blob || lines[2] != "use it: shoal run --model tiny:q8_0   or   shoal up --model tiny:q8_0" {
		t.Fatalf("pull printed:\n%s", out)
	}
	out, err = execute(t, "", "pull", tinyRepo+":Q8_0", "-o", "json")
	var m struct{ Name, Path string }
	if err != nil || json.Unmarshal([]byte(out), &m) != nil || m.Name != "tiny:q8_0" || m.Path != blob {
		t.Fatalf("pull -o json: %v\n%s", err, out)
	}
}

// TestPullPathFromStore: pull --path, and run or up by hub reference,
// answer a model already stored from the store: a hub that is down is
// never asked. A reference the store lacks still goes to the hub.
func TestPullPathFromStore(t *testing.T) {
	_, blob := tinyStore(t)
	asked := downHub(t)
	for _, ref := range []string{tinyRepo + ":Q8_0", tinyRepo + ":q8_0", tinyRepo + "/tiny-q8_0.gguf"} {
		if out, err := execute(t, "", "pull", ref, "--path"); err != nil || strings.TrimSpace(out) != blob {
			t.Errorf("pull %s --path: %q %v", ref, out, err)
		}
	}
	if path, name, err := localModel(context.Background(), tinyRepo+":Q8_0", io.Discard); err != nil || path != blob || name != "tiny:q8_0" {
		t.Errorf("localModel(the reference): %q %q %v", path, name, err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the hub was asked %d times for a stored model", n)
	}
	// A bare REPO names the hub's choice: its Q4_K_M file, else its only
	// one; the store cannot tell the second without the hub.
	if _, err := execute(t, "", "pull", tinyRepo, "--path"); err == nil || asked.Load() == 0 {
		t.Errorf("pull of a bare repository without the hub: %v after %d requests", err, asked.Load())
	}
	before := asked.Load()
	if _, err := execute(t, "", "pull", tinyRepo+":F16", "--path"); err == nil || asked.Load() == before {
		t.Errorf("pull of a model not stored: %v after %d requests", err, asked.Load()-before)
	}
}

// TestUpBannerNamesItsModel: on a data dir where an earlier run loaded
// other models, the banner lists them, and every command it prints names
// the model this run serves; chat run from the directory of that 'shoal
// up' talks to it by default, not to the first model the cluster lists.
func TestUpBannerNamesItsModel(t *testing.T) {
	ms := []api.ModelInfo{{Name: "builtin-llama-q4_k"}, {Name: "tinystories-656k:f16"}, {Name: "other"}}
	c := &localcluster.Cluster{Model: "tinystories-656k:f16", Endpoint: "http://127.0.0.1:8080/v1", Token: "adm", InferenceKey: "inf",
		Earlier: localcluster.Others(ms, "tinystories-656k:f16")}
	var b strings.Builder
	upBanner(&b, c, localcluster.Options{Nodes: 2, DataDir: upDataDir, Model: "/store/blobs/sha256-x"}, "shoal", true)
	out := b.String()
	if !strings.Contains(out, "builtin-llama-q4_k, other") || !strings.Contains(out, "earlier run") || !strings.Contains(out, "shoal model unload") {
		t.Errorf("the banner does not list the earlier run's models:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && f[0] == "shoal" && (f[1] == "chat" || f[1] == "placement") && !strings.Contains(l, " tinystories-656k:f16") {
			t.Errorf("banner line %q does not name the model", l)
		}
	}
	if !strings.Contains(out, "shoal chat --model tinystories-656k:f16") {
		t.Errorf("no chat line with the model:\n%s", out)
	}

	// chat: the cluster lists the earlier model first.
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"builtin-llama-q4_k","object":"model"},{"id":"tinystories-656k:f16","object":"model"}]}`)
			return
		}
		var req struct{ Model string }
		json.NewDecoder(r.Body).Decode(&req)
		got.Store(req.Model)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	t.Chdir(t.TempDir())
	t.Setenv("SHOAL_ADDR", "")
	t.Setenv("SHOAL_TOKEN", "")
	t.Setenv("SHOAL_CACERT", "")
	if err := os.MkdirAll(upDataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeUpFile(upDataDir, upFile{Addr: srv.URL, AdminKey: "adm", InferenceKey: "inf", Model: "tinystories-656k:f16"}); err != nil {
		t.Fatal(err)
	}
	if _, err := execute(t, "hi\n", "chat"); err != nil || got.Load() != "tinystories-656k:f16" {
		t.Errorf("chat from the directory of shoal up talked to %v (%v), want tinystories-656k:f16", got.Load(), err)
	}
	if _, err := execute(t, "hi\n", "chat", "--addr", srv.URL); err != nil || got.Load() != "builtin-llama-q4_k" {
		t.Errorf("chat --addr talked to %v (%v), want the first listed", got.Load(), err)
	}
}
