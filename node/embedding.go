package node

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

// An embedding model given with --model (a BERT-style encoder, or a
// decoder whose GGUF asks for pooling, like Qwen3-Embedding) runs whole on
// this agent and answers POST /v1/embeddings here; it is not planned
// across the cluster.
type localEncoder struct {
	name, path string
	threads    int
	// decoder: a decoder embedding model, pooled as pooling says, with a
	// KV cache of ctx tokens (0: the model's context, at most 8192).
	decoder bool
	pooling model.Pooling
	ctx     int
}

// serveEncoders loads the encoders among the --model files and puts them
// on the endpoint.
func (a *Agent) serveEncoders() error {
	for _, le := range a.encoders {
		if le.decoder {
			if err := a.serveDecoderEmbedder(le); err != nil {
				return fmt.Errorf("%s: %w", le.path, err)
			}
			continue
		}
		enc, err := model.OpenEncoder(le.path, le.threads)
		if err != nil {
			return fmt.Errorf("%s: %w", le.path, err)
		}
		tok, err := tokenizer.FromGGUF(enc.File)
		if err != nil {
			enc.Close()
			return fmt.Errorf("%s: %w", le.path, err)
		}
		a.encoderClosers = append(a.encoderClosers, enc.Close)
		a.models.Set(&openai.Model{Name: le.name, Tokenizer: openAITokenizer{tok, ""}, Embedder: EncoderEmbedder(enc),
			Created: time.Now(), OwnedBy: a.cfg.Name})
		a.log.Info("serving embedding model", zap.String("model", le.name), zap.Int("dims", enc.Dims()), zap.Int("context", enc.MaxTokens()))
	}
	return nil
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

// serveDecoderEmbedder loads a decoder embedding model on a runner of its
// own and puts it on the endpoint.
func (a *Agent) serveDecoderEmbedder(le localEncoder) error {
	m, err := model.Open(le.path)
	if err != nil {
		return err
	}
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		m.Close()
		return err
	}
	ctx := le.ctx
	if ctx == 0 {
		ctx = min(m.NCtx, 8192)
	}
	r, err := model.NewRunner(m, model.Options{Threads: le.threads, CacheTokens: ctx})
	if err != nil {
		m.Close()
		return err
	}
	a.encoderClosers = append(a.encoderClosers, func() error { r.Close(); return m.Close() })
	a.models.Set(&openai.Model{Name: le.name, Tokenizer: openAITokenizer{tok, ""}, Embedder: &decoderEmbedder{r: r, pooling: le.pooling, ctx: ctx},
		Created: time.Now(), OwnedBy: a.cfg.Name})
	a.log.Info("serving embedding model", zap.String("model", le.name), zap.String("kind", "decoder"), zap.Stringer("pooling", le.pooling),
		zap.Int("dims", m.NEmbd), zap.Int("context", ctx))
	return nil
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
