package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"shoal/engine/gguf"
	"shoal/engine/tokenizer"
)

// VocabGGUF is the vocabulary of a model's GGUF as a metadata-only GGUF:
// every tokenizer.* entry (the chat template included) and general.name
// (which the tokenizer reads for per-model token attributes), with its
// digest (hex SHA-256 of those bytes).
func VocabGGUF(meta *gguf.File) ([]byte, string, error) {
	if meta == nil {
		return nil, "", errors.New("no model metadata")
	}
	var buf bytes.Buffer
	w := gguf.NewWriter(&buf)
	for _, kv := range meta.KVs {
		if kv.Key != "general.name" && !strings.HasPrefix(kv.Key, "tokenizer.") {
			continue
		}
		if _, nested := kv.Value.([]any); nested {
			continue // no tokenizer entry is an array of arrays
		}
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			return nil, "", err
		}
	}
	if err := w.Close(); err != nil {
		return nil, "", err
	}
	if buf.Len() > maxVocab {
		return nil, "", errors.New("the vocabulary is larger than a gateway may send")
	}
	return buf.Bytes(), digest(buf.Bytes()), nil
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// parseVocab builds the tokenizer and chat template of a vocabulary GGUF.
func parseVocab(b []byte) (*tokenizer.Tokenizer, string, error) {
	f, err := gguf.Parse(b)
	if err != nil {
		return nil, "", err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, "", err
	}
	tpl, _ := f.String("tokenizer.chat_template")
	return tok, tpl, nil
}
