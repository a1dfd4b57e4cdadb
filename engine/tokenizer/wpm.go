package tokenizer

import "sort"

// ModelWPM is the tokenizer.ggml.model of BERT's WordPiece vocabularies
// (llama.cpp's WPM). llama.cpp's converter stores a word-initial piece with
// a "▁" (U+2581) prefix and a continuation piece ("##ing" in BERT's
// vocab.txt) bare, so WordPiece here is a greedy longest-match over "▁"+word.
const ModelWPM = "bert"

// BERT's default special token ids (llama.cpp's defaults for "bert").
const (
	bertCLS = 101
	bertSEP = 102
	bertUNK = 100
	bertPAD = 0
)

// wpmWords is llama.cpp's llm_tokenizer_wpm_session::preprocess: BERT's
// basic tokenizer. Whitespace ends a word; NUL, U+FFFD and control code
// points are dropped; with stripAccents each code point is replaced by the
// first code point of its canonical decomposition and marks (\p{M}) are
// dropped; with lower code points are lowercased; punctuation, ASCII
// symbols and CJK ideographs become single-character words.
func wpmWords(text string, lower, stripAccents bool) []string {
	var words []string
	var cur []byte
	flush := func() {
		if len(cur) > 0 {
			words = append(words, string(cur))
			cur = cur[:0]
		}
	}
	for _, cpt := range decodeCpts(text) {
		if stripAccents {
			cpt = nfdBase(cpt)
		}
		f := flagsOf(cpt)
		if f.is(flagWhitespace) {
			flush()
			continue
		}
		if cpt == 0 || cpt == 0xFFFD || f.is(flagControl) {
			continue
		}
		if stripAccents && f.is(flagMark) {
			continue
		}
		c := cpt
		if lower {
			c = lowerCpt(c)
		}
		if f.is(flagPunct) || (cpt < 0x7F && f.is(flagSymbol)) || isCJKIdeograph(cpt) {
			flush()
			words = append(words, string(appendCpt(nil, c)))
			continue
		}
		cur = appendCpt(cur, c)
	}
	flush()
	return words
}

// nfdBase is llama.cpp's unicode_cpts_normalize_nfd for one code point: the
// first code point of its canonical decomposition (é → e, Hangul syllable →
// its leading jamo), or the code point itself.
func nfdBase(r rune) rune {
	if r < 0xC0 {
		return r
	}
	if r >= 0xAC00 && r <= 0xD7A3 { // Hangul syllables decompose algorithmically
		return 0x1100 + (r-0xAC00)/(21*28)
	}
	u := uint32(r)
	i := sort.Search(len(nfdFirst), func(i int) bool { return nfdFirst[i][1] >= u })
	if i < len(nfdFirst) && nfdFirst[i][0] <= u {
		return rune(nfdFirst[i][2])
	}
	return r
}

// isCJKIdeograph is BERT's _is_chinese_char, with llama.cpp's ranges (its
// upper bound of Extension D follows the Hugging Face Rust code).
func isCJKIdeograph(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) ||
		(r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) ||
		(r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) ||
		(r >= 0x2F800 && r <= 0x2FA1F)
}

// wpmEncode appends the WordPiece tokens of text (llama.cpp's
// llm_tokenizer_wpm_session::tokenize): each word, prefixed with "▁", is
// cut greedily into the longest vocabulary entries (up to the longest
// token's byte length) from left to right; a word with any position that
// matches nothing becomes the unknown token as a whole.
func (t *Tokenizer) wpmEncode(text string, out []int32) []int32 {
	for _, word := range wpmWords(text, t.lower, t.stripAccents) {
		w := "\u2581" + word
		n := len(w)
		start := len(out)
		for i := 0; i < n; {
			matched := false
			for j := min(n, i+t.maxTokenLen+1); j > i; j-- {
				if id, ok := t.toID[w[i:j]]; ok {
					out = append(out, id)
					i = j
					matched = true
					break
				}
			}
			if !matched {
				out = out[:start]
				break
			}
		}
		if len(out) == start && t.unk != NoToken {
			out = append(out, t.unk)
		}
	}
	return out
}

// SEP is the separator id BERT vocabularies append ([SEP]; NoToken if none).
func (t *Tokenizer) SEP() int32 { return t.sep }

// AddSEP reports whether Encode with addSpecial appends SEP.
func (t *Tokenizer) AddSEP() bool { return t.addSEP }
