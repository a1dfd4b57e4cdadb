package tokenizer

import (
	"fmt"

	"shoal/engine/gguf"
)

// Pad grows v to n tokens with unused placeholder tokens "<|unused_i|>", so
// a model can have a vocabulary of any size (for example the size of a real
// model whose shapes it copies). Padding never changes how text encodes.
func (v *Vocab) Pad(n int) {
	for i := len(v.Tokens); i < n; i++ {
		v.Tokens = append(v.Tokens, fmt.Sprintf("<|unused_%d|>", i))
		if v.Scores != nil {
			v.Scores = append(v.Scores, 0)
		}
		if v.Types != nil {
			v.Types = append(v.Types, TypeUnused)
		}
	}
}

// KVs returns v as tokenizer.ggml.* metadata entries, ready for gguf.Writer.
func (v *Vocab) KVs() []gguf.KV {
	kvs := []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: v.Model},
	}
	if v.Pre != "" {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.pre", Value: v.Pre})
	}
	kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.tokens", Value: v.Tokens})
	if v.Scores != nil {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.scores", Value: v.Scores})
	}
	if v.Types != nil {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.token_type", Value: v.Types})
	}
	if v.Merges != nil {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.merges", Value: v.Merges})
	}
	for _, id := range []struct {
		key string
		id  int32
	}{
		{"tokenizer.ggml.bos_token_id", v.BOS}, {"tokenizer.ggml.eos_token_id", v.EOS},
		{"tokenizer.ggml.eot_token_id", v.EOT}, {"tokenizer.ggml.eom_token_id", v.EOM},
		{"tokenizer.ggml.unknown_token_id", v.UNK}, {"tokenizer.ggml.padding_token_id", v.PAD},
	} {
		if id.id != NoToken {
			kvs = append(kvs, gguf.KV{Key: id.key, Value: uint32(id.id)})
		}
	}
	if v.Model == ModelWPM {
		if v.SEP != NoToken {
			kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.seperator_token_id", Value: uint32(v.SEP)})
		}
		kvs = append(kvs,
			gguf.KV{Key: "tokenizer.ggml.add_sep_token", Value: v.AddSEP},
			gguf.KV{Key: "tokenizer.ggml.normalizer.lowercase", Value: v.Lowercase},
			gguf.KV{Key: "tokenizer.ggml.normalizer.strip_accents", Value: v.StripAccents})
	}
	return append(kvs,
		gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: v.AddBOS},
		gguf.KV{Key: "tokenizer.ggml.add_eos_token", Value: v.AddEOS},
		gguf.KV{Key: "tokenizer.ggml.add_space_prefix", Value: v.AddSpacePrefix},
	)
}
