package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"shoal/api"
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
