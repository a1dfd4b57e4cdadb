package api

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Headers carrying the shape of a binary logits answer.
const (
	HeaderLogitsTokens = "X-Shoal-Tokens"
	HeaderLogitsVocab  = "X-Shoal-Vocab"
)

// clusterRunner adds the endpoints that run a distributed model: they may
// take minutes (a benchmark), so only the key check is bounded.
func (h *handler) clusterRunner(mux *http.ServeMux, cr ClusterRunner) {
	long := func(fn func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			actx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
			ok := h.authorized(w, r.WithContext(actx), ScopeAdmin)
			cancel()
			if !ok {
				return
			}
			if err := fn(w, r); err != nil {
				writeJSON(w, statusOf(err), Error{Error: err.Error()})
			}
		}
	}
	mux.HandleFunc("GET /v1/cluster/models/{name}/measured", func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(w, r, ScopeRead) {
			return
		}
		out, err := cr.ClusterMeasured(r.Context(), r.PathValue("name"))
		if err != nil {
			writeJSON(w, statusOf(err), Error{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("POST /v1/cluster/models/{name}/logits", long(func(w http.ResponseWriter, r *http.Request) error {
		var req LogitsRequest
		dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return &httpError{http.StatusBadRequest, "malformed logits request: " + err.Error()}
		}
		if len(req.Tokens) == 0 {
			return &httpError{http.StatusBadRequest, "logits request without tokens"}
		}
		out, err := cr.ClusterLogits(r.Context(), r.PathValue("name"), req.Tokens)
		if err != nil {
			return err
		}
		b := make([]byte, 4*len(out.Data))
		for i, v := range out.Data {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set(HeaderLogitsTokens, strconv.Itoa(out.NTokens))
		w.Header().Set(HeaderLogitsVocab, strconv.Itoa(out.NVocab))
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
		return nil
	}))
	mux.HandleFunc("POST /v1/cluster/models/{name}/bench", long(func(w http.ResponseWriter, r *http.Request) error {
		var req BenchRequest
		dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return &httpError{http.StatusBadRequest, "malformed bench request: " + err.Error()}
		}
		if len(req.Prompt) == 0 && len(req.Gen) == 0 {
			return &httpError{http.StatusBadRequest, "bench request without a prompt size or generation length"}
		}
		for _, n := range append(append([]int{}, req.Prompt...), req.Gen...) {
			if n <= 0 {
				return &httpError{http.StatusBadRequest, fmt.Sprintf("bench size %d: want a positive number of tokens", n)}
			}
		}
		if req.Reps < 0 || req.Reps > 100 {
			return &httpError{http.StatusBadRequest, fmt.Sprintf("reps %d: want 1..100", req.Reps)}
		}
		out, err := cr.ClusterBench(r.Context(), r.PathValue("name"), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}))
}

// ClusterLogits evaluates tokens as one prompt through the cluster that
// serves model (on its driver, wherever the agent at c.Addr forwards it).
func (c *Client) ClusterLogits(ctx context.Context, model string, tokens []int32) (*Logits, error) {
	var out *Logits
	err := c.long().doRaw(ctx, "POST", "/v1/cluster/models/"+url.PathEscape(model)+"/logits", LogitsRequest{Tokens: tokens},
		func(resp *http.Response, body []byte) error {
			nt, err1 := strconv.Atoi(resp.Header.Get(HeaderLogitsTokens))
			nv, err2 := strconv.Atoi(resp.Header.Get(HeaderLogitsVocab))
			if err1 != nil || err2 != nil || nt <= 0 || nv <= 0 || len(body) != 4*nt*nv {
				return fmt.Errorf("malformed logits answer: %d bytes for %q x %q", len(body), resp.Header.Get(HeaderLogitsTokens), resp.Header.Get(HeaderLogitsVocab))
			}
			out = &Logits{NTokens: nt, NVocab: nv, Data: make([]float32, nt*nv)}
			for i := range out.Data {
				out.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
			}
			return nil
		})
	return out, err
}

// ClusterBench runs a benchmark of model through the cluster on its driver.
func (c *Client) ClusterBench(ctx context.Context, model string, req BenchRequest) (*BenchResult, error) {
	var out BenchResult
	return &out, c.long().do(ctx, "POST", "/v1/cluster/models/"+url.PathEscape(model)+"/bench", req, &out)
}

// ClusterMeasured is the decode time model's driver measures, beside its
// plan's prediction.
func (c *Client) ClusterMeasured(ctx context.Context, model string) (*Measured, error) {
	var out Measured
	return &out, c.do(ctx, "GET", "/v1/cluster/models/"+url.PathEscape(model)+"/measured", nil, &out)
}

// long is c without the HTTP client's short timeout: the caller's context
// bounds the call.
func (c *Client) long() *Client {
	cp := *c
	cp.HTTP = &http.Client{}
	if c.HTTP != nil {
		cp.HTTP.Transport = c.HTTP.Transport
	}
	return &cp
}
