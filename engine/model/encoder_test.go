package model_test

// A float64 reference of llama.cpp's BERT forward pass (src/models/bert.cpp,
// LLM_ARCH_BERT), written from the graph, not from encoder.go: inpL =
// token_embd[t] + token_types[0] + position_embd[pos]; build_norm(LLM_NORM,
// token_embd_norm w/b); per layer Q,K,V = W·x + b, attention over all
// tokens (no mask) with kq_scale 1/sqrt(head_dim), wo·att + bo, + x,
// build_norm(attn_output_norm), build_ffn(up+b, GELU, down+b) (ggml_gelu:
// the tanh approximation), + ffn input, build_norm(layer_output_norm);
// then pooling by bert.pooling_type (mean 1, cls 2, last 3) and the L2
// normalization of llama.cpp's embedding output (common_embd_normalize 2).

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
)

type refBertLayer struct {
	wq, wk, wv, wo, up, down   [][]float64
	bq, bk, bv, bo, bup, bdown []float64
	n1w, n1b, n2w, n2b         []float64
}

type refBert struct {
	E, H, F  int
	eps      float64
	pool     int
	tok, pos [][]float64
	type0    []float64
	enw, enb []float64
	layers   []refBertLayer
}

func refBertLoad(t *testing.T, f *gguf.File) *refBert {
	t.Helper()
	geti := func(k string) int {
		v, ok := f.Int("bert." + k)
		if !ok {
			t.Fatalf("reference: no bert.%s", k)
		}
		return int(v)
	}
	m := &refBert{E: geti("embedding_length"), H: geti("attention.head_count"), F: geti("feed_forward_length"), pool: geti("pooling_type")}
	eps, _ := f.Float("bert.attention.layer_norm_epsilon")
	m.eps = eps
	m.tok, _ = refRows(t, f, "token_embd.weight", true)
	m.pos, _ = refRows(t, f, "position_embd.weight", true)
	types, _ := refRows(t, f, "token_types.weight", false)
	if types != nil {
		m.type0 = types[0]
	}
	m.enw = refVec(t, f, "token_embd_norm.weight", true)
	m.enb = refVec(t, f, "token_embd_norm.bias", true)
	E, F := m.E, m.F
	for l := 0; l < geti("block_count"); l++ {
		p := fmt.Sprintf("blk.%d.", l)
		m.layers = append(m.layers, refBertLayer{
			wq: refMat(t, f, p+"attn_q.weight", true, E, E), bq: refVec(t, f, p+"attn_q.bias", true),
			wk: refMat(t, f, p+"attn_k.weight", true, E, E), bk: refVec(t, f, p+"attn_k.bias", true),
			wv: refMat(t, f, p+"attn_v.weight", true, E, E), bv: refVec(t, f, p+"attn_v.bias", true),
			wo: refMat(t, f, p+"attn_output.weight", true, E, E), bo: refVec(t, f, p+"attn_output.bias", true),
			n1w: refVec(t, f, p+"attn_output_norm.weight", true), n1b: refVec(t, f, p+"attn_output_norm.bias", true),
			up: refMat(t, f, p+"ffn_up.weight", true, E, F), bup: refVec(t, f, p+"ffn_up.bias", true),
			down: refMat(t, f, p+"ffn_down.weight", true, F, E), bdown: refVec(t, f, p+"ffn_down.bias", true),
			n2w: refVec(t, f, p+"layer_output_norm.weight", true), n2b: refVec(t, f, p+"layer_output_norm.bias", true),
		})
	}
	return m
}

func refLayerNorm(x, w, b []float64, eps float64) []float64 {
	var mean, v float64
	for _, a := range x {
		mean += a
	}
	mean /= float64(len(x))
	for _, a := range x {
		v += (a - mean) * (a - mean)
	}
	v /= float64(len(x))
	out := make([]float64, len(x))
	for i, a := range x {
		out[i] = (a-mean)/math.Sqrt(v+eps)*w[i] + b[i]
	}
	return out
}

func refAffine(w [][]float64, b, x []float64) []float64 {
	y := refMatVec(w, x)
	for i := range y {
		y[i] += b[i]
	}
	return y
}

func refGELU(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func (m *refBert) embed(tokens []int32) []float64 {
	n, E, H := len(tokens), m.E, m.H
	D := E / H
	x := make([][]float64, n)
	for i, t := range tokens {
		v := make([]float64, E)
		for j := range v {
			v[j] = m.tok[t][j] + m.pos[i][j]
			if m.type0 != nil {
				v[j] += m.type0[j]
			}
		}
		x[i] = refLayerNorm(v, m.enw, m.enb, m.eps)
	}
	for _, ly := range m.layers {
		q, k, v := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for i := range x {
			q[i], k[i], v[i] = refAffine(ly.wq, ly.bq, x[i]), refAffine(ly.wk, ly.bk, x[i]), refAffine(ly.wv, ly.bv, x[i])
		}
		next := make([][]float64, n)
		for i := 0; i < n; i++ {
			att := make([]float64, E)
			for h := 0; h < H; h++ {
				s := make([]float64, n)
				mx := math.Inf(-1)
				for j := 0; j < n; j++ {
					for d := 0; d < D; d++ {
						s[j] += q[i][h*D+d] * k[j][h*D+d]
					}
					s[j] /= math.Sqrt(float64(D))
					mx = math.Max(mx, s[j])
				}
				var z float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					z += s[j]
				}
				for j := range s {
					for d := 0; d < D; d++ {
						att[h*D+d] += s[j] / z * v[j][h*D+d]
					}
				}
			}
			o := refAffine(ly.wo, ly.bo, att)
			for j := range o {
				o[j] += x[i][j]
			}
			ffnIn := refLayerNorm(o, ly.n1w, ly.n1b, m.eps)
			u := refAffine(ly.up, ly.bup, ffnIn)
			for j := range u {
				u[j] = refGELU(u[j])
			}
			d := refAffine(ly.down, ly.bdown, u)
			for j := range d {
				d[j] += ffnIn[j]
			}
			next[i] = refLayerNorm(d, ly.n2w, ly.n2b, m.eps)
		}
		x = next
	}
	out := make([]float64, E)
	switch m.pool {
	case 2:
		copy(out, x[0])
	case 3:
		copy(out, x[n-1])
	default:
		for i := range x {
			for j := range out {
				out[j] += x[i][j] / float64(n)
			}
		}
	}
	var ss float64
	for _, a := range out {
		ss += a * a
	}
	for j := range out {
		out[j] /= math.Sqrt(ss)
	}
	return out
}

func cosine(a []float64, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += a[i] * float64(b[i])
		aa += a[i] * a[i]
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

func bertImage(t *testing.T, s synth.Spec) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := synth.Write(&buf, s, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestEncoderReference(t *testing.T) {
	texts := []string{
		"Hello, world!",
		"The cat sat on the mat; searching documents with embedding vectors.",
		"a",
		"Ünïcödé Café 中文 and 42 numbers, plus an unknown ☃ symbol",
	}
	for _, c := range []struct {
		typ     string
		pooling int
	}{
		{"f32", 1}, {"q8_0", 1}, {"f32", 2}, {"q8_0", 2}, {"f16", 3}, {"q4_k", 1}, {"q6_k", 1},
	} {
		t.Run(fmt.Sprintf("%s-pool%d", c.typ, c.pooling), func(t *testing.T) {
			spec := synth.Spec{Arch: "bert", NEmbd: 256, NLayer: 3, NHead: 4, NFF: 512, Ctx: 128, Type: c.typ, Seed: 11, Std: 0.04, Pooling: c.pooling}
			f, err := gguf.Parse(bertImage(t, spec))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if !model.IsEncoder(f) {
				t.Fatal("IsEncoder false for bert")
			}
			enc, err := model.LoadEncoder(f, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer enc.Close()
			if enc.Dims() != 256 || enc.MaxTokens() != 128 || int(enc.Pooling) != c.pooling {
				t.Fatalf("dims %d ctx %d pooling %v", enc.Dims(), enc.MaxTokens(), enc.Pooling)
			}
			tk, err := tokenizer.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			ref := refBertLoad(t, f)
			worst := 1.0
			var prev []float32
			for _, text := range texts {
				toks := tk.Encode(text, true, false)
				got, err := enc.Embed(toks)
				if err != nil {
					t.Fatal(err)
				}
				var norm float64
				for _, v := range got {
					norm += float64(v) * float64(v)
				}
				if math.Abs(norm-1) > 1e-4 {
					t.Errorf("%q: |embedding|² = %g, want 1", text, norm)
				}
				if prev != nil {
					// the model is not degenerate: different texts, different directions
					if cs := cosine64(prev, got); cs > 0.98 {
						t.Errorf("%q: cosine similarity %.4f with the previous text's embedding", text, cs)
					}
				}
				prev = got
				cs := cosine(ref.embed(toks), got)
				worst = min(worst, cs)
				if cs < 0.9999 {
					t.Errorf("%q (%d tokens): cosine similarity with the float64 reference %.6f < 0.9999", text, len(toks), cs)
				}
			}
			t.Logf("%s pooling %d: worst cosine similarity with the float64 reference %.9f", c.typ, c.pooling, worst)
		})
	}
}

func TestEncoderErrors(t *testing.T) {
	spec := synth.Spec{Arch: "bert", NEmbd: 64, NLayer: 1, NHead: 2, NFF: 128, Ctx: 8, Type: "f32", Seed: 1}
	f, err := gguf.Parse(bertImage(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := model.Load(f); !errors.Is(err, model.ErrEncoder) {
		t.Errorf("model.Load of bert: %v, want ErrEncoder", err)
	}
	enc, err := model.LoadEncoder(f, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	if _, err := enc.Embed(nil); err == nil {
		t.Error("empty input: no error")
	}
	if _, err := enc.Embed(make([]int32, 9)); err == nil {
		t.Error("9 tokens with a context of 8: no error")
	}
	if _, err := enc.Embed([]int32{1 << 20}); err == nil {
		t.Error("token outside the vocabulary: no error")
	}
	// Different inputs give different embeddings; equal inputs equal ones.
	a, _ := enc.Embed([]int32{101, 200, 102})
	b, _ := enc.Embed([]int32{101, 201, 102})
	a2, _ := enc.Embed([]int32{101, 200, 102})
	if cosine64(a, a2) < 0.999999 || cosine64(a, b) > 0.9999 {
		t.Errorf("cos(a, a) = %g, cos(a, b) = %g", cosine64(a, a2), cosine64(a, b))
	}
	// A llama file is not an encoder.
	wv := tokenizer.TinyWordPieceVocab(0)
	lf, err := gguf.Parse(bertImage(t, synth.Spec{Arch: "llama", NEmbd: 64, NLayer: 1, NHead: 2, NFF: 128, Type: "f32", Tokenizer: wv.KVs()}))
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if model.IsEncoder(lf) {
		t.Error("IsEncoder true for llama")
	}
	if _, err := model.LoadEncoder(lf, 1); err == nil {
		t.Error("LoadEncoder of llama: no error")
	}
}

func cosine64(a, b []float32) float64 {
	x := make([]float64, len(a))
	for i, v := range a {
		x[i] = float64(v)
	}
	return cosine(x, b)
}
