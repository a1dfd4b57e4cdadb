package openai

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
)

// Embedder runs an embedding model. A Model with an Embedder serves POST
// /v1/embeddings; the others answer that they do not produce embeddings.
type Embedder interface {
	// Embed returns one vector of Dims() values per input. Each input is
	// a token sequence as the model takes it (special tokens such as
	// [CLS]/[SEP] included); vectors are pooled and L2-normalized.
	// Errors are answered like Submit's (ErrTooLong, ErrBadInput,
	// ErrQueueFull, ErrClosed, HTTPStatus()).
	Embed(ctx context.Context, inputs [][]int32) ([][]float32, error)
	// Dims is the length of the embeddings.
	Dims() int
	// MaxTokens is the longest input the model takes.
	MaxTokens() int
}

// maxEmbeddingInputs is OpenAI's limit on inputs per request.
const maxEmbeddingInputs = 2048

// EmbeddingRequest is the body of POST /v1/embeddings.
type EmbeddingRequest struct {
	Model string `json:"model"`
	// Input is a string, an array of strings, an array of token ids or an
	// array of arrays of token ids.
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format,omitempty"` // "float" (default) or "base64"
	Dimensions     *int            `json:"dimensions,omitempty"`
	User           string          `json:"user,omitempty"`
}

// Embedding is one vector of an EmbeddingResponse: a JSON array of
// numbers, or with encoding_format "base64" a string of its little-endian
// float32 bytes.
type Embedding struct {
	Object    string          `json:"object"` // "embedding"
	Index     int             `json:"index"`
	Embedding json.RawMessage `json:"embedding"`
}

// EmbeddingUsage is the token accounting of an embedding request.
type EmbeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// EmbeddingResponse is the answer of POST /v1/embeddings.
type EmbeddingResponse struct {
	Object string         `json:"object"` // "list"
	Data   []Embedding    `json:"data"`
	Model  string         `json:"model"`
	Usage  EmbeddingUsage `json:"usage"`
}

func (h *handler) embeddings(x *exchange) *apiError {
	var req EmbeddingRequest
	if e := h.decode(x, &req); e != nil {
		return e
	}
	x.rec.Model = req.Model
	m, e := h.lookup(x, req.Model)
	if e != nil && e.status == http.StatusNotFound {
		// Not here: a model the cluster serves from another agent is
		// resolved as a completion's is, to say what it is (or its
		// driver answers), not that it does not exist.
		m, e = h.resolve(x, req.Model)
	}
	if e != nil {
		return e
	}
	if m.Embedder == nil {
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "model", code: "model_not_supported",
			msg: fmt.Sprintf("The model `%s` is a generative model and does not produce embeddings: serve an embedding GGUF (BERT-style, or a decoder with a pooling_type) on an agent with --model and name it here.", req.Model)}
	}
	emb := m.Embedder
	base64Out := false
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		base64Out = true
	default:
		return badRequest("encoding_format", "encoding_format %q is not supported: use \"float\" or \"base64\"", req.EncodingFormat)
	}
	if req.Dimensions != nil && *req.Dimensions != emb.Dims() {
		return badRequest("dimensions", "dimensions is not supported: the model `%s` produces %d-dimensional embeddings and cannot shorten them", req.Model, emb.Dims())
	}
	inputs, e := parseEmbeddingInput(req.Input, m.Tokenizer)
	if e != nil {
		return e
	}
	limit, total := emb.MaxTokens(), 0
	for i, in := range inputs {
		if len(in) == 0 {
			return badRequest("input", "input[%d] has no tokens", i)
		}
		if limit > 0 && len(in) > limit {
			return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input", code: "context_length_exceeded",
				msg: fmt.Sprintf("input[%d] has %d tokens, more than the model's maximum context length of %d tokens.", i, len(in), limit)}
		}
		total += len(in)
	}
	x.rec.PromptTokens = total
	vecs, err := emb.Embed(x.r.Context(), inputs)
	if err != nil {
		return submitError(err, "input")
	}
	if len(vecs) != len(inputs) {
		return &apiError{status: http.StatusInternalServerError, typ: "server_error",
			msg: fmt.Sprintf("the model returned %d embeddings for %d inputs", len(vecs), len(inputs))}
	}
	res := EmbeddingResponse{Object: "list", Model: req.Model, Data: make([]Embedding, len(vecs)),
		Usage: EmbeddingUsage{PromptTokens: total, TotalTokens: total}}
	for i, v := range vecs {
		for _, f := range v {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return &apiError{status: http.StatusInternalServerError, typ: "server_error",
					msg: fmt.Sprintf("the model produced a non-finite embedding for input[%d]", i)}
			}
		}
		res.Data[i] = Embedding{Object: "embedding", Index: i, Embedding: encodeEmbedding(v, base64Out)}
	}
	x.ok(res)
	return nil
}

// encodeEmbedding renders v as a JSON array of numbers, or as a JSON string
// holding the base64 of its little-endian float32 bytes.
func encodeEmbedding(v []float32, b64 bool) json.RawMessage {
	if b64 {
		raw := make([]byte, 4*len(v))
		for i, f := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(f))
		}
		s, _ := json.Marshal(base64.StdEncoding.EncodeToString(raw))
		return s
	}
	s, _ := json.Marshal(v)
	return s
}

// parseEmbeddingInput reads the input of an embedding request into token
// sequences: each string is tokenized with the model's special tokens
// ([CLS] ... [SEP] for BERT); token ids are taken as they are.
func parseEmbeddingInput(raw json.RawMessage, tok Tokenizer) ([][]int32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "you must provide an input: a string, an array of strings, an array of token ids or an array of arrays of token ids")
	}
	text := func(s string, where string) ([]int32, *apiError) {
		if s == "" {
			return nil, badRequest("input", "%s is an empty string; embeddings need some text", where)
		}
		return tok.Encode(s, true), nil
	}
	ids := func(list []json.RawMessage, where string) ([]int32, *apiError) {
		if len(list) == 0 {
			return nil, badRequest("input", "%s is an empty array of token ids", where)
		}
		out := make([]int32, len(list))
		for i, r := range list {
			var n float64
			if err := json.Unmarshal(r, &n); err != nil || n != math.Trunc(n) || n < 0 || n >= float64(tok.NVocab()) {
				return nil, badRequest("input", "%s[%d] = %s is not a token id in [0, %d)", where, i, r, tok.NVocab())
			}
			out[i] = int32(n)
		}
		return out, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("input", "input is not a valid JSON string: %v", err)
		}
		t, e := text(s, "input")
		if e != nil {
			return nil, e
		}
		return [][]int32{t}, nil
	case '[':
	default:
		return nil, badRequest("input", "input must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("input", "input is not a valid JSON array: %v", err)
	}
	if len(list) == 0 {
		return nil, badRequest("input", "input is an empty array; send at least one string or token array")
	}
	if len(list) > maxEmbeddingInputs {
		return nil, badRequest("input", "input has %d items, more than the limit of %d per request", len(list), maxEmbeddingInputs)
	}
	kind := func(r json.RawMessage) byte {
		if r = bytes.TrimSpace(r); len(r) > 0 {
			return r[0]
		}
		return 0
	}
	first := kind(list[0])
	if first != '"' && first != '[' { // one sequence of token ids
		t, e := ids(list, "input")
		if e != nil {
			return nil, e
		}
		return [][]int32{t}, nil
	}
	out := make([][]int32, len(list))
	for i, r := range list {
		where := fmt.Sprintf("input[%d]", i)
		if kind(r) != first {
			return nil, badRequest("input", "%s mixes kinds: input must be all strings or all arrays of token ids", where)
		}
		var e *apiError
		if first == '"' {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				return nil, badRequest("input", "%s is not a valid string: %v", where, err)
			}
			out[i], e = text(s, where)
		} else {
			var l []json.RawMessage
			if err := json.Unmarshal(r, &l); err != nil {
				return nil, badRequest("input", "%s is not a valid array: %v", where, err)
			}
			out[i], e = ids(l, where)
		}
		if e != nil {
			return nil, e
		}
	}
	return out, nil
}
