package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
)

// OpenAIError answers with an error in the OpenAI API's form.
func OpenAIError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(openAIErrorBody(typ, code, msg))
}

func openAIErrorBody(typ, code, msg string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
}

// openAIFail answers a request the serving agent could not take.
func openAIFail(w http.ResponseWriter, status int, code, msg string) {
	OpenAIError(w, status, "server_error", code, msg)
}

// adminFail answers an admin API request the driver could not take.
func adminFail(w http.ResponseWriter, status int, _, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// allowedModels are the models the request's key is limited to (none: any).
func (f *Forwarder) allowedModels(r *http.Request) []string {
	if key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && f.cfg.KeyModels != nil {
		allowed, _ := f.cfg.KeyModels(r.Context(), strings.TrimSpace(key), true)
		return allowed
	}
	return nil
}

// getClusterModel answers GET /v1/models/NAME for a model another agent
// serves as the list does (this agent's own answer otherwise).
func (f *Forwarder) getClusterModel(w http.ResponseWriter, r *http.Request, local http.Handler) {
	rec := httptest.NewRecorder()
	local.ServeHTTP(rec, r)
	if rec.Code == http.StatusNotFound {
		name := strings.TrimPrefix(r.URL.Path, "/v1/models/")
		allowed := f.allowedModels(r)
		for _, rt := range f.cfg.Routes.Routes() {
			if rt.Ready && rt.Node != f.cfg.Self && rt.Model == name && (len(allowed) == 0 || slices.Contains(allowed, rt.Model)) {
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(map[string]any{"id": rt.Model, "object": "model", "created": 0, "owned_by": rt.NodeName, "shoal.served_by": rt.NodeName})
				return
			}
		}
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// listClusterModels answers /v1/models with the local models followed by
// those other agents serve.
func (f *Forwarder) listClusterModels(w http.ResponseWriter, r *http.Request, local http.Handler) {
	rec := httptest.NewRecorder()
	local.ServeHTTP(rec, r)
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
		return
	}
	// The local list passed the key; a key limited to models sees only
	// those of the other agents' models too.
	allowed := f.allowedModels(r)
	seen := map[string]bool{}
	for _, m := range list.Data {
		if id, ok := m["id"].(string); ok {
			seen[id] = true
		}
	}
	for _, rt := range f.cfg.Routes.Routes() {
		if rt.Ready && rt.Node != f.cfg.Self && !seen[rt.Model] && (len(allowed) == 0 || slices.Contains(allowed, rt.Model)) {
			seen[rt.Model] = true
			list.Data = append(list.Data, map[string]any{"id": rt.Model, "object": "model", "created": 0, "owned_by": rt.NodeName, "shoal.served_by": rt.NodeName})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}
