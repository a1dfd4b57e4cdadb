package tokenizer_test

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"shoal/engine/synth"
	"shoal/engine/tokenizer"
)

// preSeparator ends each test string in testdata/pre/strings.txt, as in
// llama.cpp's vocabulary test files.
const preSeparator = "\n__ggml_vocab_test__\n"

var writePre = flag.String("write-pre", "", "write testdata/pre/strings.txt and, into this folder, a small model per pre-tokenizer of TestPreTokenizersAgainstLlama (for tokids)")

// preChecked are the pre-tokenizers of the models #37 brings (gpt-oss's
// o200k is gpt-4o's; DeepSeek-V3's and Kimi K2's deepseek-v3), beside
// llama3's and qwen2's for comparison.
var preChecked = []string{"gpt-4o", "deepseek-v3", "llama3", "qwen2", "glm4"}

// preFragments are what the test strings are made of: code, CJK, emoji,
// numbers, whitespace runs, contractions, other scripts.
var preFragments = []string{
	"Hello", " world", "func main() {", "\tfmt.Println(\"hi\")\n}", "x := a[i] + b[j]*2;", "if (x >= 10) return -1;",
	"日本語のテキスト", "中文字符和标点。", "한국어 문장", "😀", "🦙🚀", "👨‍👩‍👧", "12345", "3.14159", "1,000,000", " 42 ",
	"   ", "\n\n", "\t\t", " \n ", "  leading", "trailing  ", "I'm", " they're", " we'll", " DON'T", "'s",
	"naïve café", "Ελληνικά", "Привет, мир!", "مرحبا بالعالم", "ऊँचाई", "ÀÉÎÕÜ", "<|endoftext|>", "__init__", "snake_case",
	"CamelCaseWord", "https://example.com/a?b=c", "a+b=c", "$100.00", "#tag", "@user", "...", "!!!", "(nested (parens))",
}

// TestPreTokenizersAgainstLlama: for each pre-tokenizer in preChecked, the
// ids of 300 strings (made of preFragments) with a byte-level BPE
// vocabulary of 2048 tokens are llama.cpp 0.7.0's (testdata/pre: how they
// were made is in its README).
func TestPreTokenizersAgainstLlama(t *testing.T) {
	strs := preStrings()
	if *writePre != "" {
		writeStrings(t, filepath.Join("testdata", "pre", "strings.txt"), strs)
	}
	checkStrings(t, filepath.Join("testdata", "pre", "strings.txt"), strs)
	for _, pre := range preChecked {
		t.Run(pre, func(t *testing.T) {
			v, err := tokenizer.ByteLevelVocab(2048)
			if err != nil {
				t.Fatal(err)
			}
			v.Pre = pre
			if *writePre != "" {
				writeVocabModel(t, v, filepath.Join(*writePre, pre+".gguf"))
				t.Skip("wrote the model: run tokids, then this test again")
			}
			tok, err := tokenizer.New(v)
			if err != nil {
				t.Fatal(err)
			}
			compareIDs(t, tok, strs, filepath.Join("testdata", "pre", pre+".out"), false)
		})
	}
}

// writeStrings writes strs in tokids' format: each followed by preSeparator.
func writeStrings(t *testing.T, path string, strs []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(strs, preSeparator)+preSeparator), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkStrings fails unless the file at path holds strs (so that the ids
// measured over it belong to the strings this test makes).
func checkStrings(t *testing.T, path string, strs []string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != strings.Join(strs, preSeparator)+preSeparator {
		t.Fatalf("%s does not hold the test's strings: write it again (see testdata's README)", path)
	}
}

// writeVocabModel writes v as a small random-weight model for tokids.
func writeVocabModel(t *testing.T, v tokenizer.Vocab, path string) {
	t.Helper()
	var buf bytes.Buffer
	s := synth.Spec{Arch: "llama", NEmbd: 32, NLayer: 1, NHead: 1, NFF: 32, Type: "f16", Tokenizer: v.KVs()}
	if err := synth.Write(&buf, s, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// compareIDs checks tok's ids for strs against llama.cpp's in the tokids
// output at path (special: BOS added and special text parsed), reporting
// how many strings differ and the first few differences.
func compareIDs(t *testing.T, tok *tokenizer.Tokenizer, strs []string, path string, special bool) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	if len(lines) != len(strs) {
		t.Fatalf("%s: %d lines of ids for %d strings", path, len(lines), len(strs))
	}
	bad := 0
	for i, s := range strs {
		want := lines[i]
		got := idLine(tok.Encode(s, special, special))
		if got != want {
			if bad++; bad <= 5 {
				t.Errorf("%q:\n got%s\nwant%s", s, got, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d strings tokenize differently", bad, len(strs))
	}
}

// preStrings are 300 strings of 1 to 6 fragments each, fixed by the seed.
func preStrings() []string {
	rng := rand.New(rand.NewPCG(37, 1))
	out := make([]string, 300)
	for i := range out {
		var b strings.Builder
		for range 1 + rng.IntN(6) {
			b.WriteString(preFragments[rng.IntN(len(preFragments))])
		}
		out[i] = b.String()
	}
	return out
}

func idLine(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprint(&b, " ", strconv.Itoa(int(id)))
	}
	return b.String()
}
