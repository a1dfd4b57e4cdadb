package synth

import (
	"fmt"
	"io"

	"shoal/engine/gguf"
	"shoal/engine/quant"
	"shoal/engine/tokenizer"
)

// writeBert writes a BERT-shaped embedding encoder in llama.cpp's GGUF
// layout (architecture "bert": token, position and token type embeddings,
// token_embd_norm, post-LayerNorm layers with biases everywhere and a GELU
// FFN, bert.pooling_type). Its tokenizer must be a WordPiece ("bert") one;
// other tokenizer metadata (such as gen-model's default byte-level
// vocabulary) is replaced by tokenizer.TinyWordPieceVocab of the same size.
func writeBert(w io.Writer, s Spec, progress func(done, total int64)) error {
	if s.NEmbd <= 0 || s.NLayer <= 0 || s.NHead <= 0 || s.NFF <= 0 {
		return fmt.Errorf("n-embd, n-layer, n-head and n-ff must be positive")
	}
	if s.NEmbd%s.NHead != 0 {
		return fmt.Errorf("n-embd %d is not a multiple of n-head %d", s.NEmbd, s.NHead)
	}
	if s.NHeadKV != 0 && s.NHeadKV != s.NHead {
		return fmt.Errorf("bert has no grouped-query attention (n-head-kv %d != n-head %d)", s.NHeadKV, s.NHead)
	}
	if s.HeadDim != 0 && s.HeadDim != s.NEmbd/s.NHead {
		return fmt.Errorf("bert's head size is n-embd/n-head")
	}
	isBert := false
	for _, kv := range s.Tokenizer {
		if kv.Key == "tokenizer.ggml.model" && kv.Value == tokenizer.ModelWPM {
			isBert = true
		}
	}
	if !isBert {
		v := tokenizer.TinyWordPieceVocab(nVocab(s.Tokenizer))
		s.Tokenizer = v.KVs()
	}
	V := nVocab(s.Tokenizer)
	if s.Ctx <= 0 {
		s.Ctx = 512
	}
	if s.RMSEps == 0 {
		s.RMSEps = 1e-12
	}
	if s.Std == 0 {
		s.Std = 0.02
	}
	if s.Type == "" {
		s.Type = "f32"
	}
	if s.Pooling == 0 {
		s.Pooling = 1
	}
	tc, err := parseTypes(s.Type, s.OutputType)
	if err != nil {
		return err
	}
	tc.nLayer = s.NLayer
	E, F := s.NEmbd, s.NFF
	var plan []tensorPlan
	matrix := func(name, role string, layer int, std float32, cols, rows int) {
		plan = append(plan, tensorPlan{name: name, typ: tc.choose(role, layer, cols), dims: []uint64{uint64(cols), uint64(rows)}, std: std})
	}
	vector := func(name string, mean, std float32, n int) {
		plan = append(plan, tensorPlan{name: name, typ: quant.F32, dims: []uint64{uint64(n)}, mean: mean, std: std})
	}
	matrix("token_embd.weight", "token_embd", 0, s.Std, E, V)
	plan = append(plan,
		tensorPlan{name: "position_embd.weight", typ: quant.F32, dims: []uint64{uint64(E), uint64(s.Ctx)}, std: s.Std},
		tensorPlan{name: "token_types.weight", typ: quant.F32, dims: []uint64{uint64(E), 2}, std: s.Std})
	vector("token_embd_norm.weight", 1, 0.1, E)
	vector("token_embd_norm.bias", 0, 0.1, E)
	for l := 0; l < s.NLayer; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		for _, m := range []struct {
			name, role string
			in, out    int
		}{
			{"attn_q", "attn_q", E, E}, {"attn_k", "attn_k", E, E}, {"attn_v", "attn_v", E, E},
			{"attn_output", "attn_output", E, E},
		} {
			matrix(p+m.name+".weight", m.role, l, s.Std, m.in, m.out)
			vector(p+m.name+".bias", 0, s.Std, m.out)
		}
		vector(p+"attn_output_norm.weight", 1, 0.1, E)
		vector(p+"attn_output_norm.bias", 0, 0.1, E)
		matrix(p+"ffn_up.weight", "ffn_up", l, s.Std, E, F)
		vector(p+"ffn_up.bias", 0, s.Std, F)
		matrix(p+"ffn_down.weight", "ffn_down", l, s.Std, F, E)
		vector(p+"ffn_down.bias", 0, s.Std, E)
		vector(p+"layer_output_norm.weight", 1, 0.1, E)
		vector(p+"layer_output_norm.bias", 0, 0.1, E)
	}
	desc := fmt.Sprintf("shoal gen-model arch=bert n_embd=%d n_layer=%d n_head=%d n_ff=%d pooling=%d type=%s seed=%d std=%g",
		E, s.NLayer, s.NHead, F, s.Pooling, s.Type, s.Seed, s.Std)
	name := s.Name
	if name == "" {
		name = fmt.Sprintf("shoal-random-bert-%dx%d-%s", s.NLayer, E, s.Type)
	}
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: "bert"},
		{Key: "general.type", Value: "model"},
		{Key: "general.name", Value: name},
		{Key: "general.description", Value: desc},
		{Key: "general.file_type", Value: fileType(s.Type, tc.base)},
		{Key: "general.quantization_version", Value: uint32(2)},
		{Key: "bert.vocab_size", Value: uint32(V)},
		{Key: "bert.context_length", Value: uint32(s.Ctx)},
		{Key: "bert.embedding_length", Value: uint32(E)},
		{Key: "bert.block_count", Value: uint32(s.NLayer)},
		{Key: "bert.feed_forward_length", Value: uint32(F)},
		{Key: "bert.attention.head_count", Value: uint32(s.NHead)},
		{Key: "bert.attention.layer_norm_epsilon", Value: s.RMSEps},
		{Key: "bert.attention.causal", Value: false},
		{Key: "bert.pooling_type", Value: uint32(s.Pooling)},
		{Key: "tokenizer.ggml.token_type_count", Value: uint32(2)},
	}
	kvs = append(kvs, s.Tokenizer...)
	return writeFile(w, kvs, plan, s.Seed, progress)
}
