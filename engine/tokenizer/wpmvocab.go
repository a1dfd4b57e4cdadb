package tokenizer

import "fmt"

// tinyWPMWords are the whole words of TinyWordPieceVocab.
var tinyWPMWords = []string{
	"the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "are",
	"be", "this", "by", "at", "from", "or", "an", "not", "have", "has", "but", "what", "all",
	"were", "we", "when", "your", "can", "there", "use", "each", "which", "she", "he", "do",
	"how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them",
	"these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "look",
	"two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my",
	"than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long",
	"down", "day", "did", "get", "come", "made", "may", "part", "hello", "world", "cat",
	"dog", "sat", "mat", "model", "token", "embed", "vector", "search", "query", "document",
}

// tinyWPMSuffixes are continuation pieces ("##ing" in BERT's vocab.txt).
var tinyWPMSuffixes = []string{"s", "ed", "ing", "er", "ly", "ion", "es", "al", "ment", "ness"}

// TinyWordPieceVocab is a small deterministic BERT WordPiece vocabulary in
// llama.cpp's GGUF form, for random-weight embedding models: BERT's special
// ids ([PAD] 0, [unusedN] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103),
// then every printable ASCII character as a word and as a continuation,
// common English words with a "▁" prefix, and a few suffixes. It is
// padded to n tokens when n is larger.
func TinyWordPieceVocab(n int) Vocab {
	v, _ := DefaultVocab(ModelWPM, "")
	add := func(tok string, typ int32) {
		v.Tokens = append(v.Tokens, tok)
		v.Types = append(v.Types, typ)
	}
	add("[PAD]", TypeControl)
	for i := 1; i < 100; i++ {
		add(fmt.Sprintf("[unused%d]", i-1), TypeNormal) // as converted: not added tokens
	}
	add("[UNK]", TypeUnknown)
	add("[CLS]", TypeControl)
	add("[SEP]", TypeControl)
	add("[MASK]", TypeControl)
	for c := byte('!'); c <= '~'; c++ {
		if c >= 'A' && c <= 'Z' { // lowercased away
			continue
		}
		add("\u2581"+string(c), TypeNormal)
	}
	for c := byte('!'); c <= '~'; c++ {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			add(string(c), TypeNormal)
		}
	}
	for _, w := range tinyWPMWords {
		add("\u2581"+w, TypeNormal)
	}
	for _, s := range tinyWPMSuffixes {
		add(s, TypeNormal)
	}
	v.Pad(n)
	return v
}
