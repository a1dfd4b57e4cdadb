package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/engine/model"
	"shoal/engine/tokenizer"
)

// Embedding is an embedding model given with --model (a BERT-style
// encoder, or a decoder whose GGUF asks for pooling, like
// Qwen3-Embedding): it runs whole on the agent given it and answers POST
// /v1/embeddings there; it is not planned across the cluster.
type Embedding struct {
	Name, Path string
	Threads    int
	// Decoder: a decoder embedding model, pooled as Pooling says, with a
	// KV cache of Ctx tokens (0: the model's context, at most 8192).
	Decoder bool
	Pooling model.Pooling
	Ctx     int
}

// OpenEmbedding loads e as a model of the OpenAI endpoint owned by owner;
// closeFn releases it. Errors name e's path.
func OpenEmbedding(e Embedding, owner string, log *zap.Logger) (m *openai.Model, closeFn func() error, err error) {
	if e.Decoder {
		m, closeFn, err = openDecoderEmbedder(e, owner, log)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", e.Path, err)
		}
		return m, closeFn, nil
	}
	enc, err := model.OpenEncoder(e.Path, e.Threads)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", e.Path, err)
	}
	tok, err := tokenizer.FromGGUF(enc.File)
	if err != nil {
		enc.Close()
		return nil, nil, fmt.Errorf("%s: %w", e.Path, err)
	}
	m = &openai.Model{Name: e.Name, Tokenizer: newOpenAITokenizer(tok, ""), Embedder: EncoderEmbedder(enc),
		Created: time.Now(), OwnedBy: owner}
	log.Info("serving embedding model", zap.String("model", e.Name), zap.Int("dims", enc.Dims()), zap.Int("context", enc.MaxTokens()))
	return m, enc.Close, nil
}

// EncoderEmbedder runs the endpoint's embedding requests on enc, one
// input after another.
func EncoderEmbedder(enc *model.Encoder) openai.Embedder { return encoderEmbedder{enc} }

type encoderEmbedder struct{ e *model.Encoder }

func (x encoderEmbedder) Dims() int      { return x.e.Dims() }
func (x encoderEmbedder) MaxTokens() int { return x.e.MaxTokens() }

func (x encoderEmbedder) Embed(ctx context.Context, inputs [][]int32) ([][]float32, error) {
	out := make([][]float32, len(inputs))
	for i, in := range inputs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		v, err := x.e.Embed(in)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", openai.ErrBadInput, err)
		}
		out[i] = v
	}
	return out, nil
}

// openDecoderEmbedder loads a decoder embedding model on a runner of its
// own.
func openDecoderEmbedder(e Embedding, owner string, log *zap.Logger) (*openai.Model, func() error, error) {
	m, err := model.Open(e.Path)
	if err != nil {
		return nil, nil, err
	}
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	ctx := e.Ctx
	if ctx == 0 {
		ctx = min(m.NCtx, 8192)
	}
	r, err := model.NewRunner(m, model.Options{Threads: e.Threads, CacheTokens: ctx})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	om := &openai.Model{Name: e.Name, Tokenizer: newOpenAITokenizer(tok, ""), Embedder: &decoderEmbedder{r: r, pooling: e.Pooling, ctx: ctx},
		Created: time.Now(), OwnedBy: owner}
	log.Info("serving embedding model", zap.String("model", e.Name), zap.String("kind", "decoder"), zap.Stringer("pooling", e.Pooling),
		zap.Int("dims", m.NEmbd), zap.Int("context", ctx))
	return om, func() error { r.Close(); return m.Close() }, nil
}

// decoderEmbedder runs the endpoint's embedding requests on a decoder's
// runner, one input after another (the runner serves one at a time).
type decoderEmbedder struct {
	mu      sync.Mutex
	r       *model.Runner
	pooling model.Pooling
	ctx     int
}

func (x *decoderEmbedder) Dims() int      { return x.r.Model().NEmbd }
func (x *decoderEmbedder) MaxTokens() int { return x.ctx }

func (x *decoderEmbedder) Embed(ctx context.Context, inputs [][]int32) ([][]float32, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([][]float32, len(inputs))
	for i, in := range inputs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		v, err := x.r.EmbedPooled(0, in, x.pooling)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", openai.ErrBadInput, err)
		}
		out[i] = v
	}
	return out, nil
}
