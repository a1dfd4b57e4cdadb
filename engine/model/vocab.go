package model

import (
	"fmt"
	"slices"

	"shoal/engine/gguf"
)

// VocabKey is the GGUF key listing a model's tokens.
const VocabKey = "tokenizer.ggml.tokens"

// SameVocabulary reports why the models of GGUF headers a and b (named an
// and bn in the message) cannot draft for each other: one has no token
// list, or the lists differ. A draft model's tokens are the served
// model's, token for token.
func SameVocabulary(a *gguf.File, an string, b *gguf.File, bn string) error {
	ta, ok := a.Strings(VocabKey)
	if !ok {
		return fmt.Errorf("draft: %s has no vocabulary (%s): a draft model and the model it drafts for need the same one", an, VocabKey)
	}
	tb, ok := b.Strings(VocabKey)
	if !ok {
		return fmt.Errorf("draft: %s has no vocabulary (%s): a draft model and the model it drafts for need the same one", bn, VocabKey)
	}
	if slices.Equal(ta, tb) {
		return nil
	}
	n := 0
	for n < min(len(ta), len(tb)) && ta[n] == tb[n] {
		n++
	}
	return fmt.Errorf("draft: %s (%d tokens) and %s (%d tokens) have different vocabularies (first difference at token %d): a draft model must share the served model's tokenizer, e.g. a smaller model of the same family or a lower-bit file of the same model",
		an, len(ta), bn, len(tb), n)
}
