package node

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/engine/model"
	"shoal/engine/tokenizer"
)

// An embedding model given with --model (a BERT-style encoder) runs whole
// on this agent and answers POST /v1/embeddings here; it is not planned
// across the cluster.
type localEncoder struct {
	name, path string
	threads    int
}

// serveEncoders loads the encoders among the --model files and puts them
// on the endpoint.
func (a *Agent) serveEncoders() error {
	for _, le := range a.encoders {
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
