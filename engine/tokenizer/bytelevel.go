package tokenizer

import (
	"fmt"
	"sync"
)

// Special tokens of ByteLevelVocab; their ids follow the 256 byte tokens.
const (
	ByteLevelBOS = "<|bos|>"
	ByteLevelEOS = "<|eos|>"
)

// MinByteLevelVocab is the smallest vocabulary ByteLevelVocab builds.
const MinByteLevelVocab = 260

// trainingSample is the text ByteLevelVocab learns its merges from: a few KB
// of English prose and Go-flavoured code written for this package.
const trainingSample = `The quick brown fox jumps over the lazy dog. A small model still needs a
tokenizer, and this one is trained on the very text you are reading now.
It learns which pairs of bytes appear together most often and joins them,
one merge at a time, until the vocabulary is as large as requested.

Shoal is an inference engine. It loads weights, runs the forward pass, and
samples the next token. When there are no real weights, it makes random ones
so that tests can run quickly on any machine. Random weights produce random
text, but the plumbing around them - batching, caching, streaming, and
scheduling - is exercised in the same way as it would be for a real model.

Numbers appear in text as well: 0, 1, 2, 3, 10, 42, 100, 256, 1024, 2025,
3.14159, 2.71828, 1e-5, and 65536. Dates like 2024-01-31 and times like
12:30:45 are common in logs. Percentages such as 50% or 99.9% show up in
reports, and prices like $19.99 or €5 appear in shops.

Questions end with a question mark? Exclamations end with a bang! Lists use
commas, semicolons; and colons: first, second, third. Quotes "like this" and
'like that' are everywhere, and so are contractions: it's, don't, we're,
they've, I'm, you'll, she'd. Parentheses (such as these) and brackets [like
these] and braces {like these} are used in prose and in code alike.

In the beginning the model knows nothing. During training it reads many
documents and slowly adjusts its parameters. After training it can answer
questions, write stories, translate between languages, and generate code.
The tokenizer turns text into numbers before the model sees it, and turns
numbers back into text afterwards. A good tokenizer keeps common words whole
and splits rare words into smaller pieces that the model has seen before.

package main

import (
	"fmt"
	"strings"
)

// Token is one unit of text.
type Token struct {
	ID    int32
	Text  string
	Score float32
}

func count(words []string) map[string]int {
	counts := make(map[string]int, len(words))
	for _, w := range words {
		counts[strings.ToLower(w)]++
	}
	return counts
}

func main() {
	text := "the cat sat on the mat and the dog sat on the log"
	counts := count(strings.Fields(text))
	for word, n := range counts {
		if n > 1 {
			fmt.Printf("%s: %d\n", word, n)
		}
	}
	var total int
	for i := 0; i < len(text); i++ {
		if text[i] == ' ' {
			total++
		}
	}
	fmt.Println("spaces:", total)
}

func (t *Token) String() string {
	return fmt.Sprintf("%d:%q", t.ID, t.Text)
}

def greet(name):
    """Return a friendly greeting."""
    if not name:
        return "Hello, world!"
    return f"Hello, {name}!"

for i in range(10):
    print(i, greet("user" + str(i)))

SELECT id, name, created_at FROM users WHERE active = 1 ORDER BY name;
{"model": "shoal", "tokens": [1, 2, 3], "stream": true, "temperature": 0.7}

The weather today is cloudy with a chance of rain in the afternoon. Tomorrow
will be sunny and warm. People walk their dogs in the park, children play on
the grass, and the river flows quietly under the old stone bridge. Some
people read books, others listen to music, and a few simply watch the clouds
drift across the sky. In the evening the streets are calm and the lights of
the city shine on the water.

Every function should do one thing and do it well. Errors should be handled
where they can be handled and returned where they cannot. Tests should be
fast, deterministic, and easy to read. Names should say what a thing is, not
how it is made. Comments should explain why, not what. Simple code is easier
to change than clever code, and code that is easy to change tends to stay
correct for longer.
`

type byteLevelTraining struct {
	tokens []string
	merges []string
	// grows[i] tells whether merges[i] added a token.
	grows []bool
}

var (
	byteLevelOnce sync.Once
	byteLevelData byteLevelTraining
)

// trainByteLevel learns BPE merges on trainingSample until no pair of
// symbols is left to merge. Ties go to the pair with the lowest ids, so the
// result is deterministic; a vocabulary of size n is a prefix of the result.
func trainByteLevel() byteLevelTraining {
	var tr byteLevelTraining
	for b := 0; b < 256; b++ {
		tr.tokens = append(tr.tokens, byteToString[b])
	}
	tr.tokens = append(tr.tokens, ByteLevelBOS, ByteLevelEOS)
	index := make(map[string]int32, len(tr.tokens))
	for i, s := range tr.tokens {
		index[s] = int32(i)
	}

	// Pre-tokenize with the gpt-2 splitter, as encoding will.
	pre, err := compilePre(exprsGPT2)
	if err != nil {
		panic(err)
	}
	wordFreq := map[string]int{}
	var order []string
	for _, w := range pre.split(decodeCpts(trainingSample)) {
		enc := byteEncode(appendRunes(nil, w))
		if wordFreq[enc] == 0 {
			order = append(order, enc)
		}
		wordFreq[enc]++
	}
	type word struct {
		syms []int32
		freq int
	}
	words := make([]word, len(order))
	pairKey := func(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }
	counts := map[uint64]int{}
	where := map[uint64][]int{} // pair -> words that may contain it
	for wi, enc := range order {
		var syms []int32
		for _, r := range enc {
			syms = append(syms, index[string(r)])
		}
		words[wi] = word{syms: syms, freq: wordFreq[enc]}
		for i := 1; i < len(syms); i++ {
			k := pairKey(syms[i-1], syms[i])
			counts[k] += wordFreq[enc]
			where[k] = append(where[k], wi)
		}
	}
	for {
		var best uint64
		bestN := 0
		for k, n := range counts {
			if n > bestN || (n == bestN && k < best) {
				best, bestN = k, n
			}
		}
		if bestN == 0 {
			break
		}
		a, b := int32(best>>32), int32(uint32(best))
		merged := tr.tokens[a] + tr.tokens[b]
		tr.merges = append(tr.merges, tr.tokens[a]+" "+tr.tokens[b])
		id, exists := index[merged]
		if !exists {
			id = int32(len(tr.tokens))
			tr.tokens = append(tr.tokens, merged)
			index[merged] = id
		}
		tr.grows = append(tr.grows, !exists)
		seen := map[int]bool{}
		for _, wi := range where[best] {
			if seen[wi] {
				continue
			}
			seen[wi] = true
			w := &words[wi]
			for i := 1; i < len(w.syms); i++ {
				k := pairKey(w.syms[i-1], w.syms[i])
				if counts[k] -= w.freq; counts[k] <= 0 {
					delete(counts, k)
				}
			}
			out := w.syms[:0:0]
			for i := 0; i < len(w.syms); i++ {
				if i+1 < len(w.syms) && w.syms[i] == a && w.syms[i+1] == b {
					out = append(out, id)
					i++
					continue
				}
				out = append(out, w.syms[i])
			}
			w.syms = out
			for i := 1; i < len(w.syms); i++ {
				k := pairKey(w.syms[i-1], w.syms[i])
				counts[k] += w.freq
				where[k] = append(where[k], wi)
			}
		}
		delete(where, best)
	}
	return tr
}

func appendRunes(b []byte, rs []rune) []byte {
	for _, r := range rs {
		b = appendCpt(b, r)
	}
	return b
}

// ByteLevelVocab builds the byte-level BPE vocabulary shoal uses for
// random-weight test models: the 256 GPT-2 byte tokens (id = byte value),
// the control tokens <|bos|> (256) and <|eos|> (257), then merged tokens
// learned by BPE training on a built-in English/code sample, in merge order.
// The result has at most vocabSize tokens (fewer once the sample has nothing
// left to merge) and is deterministic; model "gpt2", pre "gpt-2".
func ByteLevelVocab(vocabSize int) (Vocab, error) {
	if vocabSize < MinByteLevelVocab {
		return Vocab{}, fmt.Errorf("tokenizer: byte-level vocabulary size %d is below the minimum %d", vocabSize, MinByteLevelVocab)
	}
	byteLevelOnce.Do(func() { byteLevelData = trainByteLevel() })
	tr := &byteLevelData
	nTok := 258
	var merges []string
	for i, m := range tr.merges {
		if tr.grows[i] {
			if nTok == vocabSize {
				break
			}
			nTok++
		}
		merges = append(merges, m)
	}
	v := Vocab{
		Model:  ModelBPE,
		Pre:    "gpt-2",
		Name:   "shoal byte-level",
		Tokens: append([]string(nil), tr.tokens[:nTok]...),
		Scores: make([]float32, nTok),
		Types:  make([]int32, nTok),
		Merges: merges,
		BOS:    256, EOS: 257, EOT: NoToken, EOM: NoToken, UNK: NoToken, PAD: NoToken,
		AddBOS: true,
	}
	for i := range v.Types {
		v.Types[i] = TypeNormal
		if i >= 258 {
			v.Scores[i] = -float32(i - 258)
		}
	}
	v.Types[256], v.Types[257] = TypeControl, TypeControl
	return v, nil
}
