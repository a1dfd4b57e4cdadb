package openai

import (
	"fmt"
	"net/http"
)

// TokenizeRequest is the body of POST /tokenize (llama-server's shape, with
// the model named because one endpoint serves several).
type TokenizeRequest struct {
	Model      string `json:"model,omitempty"` // default: the only model, when there is one
	Content    string `json:"content"`
	AddSpecial bool   `json:"add_special,omitempty"` // add the BOS/EOS the vocabulary asks for
	WithPieces bool   `json:"with_pieces,omitempty"` // also return each token's text
}

// TokenPiece is a token with its text.
type TokenPiece struct {
	ID    int32  `json:"id"`
	Piece string `json:"piece"`
}

// TokenizeResponse answers POST /tokenize: token ids, or with
// with_pieces the tokens with their text.
type TokenizeResponse struct {
	Model  string `json:"model"`
	Tokens any    `json:"tokens"`
}

// DetokenizeRequest is the body of POST /detokenize.
type DetokenizeRequest struct {
	Model  string  `json:"model,omitempty"`
	Tokens []int32 `json:"tokens"`
}

// DetokenizeResponse answers POST /detokenize.
type DetokenizeResponse struct {
	Model   string `json:"model"`
	Content string `json:"content"`
}

// tokenModel is the model a tokenize request names, or the only one.
func (h *handler) tokenModel(x *exchange, name string) (*Model, *apiError) {
	if name == "" {
		ms := h.b.Models()
		if len(ms) != 1 {
			return nil, badRequest("model", "this endpoint serves %d models: name one with \"model\"", len(ms))
		}
		name = ms[0].Name
	}
	x.rec.Model = name
	m, e := h.lookup(x, name)
	if e != nil {
		return nil, e
	}
	if m.Tokenizer == nil {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "model", code: "model_not_supported",
			msg: fmt.Sprintf("The model `%s` has no tokenizer on this agent.", name)}
	}
	return m, nil
}

func (h *handler) tokenize(x *exchange) *apiError {
	var req TokenizeRequest
	if e := h.decode(x, &req); e != nil {
		return e
	}
	m, e := h.tokenModel(x, req.Model)
	if e != nil {
		return e
	}
	ids := m.Tokenizer.Encode(req.Content, req.AddSpecial)
	resp := TokenizeResponse{Model: m.Name, Tokens: ids}
	if ids == nil {
		resp.Tokens = []int32{}
	}
	if req.WithPieces {
		pieces := make([]TokenPiece, len(ids))
		for i, id := range ids {
			pieces[i] = TokenPiece{ID: id, Piece: string(m.Tokenizer.Piece(id))}
		}
		resp.Tokens = pieces
	}
	x.ok(resp)
	return nil
}

func (h *handler) detokenize(x *exchange) *apiError {
	var req DetokenizeRequest
	if e := h.decode(x, &req); e != nil {
		return e
	}
	m, e := h.tokenModel(x, req.Model)
	if e != nil {
		return e
	}
	n := int32(m.Tokenizer.NVocab())
	for i, id := range req.Tokens {
		if id < 0 || id >= n {
			return badRequest("tokens", "tokens[%d] = %d is outside the vocabulary [0,%d)", i, id, n)
		}
	}
	x.ok(DetokenizeResponse{Model: m.Name, Content: m.Tokenizer.Decode(req.Tokens)})
	return nil
}
