package model

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"shoal/engine/device/cpu"
	"shoal/engine/gguf"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// ErrEncoder is returned (wrapped) by ConfigFromGGUF, Load and Open for an
// embedding encoder architecture (bert): it has no logits and is not
// served by the layer-range Runner; LoadEncoder / OpenEncoder load it.
var ErrEncoder = errors.New("an embedding model (a BERT-style encoder), not a generative one: it answers POST /v1/embeddings on an agent started with --model FILE, and cannot generate text")

// Pooling is how an encoder turns its per-token hidden states into one
// vector (llama.cpp's llama_pooling_type, the GGUF key %s.pooling_type).
type Pooling int

const (
	PoolNone Pooling = 0 // per-token output in llama.cpp; shoal pools by the mean
	PoolMean Pooling = 1
	PoolCLS  Pooling = 2 // the first token's ([CLS]) state
	PoolLast Pooling = 3 // the last token's state
	PoolRank Pooling = 4 // a reranker's classification head: not supported
)

func (p Pooling) String() string {
	switch p {
	case PoolNone:
		return "none"
	case PoolMean:
		return "mean"
	case PoolCLS:
		return "cls"
	case PoolLast:
		return "last"
	case PoolRank:
		return "rank"
	}
	return fmt.Sprintf("pooling(%d)", int(p))
}

// EncoderConfig holds an encoder's hyperparameters.
type EncoderConfig struct {
	Arch        string
	NEmbd       int
	NLayer      int
	NHead       int
	HeadDim     int
	NFF         int
	NVocab      int
	NCtx        int // training context: the number of position embeddings
	NTokenTypes int // rows of token_types (0 when absent)
	Eps         float32
	Pooling     Pooling
}

// EncoderLayer holds one post-LayerNorm encoder block (llama.cpp's
// llm_build_bert for LLM_ARCH_BERT).
type EncoderLayer struct {
	Wq, Wk, Wv, Wo          *kernels.Matrix
	Bq, Bk, Bv, Bo          []float32
	AttnOutNorm, AttnOutB   []float32 // attn_output_norm weight and bias
	Up, Down                *kernels.Matrix
	BUp, BDown              []float32
	LayerOutNorm, LayerOutB []float32 // layer_output_norm weight and bias
}

// Encoder is a loaded BERT-style embedding model: token, position and token
// type 0 embeddings, an embedding LayerNorm, bidirectional post-LayerNorm
// layers with GELU FFNs, then pooling and L2 normalization. It is safe for
// concurrent use (calls are serialized).
type Encoder struct {
	EncoderConfig
	TokEmbd, PosEmbd *kernels.Matrix
	TypeEmbd0        []float32 // row 0 of token_types (sentence A), or nil
	EmbNorm, EmbB    []float32
	Layers           []EncoderLayer
	File             *gguf.File

	mu   sync.Mutex
	pool *kernels.Pool
}

// IsEncoder reports whether f holds an encoder architecture.
func IsEncoder(f *gguf.File) bool {
	name, _ := f.String("general.architecture")
	a, ok := archs[name]
	return ok && a.Encoder
}

// EncoderConfigFromGGUF reads an encoder's hyperparameters (llama.cpp's
// load_hparams for bert: %s.embedding_length, block_count,
// attention.head_count, feed_forward_length, context_length,
// attention.layer_norm_epsilon, pooling_type, attention.causal).
func EncoderConfigFromGGUF(f *gguf.File) (EncoderConfig, error) {
	name, _ := f.String("general.architecture")
	if a, ok := archs[name]; !ok || !a.Encoder {
		return EncoderConfig{}, fmt.Errorf("architecture %q is not an embedding encoder (encoders: bert)", name)
	}
	c := EncoderConfig{Arch: name}
	p := name + "."
	r := intReader{f: f, prefix: p}
	geti := r.get
	geti("embedding_length", &c.NEmbd, true, 0)
	geti("block_count", &c.NLayer, true, 0)
	geti("attention.head_count", &c.NHead, true, 0)
	geti("feed_forward_length", &c.NFF, true, 0)
	geti("context_length", &c.NCtx, false, 512)
	var pool int
	geti("pooling_type", &pool, false, int(PoolMean))
	if r.err != nil {
		return EncoderConfig{}, r.err
	}
	if c.NEmbd == 0 || c.NLayer == 0 || c.NHead == 0 || c.NFF == 0 || c.NEmbd%c.NHead != 0 {
		return EncoderConfig{}, fmt.Errorf("embedding_length %d, block_count %d, head_count %d, feed_forward_length %d: need positive sizes and heads dividing the width",
			c.NEmbd, c.NLayer, c.NHead, c.NFF)
	}
	c.HeadDim = c.NEmbd / c.NHead
	if kv, ok := f.Int(p + "attention.head_count_kv"); ok && int(kv) != c.NHead {
		return EncoderConfig{}, fmt.Errorf("head_count_kv %d differs from head_count %d: not supported for %s", kv, c.NHead, name)
	}
	c.Eps = 1e-12
	if v, ok := f.Float(p + "attention.layer_norm_epsilon"); ok {
		c.Eps = float32(v)
	}
	if causal, ok := f.Bool(p + "attention.causal"); ok && causal {
		return EncoderConfig{}, fmt.Errorf("%sattention.causal is true: causal encoders are not supported", p)
	}
	c.Pooling = Pooling(pool)
	switch c.Pooling {
	case PoolNone:
		c.Pooling = PoolMean // an OpenAI embedding is one vector per input
	case PoolMean, PoolCLS, PoolLast:
	default:
		return EncoderConfig{}, fmt.Errorf("%spooling_type %s is not supported (mean, cls and last are)", p, c.Pooling)
	}
	if c.NVocab = vocabSize(f, p); c.NVocab <= 0 {
		return EncoderConfig{}, fmt.Errorf("no vocabulary size (%svocab_size or tokenizer.ggml.tokens)", p)
	}
	return c, nil
}

// LoadEncoder binds the encoder in f (tensor names as llama.cpp's
// LLM_ARCH_BERT: token_embd, position_embd, token_types, token_embd_norm,
// blk.N.attn_q/k/v/output, attn_output_norm, ffn_up/ffn_down,
// layer_output_norm, each with a bias). f must stay open while the encoder
// is used; threads is the worker count (all cores if 0).
func LoadEncoder(f *gguf.File, threads int) (*Encoder, error) {
	c, err := EncoderConfigFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", displayPath(f), err)
	}
	e := &Encoder{EncoderConfig: c, File: f}
	if err := e.bind(&loader{f: f}); err != nil {
		return nil, fmt.Errorf("%s: %w", displayPath(f), err)
	}
	e.pool = kernels.NewPool(threads)
	return e, nil
}

// OpenEncoder maps and loads the GGUF encoder at path.
func OpenEncoder(path string, threads int) (*Encoder, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	e, err := LoadEncoder(f, threads)
	if err != nil {
		f.Close()
		return nil, err
	}
	return e, nil
}

// Close stops the encoder's threads and unmaps its file.
func (e *Encoder) Close() error {
	e.pool.Close()
	if e.File == nil {
		return nil
	}
	return e.File.Close()
}

func (e *Encoder) bind(l *loader) error {
	E, F := e.NEmbd, e.NFF
	var err error
	must := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	var x error
	e.TokEmbd, x = l.matrix("token_embd.weight", true, E, e.NVocab)
	must(x)
	e.PosEmbd, x = l.matrix("position_embd.weight", true, E, e.NCtx)
	must(x)
	if t, ok := l.f.Tensor("token_types.weight"); ok && err == nil {
		e.NTokenTypes = t.Dim(1)
		types, x := l.matrix("token_types.weight", true, E, e.NTokenTypes)
		must(x)
		if types != nil {
			e.TypeEmbd0 = make([]float32, E)
			quant.DequantizeRow(types.Type, types.Row(0), e.TypeEmbd0)
		}
	}
	e.EmbNorm, x = l.vector("token_embd_norm.weight", true, E)
	must(x)
	e.EmbB, x = l.vector("token_embd_norm.bias", true, E)
	must(x)
	if _, fused := l.f.Tensor("blk.0.attn_qkv.weight"); fused {
		return fmt.Errorf("fused attn_qkv tensors are not supported (separate attn_q, attn_k, attn_v are)")
	}
	e.Layers = make([]EncoderLayer, e.NLayer)
	for i := range e.Layers {
		ly := &e.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		for _, m := range []struct {
			name     string
			w        **kernels.Matrix
			b        *[]float32
			in, outN int
		}{
			{"attn_q", &ly.Wq, &ly.Bq, E, E},
			{"attn_k", &ly.Wk, &ly.Bk, E, E},
			{"attn_v", &ly.Wv, &ly.Bv, E, E},
			{"attn_output", &ly.Wo, &ly.Bo, E, E},
			{"ffn_up", &ly.Up, &ly.BUp, E, F},
			{"ffn_down", &ly.Down, &ly.BDown, F, E},
		} {
			*m.w, x = l.matrix(p+m.name+".weight", true, m.in, m.outN)
			must(x)
			*m.b, x = l.vector(p+m.name+".bias", true, m.outN)
			must(x)
		}
		ly.AttnOutNorm, x = l.vector(p+"attn_output_norm.weight", true, E)
		must(x)
		ly.AttnOutB, x = l.vector(p+"attn_output_norm.bias", true, E)
		must(x)
		ly.LayerOutNorm, x = l.vector(p+"layer_output_norm.weight", true, E)
		must(x)
		ly.LayerOutB, x = l.vector(p+"layer_output_norm.bias", true, E)
		must(x)
		if err != nil {
			return err
		}
	}
	return err
}

// Dims is the length of the embeddings the encoder produces.
func (e *Encoder) Dims() int { return e.NEmbd }

// MaxTokens is the longest input the encoder takes (its position embeddings).
func (e *Encoder) MaxTokens() int { return e.NCtx }

// Embed runs the encoder on one token sequence (special tokens included)
// and returns its pooled, L2-normalized embedding (NEmbd values).
func (e *Encoder) Embed(tokens []int32) ([]float32, error) {
	n := len(tokens)
	if n == 0 {
		return nil, fmt.Errorf("no tokens to embed")
	}
	if n > e.NCtx {
		return nil, fmt.Errorf("%d tokens exceed the encoder's context of %d", n, e.NCtx)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= e.TokEmbd.Rows {
			return nil, fmt.Errorf("token id %d is outside the vocabulary [0,%d)", t, e.TokEmbd.Rows)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pool.Hold()
	defer e.pool.Release()
	h := e.hidden(tokens)
	out := make([]float32, e.NEmbd)
	poolNormalize(h, n, e.Pooling, out)
	return out, nil
}

// poolNormalize pools the hidden states h ([n][len(out)]) into out as p
// says (mean for PoolNone and PoolMean) and L2-normalizes it.
func poolNormalize(h []float32, n int, p Pooling, out []float32) {
	E := len(out)
	switch p {
	case PoolCLS:
		copy(out, h[:E])
	case PoolLast:
		copy(out, h[(n-1)*E:n*E])
	default:
		sum := make([]float64, E)
		for i := 0; i < n; i++ {
			for j, v := range h[i*E : (i+1)*E] {
				sum[j] += float64(v)
			}
		}
		for j := range out {
			out[j] = float32(sum[j] / float64(n))
		}
	}
	var ss float64
	for _, v := range out {
		ss += float64(v) * float64(v)
	}
	if ss > 0 {
		inv := 1 / math.Sqrt(ss)
		for j := range out {
			out[j] = float32(float64(out[j]) * inv)
		}
	}
}

// encScratch is one Embed call's working space.
type encScratch struct {
	x, q, k, v, att, o, ff []float32
	acts                   []byte
}

// matmul computes out[i] = W·x[i] + b for n rows, quantizing x to W's
// activation format once.
func (e *Encoder) matmul(s *encScratch, w *kernels.Matrix, b []float32, x []float32, n int, out []float32) {
	t := w.ActType()
	s.acts = grow(s.acts, n*t.RowSize(w.Cols))
	kernels.QuantizeActs(e.pool, t, x, n, w.Cols, s.acts)
	kernels.MatMul(e.pool, w, s.acts, n, out, w.Rows)
	for i := 0; i < n; i++ {
		cpu.AddBias(out[i*w.Rows:(i+1)*w.Rows], b)
	}
}

// hidden runs the embeddings and every layer and returns the last layer's
// hidden states ([n][NEmbd]).
func (e *Encoder) hidden(tokens []int32) []float32 {
	n, E, F := len(tokens), e.NEmbd, e.NFF
	s := &encScratch{
		x: make([]float32, n*E), q: make([]float32, n*E), k: make([]float32, n*E), v: make([]float32, n*E),
		att: make([]float32, n*E), o: make([]float32, n*E), ff: make([]float32, n*F),
	}
	pos := make([]float32, E)
	for i, t := range tokens {
		xi := s.x[i*E : (i+1)*E]
		quant.DequantizeRow(e.TokEmbd.Type, e.TokEmbd.Row(int(t)), xi)
		if e.TypeEmbd0 != nil {
			cpu.AddBias(xi, e.TypeEmbd0)
		}
		quant.DequantizeRow(e.PosEmbd.Type, e.PosEmbd.Row(i), pos)
		cpu.AddBias(xi, pos)
		layerNorm(xi, xi, e.EmbNorm, e.EmbB, e.Eps)
	}
	for l := range e.Layers {
		ly := &e.Layers[l]
		e.matmul(s, ly.Wq, ly.Bq, s.x, n, s.q)
		e.matmul(s, ly.Wk, ly.Bk, s.x, n, s.k)
		e.matmul(s, ly.Wv, ly.Bv, s.x, n, s.v)
		e.attention(s, n)
		e.matmul(s, ly.Wo, ly.Bo, s.att, n, s.o)
		for i := 0; i < n; i++ {
			xi, oi := s.x[i*E:(i+1)*E], s.o[i*E:(i+1)*E]
			for j := range xi {
				xi[j] += oi[j]
			}
			layerNorm(xi, xi, ly.AttnOutNorm, ly.AttnOutB, e.Eps)
		}
		e.matmul(s, ly.Up, ly.BUp, s.x, n, s.ff)
		gelu(s.ff[:n*F])
		e.matmul(s, ly.Down, ly.BDown, s.ff, n, s.o)
		for i := 0; i < n; i++ {
			xi, oi := s.x[i*E:(i+1)*E], s.o[i*E:(i+1)*E]
			for j := range xi {
				xi[j] += oi[j]
			}
			layerNorm(xi, xi, ly.LayerOutNorm, ly.LayerOutB, e.Eps)
		}
	}
	return s.x
}

// attention computes, for every head and token, softmax(q·Kᵀ/√d)·V over
// all tokens of the sequence (no causal mask), into s.att.
func (e *Encoder) attention(s *encScratch, n int) {
	E, D, H := e.NEmbd, e.HeadDim, e.NHead
	scale := float32(1 / math.Sqrt(float64(D)))
	e.pool.Run(H*n, 1, func(lo, hi int) {
		scores := make([]float32, n)
		for u := lo; u < hi; u++ {
			h, i := u/n, u%n
			q := s.q[i*E+h*D : i*E+(h+1)*D]
			for j := 0; j < n; j++ {
				k := s.k[j*E+h*D : j*E+(h+1)*D]
				var dot float32
				for d, qv := range q {
					dot += qv * k[d]
				}
				scores[j] = dot * scale
			}
			cpu.Softmax(scores)
			out := s.att[i*E+h*D : i*E+(h+1)*D]
			clear(out)
			for j, p := range scores {
				v := s.v[j*E+h*D : j*E+(h+1)*D]
				for d := range out {
					out[d] += p * v[d]
				}
			}
		}
	})
}

// layerNorm writes (x - mean) / sqrt(var + eps) * w + b to dst (ggml_norm:
// the mean and variance summed in float64, then the weight and bias).
func layerNorm(dst, x, w, b []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v)
	}
	mean := float32(sum / float64(len(x)))
	var sq float64
	for _, v := range x {
		d := v - mean
		sq += float64(d * d)
	}
	scale := float32(1 / math.Sqrt(sq/float64(len(x))+float64(eps)))
	for i, v := range x {
		dst[i] = (v-mean)*scale*w[i] + b[i]
	}
}

// gelu applies ggml's GELU (the tanh approximation,
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) in place.
func gelu(x []float32) {
	const c = 0.7978845608028654 // √(2/π)
	for i, v := range x {
		f := float64(v)
		x[i] = float32(0.5 * f * (1 + math.Tanh(c*(f+0.044715*f*f*f))))
	}
}
