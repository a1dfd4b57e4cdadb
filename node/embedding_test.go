package node_test

import (
	"context"
	"math"
	"testing"
	"time"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestAgentServesEmbeddings: an embedding GGUF given with --model is served
// whole on its agent at /v1/embeddings (official OpenAI client), its
// vectors those of the encoder run directly, normalized.
func TestAgentServesEmbeddings(t *testing.T) {
	path := enginetest.Write(t, "", synth.Spec{Name: "emb", Arch: "bert", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128,
		Ctx: 64, Type: "q8_0", Seed: 3, Std: 0.04})
	c := tc.NewWith(t, 1, func(_ int, cfg *node.Config) {
		cfg.Models = []node.ModelConfig{{Path: path, Name: "emb"}}
	})
	c.Leader(20 * time.Second)
	a := c.Members[0].Agent
	cl := oa.NewClient(option.WithBaseURL(a.HTTPURL()+"/v1/"), option.WithAPIKey(tc.Secret), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inputs := []string{"hello world", "a cluster of ordinary machines"}
	res, err := cl.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "emb",
		Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != 2 || res.Usage.PromptTokens == 0 {
		t.Fatalf("embeddings: %d vectors, usage %+v", len(res.Data), res.Usage)
	}
	enc, err := model.OpenEncoder(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	tok, err := tokenizer.FromGGUF(enc.File)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range res.Data {
		want, err := enc.Embed(tok.Encode(inputs[i], true, true))
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Embedding) != len(want) || len(want) != 64 {
			t.Fatalf("input %d: %d dims, want %d", i, len(d.Embedding), len(want))
		}
		var norm float64
		for j, v := range d.Embedding {
			norm += v * v
			if math.Abs(v-float64(want[j])) > 1e-6 {
				t.Fatalf("input %d dim %d: %v, the encoder gives %v", i, j, v, want[j])
			}
		}
		if math.Abs(norm-1) > 1e-4 {
			t.Fatalf("input %d: |v|^2 = %v, want 1", i, norm)
		}
	}
}

// TestAgentServesDecoderEmbeddings: a decoder GGUF that asks for pooling
// (Qwen3-Embedding style: qwen3, pooling_type last) given with --model is
// served as an embedding model, its vectors those of the runner's pooled
// hidden states; it does not generate.
func TestAgentServesDecoderEmbeddings(t *testing.T) {
	spec := synth.Spec{Name: "qemb", Arch: "qwen3", NLayer: 2, NEmbd: 64, NHead: 8, NHeadKV: 2, HeadDim: 16, NFF: 128, Ctx: 128,
		Type: "q8_0", Std: 0.08, Seed: 31, Pooling: int(model.PoolLast)}
	path := enginetest.Write(t, "", spec)
	c := tc.NewWith(t, 1, func(_ int, cfg *node.Config) {
		cfg.Models = []node.ModelConfig{{Path: path, Name: "qemb"}}
	})
	c.Leader(20 * time.Second)
	a := c.Members[0].Agent
	cl := oa.NewClient(option.WithBaseURL(a.HTTPURL()+"/v1/"), option.WithAPIKey(tc.Secret), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inputs := []string{"hello world", "a cluster of ordinary machines", "hello world"}
	res, err := cl.Embeddings.New(ctx, oa.EmbeddingNewParams{Model: "qemb",
		Input: oa.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(res.Data) != 3 {
		t.Fatalf("%d vectors", len(res.Data))
	}
	for i, d := range res.Data {
		want, err := r.EmbedPooled(1, tok.Encode(inputs[i], true, true), model.PoolLast)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Embedding) != 64 {
			t.Fatalf("input %d: %d dims, want 64", i, len(d.Embedding))
		}
		var dot float64
		for j, v := range d.Embedding {
			dot += v * float64(want[j])
		}
		if dot < 0.99999 {
			t.Fatalf("input %d: cosine %v with the runner's pooled vector", i, dot)
		}
	}
	if _, err := cl.Chat.Completions.New(ctx, oa.ChatCompletionNewParams{Model: "qemb", Messages: []oa.ChatCompletionMessageParamUnion{oa.UserMessage("hi")}}); err == nil {
		t.Fatal("the embedding model generated a chat completion")
	}
}
