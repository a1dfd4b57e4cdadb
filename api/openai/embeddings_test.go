package openai_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/gateway"
)

// wpmTokenizer is the endpoint's view of a tokenizer (as the node's adapter
// gives it, without a chat template).
type wpmTokenizer struct{ t *tokenizer.Tokenizer }

func (w wpmTokenizer) Encode(text string, addSpecial bool) []int32 {
	return w.t.Encode(text, addSpecial, true)
}
func (w wpmTokenizer) Decode(ids []int32) string  { return w.t.Detokenize(ids, false, false) }
func (w wpmTokenizer) Piece(id int32) []byte      { return w.t.Piece(id) }
func (w wpmTokenizer) NewDecoder() openai.Decoder { return w.t.NewContinuationDecoder() }
func (w wpmTokenizer) NVocab() int                { return w.t.NVocab() }
func (w wpmTokenizer) Specials() openai.Specials  { return openai.Specials{} }
func (w wpmTokenizer) ChatTemplate() string       { return "" }

type embEnv struct {
	srv *httptest.Server
	enc *model.Encoder
	tok *tokenizer.Tokenizer
	c   oa.Client
}

// newEmbEnv serves "emb", a small random BERT (q8_0, context 32), and
// "chat", a model without an Embedder.
func newEmbEnv(t *testing.T) *embEnv {
	t.Helper()
	spec := synth.Spec{Name: "bert-emb", Arch: "bert", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Ctx: 32, Type: "q8_0", Seed: 3, Std: 0.04}
	path := enginetest.Write(t, t.TempDir(), spec)
	enc, err := model.OpenEncoder(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(enc.File)
	if err != nil {
		t.Fatal(err)
	}
	emb := &openai.Model{Name: "emb", Tokenizer: wpmTokenizer{tok}, Embedder: gateway.EncoderEmbedder(enc)}
	chat := &openai.Model{Name: "chat", Tokenizer: wpmTokenizer{tok}}
	srv := httptest.NewServer(openai.NewHandler(openai.NewStaticBackend(emb, chat), openai.Options{Log: zap.NewNop()}))
	t.Cleanup(func() {
		srv.Close()
		enc.Close()
	})
	c := oa.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0), option.WithHTTPClient(srv.Client()))
	return &embEnv{srv: srv, enc: enc, tok: tok, c: c}
}

func (e *embEnv) want(t *testing.T, text string) []float32 {
	t.Helper()
	v, err := e.enc.Embed(e.tok.Encode(text, true, true))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sameVector(t *testing.T, what string, got []float64, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if float32(got[i]) != want[i] {
			t.Fatalf("%s: value %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestEmbeddingsClient(t *testing.T) {
	e := newEmbEnv(t)
	ctx := context.Background()
	texts := []string{"Hello, world!", "The cat sat on the mat.", "searching documents"}

	// One string, float.
	res, err := e.c.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "emb",
		Input: oa.EmbeddingNewParamsInputUnion{OfString: oa.String(texts[0])}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Object != "list" || res.Model != "emb" || len(res.Data) != 1 || res.Data[0].Object != "embedding" || res.Data[0].Index != 0 {
		t.Fatalf("envelope %+v", res)
	}
	n0 := len(e.tok.Encode(texts[0], true, true))
	if res.Usage.PromptTokens != int64(n0) || res.Usage.TotalTokens != int64(n0) {
		t.Errorf("usage %+v, want %d tokens", res.Usage, n0)
	}
	sameVector(t, "float", res.Data[0].Embedding, e.want(t, texts[0]))
	var norm float64
	for _, v := range res.Data[0].Embedding {
		norm += v * v
	}
	if math.Abs(norm-1) > 1e-4 {
		t.Errorf("|embedding|² = %g", norm)
	}

	// A batch of strings, base64 (the client decodes the float32 bytes).
	res, err = e.c.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "emb", EncodingFormat: oa.EmbeddingNewParamsEncodingFormatBase64,
		Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != len(texts) {
		t.Fatalf("%d embeddings for %d inputs", len(res.Data), len(texts))
	}
	if !strings.Contains(res.RawJSON(), `"embedding":"`) {
		t.Errorf("base64 answer without a string embedding: %.200s", res.RawJSON())
	}
	total := 0
	for i, d := range res.Data {
		if d.Index != int64(i) {
			t.Errorf("data[%d].index = %d", i, d.Index)
		}
		sameVector(t, fmt.Sprintf("base64 %d", i), d.Embedding, e.want(t, texts[i]))
		total += len(e.tok.Encode(texts[i], true, true))
	}
	if res.Usage.PromptTokens != int64(total) || res.Usage.TotalTokens != int64(total) {
		t.Errorf("batch usage %+v, want %d", res.Usage, total)
	}

	// Token arrays are taken as they are; one array of ids is one input.
	ids := e.tok.Encode(texts[1], true, true)
	ids64 := make([]int64, len(ids))
	for i, id := range ids {
		ids64[i] = int64(id)
	}
	res, err = e.c.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "emb",
		Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: [][]int64{ids64, ids64[:3]}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != 2 || res.Usage.PromptTokens != int64(len(ids)+3) {
		t.Fatalf("token arrays: %d embeddings, usage %+v", len(res.Data), res.Usage)
	}
	sameVector(t, "token array", res.Data[0].Embedding, e.want(t, texts[1]))
	res, err = e.c.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "emb", Dimensions: oa.Int(64),
		Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfTokens: ids64}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != 1 {
		t.Fatalf("one token array: %d embeddings", len(res.Data))
	}
	sameVector(t, "tokens", res.Data[0].Embedding, e.want(t, texts[1]))
}

func TestEmbeddingsErrors(t *testing.T) {
	e := newEmbEnv(t)
	ctx := context.Background()
	long := strings.Repeat("cat ", 40) // 40 words + [CLS] [SEP] > 32
	for _, c := range []struct {
		name   string
		p      oa.EmbeddingNewParams
		status int
		param  string
		code   string
		msg    string
	}{
		{"not an embedding model", oa.EmbeddingNewParams{Model: "chat", Input: oa.EmbeddingNewParamsInputUnion{OfString: oa.String("hi")}},
			400, "model", "model_not_supported", "The model `chat` is a generative model and does not produce embeddings"},
		{"unknown model", oa.EmbeddingNewParams{Model: "nope", Input: oa.EmbeddingNewParamsInputUnion{OfString: oa.String("hi")}},
			404, "model", "model_not_found", "does not exist"},
		{"empty string", oa.EmbeddingNewParams{Model: "emb", Input: oa.EmbeddingNewParamsInputUnion{OfString: oa.String("")}},
			400, "input", "", "empty string"},
		{"empty string in a batch", oa.EmbeddingNewParams{Model: "emb", Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", ""}}},
			400, "input", "", "input[1] is an empty string"},
		{"too long", oa.EmbeddingNewParams{Model: "emb", Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", long}}},
			400, "input", "context_length_exceeded", "input[1] has 42 tokens, more than the model's maximum context length of 32"},
		{"token out of range", oa.EmbeddingNewParams{Model: "emb", Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{101, 99999}}},
			400, "input", "", "input[1] = 99999 is not a token id"},
		{"dimensions", oa.EmbeddingNewParams{Model: "emb", Dimensions: oa.Int(32), Input: oa.EmbeddingNewParamsInputUnion{OfString: oa.String("hi")}},
			400, "dimensions", "", "produces 64-dimensional embeddings"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.c.Embeddings.New(ctx, c.p)
			var ae *oa.Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %v, want an API error", err)
			}
			if ae.StatusCode != c.status || ae.Param != c.param || ae.Code != c.code || !strings.Contains(ae.Message, c.msg) {
				t.Errorf("got %d param %q code %q %q; want %d param %q code %q containing %q", ae.StatusCode, ae.Param, ae.Code, ae.Message, c.status, c.param, c.code, c.msg)
			}
		})
	}
	// Malformed bodies the client cannot send.
	for _, c := range []struct{ body, msg string }{
		{`{"model":"emb"}`, "you must provide an input"},
		{`{"model":"emb","input":null}`, "you must provide an input"},
		{`{"model":"emb","input":[]}`, "empty array"},
		{`{"model":"emb","input":[[]]}`, "input[0] is an empty array"},
		{`{"model":"emb","input":42}`, "input must be a string"},
		{`{"model":"emb","input":["a",[1,2]]}`, "mixes kinds"},
		{`{"model":"emb","input":[1.5]}`, "is not a token id"},
		{`{"model":"emb","input":[-1]}`, "is not a token id"},
		{`{"model":"emb","input":[{"a":1}]}`, "is not a token id"},
		{`{"model":"emb","input":"hi","encoding_format":"int8"}`, `encoding_format "int8" is not supported`},
		{`{"input":"hi"}`, "you must provide a model"},
		{`{"model":"emb","input":"hi"`, ""},
	} {
		resp, err := e.srv.Client().Post(e.srv.URL+"/v1/embeddings", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b := decodeBody[openai.ErrorBody](t, resp)
		if resp.StatusCode != http.StatusBadRequest || b.Error.Type != "invalid_request_error" || !strings.Contains(b.Error.Message, c.msg) {
			t.Errorf("%s: %d %+v, want 400 containing %q", c.body, resp.StatusCode, b.Error, c.msg)
		}
	}
	// Too many inputs.
	many := make([]string, 2049)
	for i := range many {
		many[i] = "a"
	}
	_, err := e.c.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "emb", Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfStrings: many}})
	var ae *oa.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.Message, "2049 items") {
		t.Errorf("2049 inputs: %v", err)
	}
	// GET is not allowed.
	resp, err := e.srv.Client().Get(e.srv.URL + "/v1/embeddings")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
}

// TestEmbeddingsConcurrent sends requests at once: each gets the vector of
// its own text.
func TestEmbeddingsConcurrent(t *testing.T) {
	e := newEmbEnv(t)
	texts := []string{"hello", "world", "the cat", "a dog sat", "searching documents", "model vector"}
	errs := make(chan error, len(texts))
	got := make([][]float64, len(texts))
	for i, text := range texts {
		go func() {
			res, err := e.c.Embeddings.New(context.Background(), oa.EmbeddingNewParams{Model: "emb",
				Input: oa.EmbeddingNewParamsInputUnion{OfString: oa.String(text)}})
			if err == nil {
				got[i] = res.Data[0].Embedding
			}
			errs <- err
		}()
	}
	for range texts {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, text := range texts {
		sameVector(t, text, got[i], e.want(t, text))
	}
}
