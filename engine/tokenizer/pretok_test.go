package tokenizer

import (
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// regexSplitter compiles expr through the generic regex path only (no
// hand-written splitter), to cross-check both against each other.
func regexSplitter(t *testing.T, expr string) *preTokenizer {
	t.Helper()
	src := expr
	kind := splitWide
	if usesUcat(expr) {
		var err error
		if src, err = collapseRegex(expr); err != nil {
			t.Fatal(err)
		}
		kind = splitCollapsed
	}
	src, err := ecmaRewrite(src)
	if err != nil {
		t.Fatal(err)
	}
	re, err := regexp2.Compile(src, regexp2.None)
	if err != nil {
		t.Fatal(err)
	}
	return &preTokenizer{splitters: []splitter{{kind: kind, re: re}}, needCollapse: kind == splitCollapsed}
}

func words(ws [][]rune) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w)
	}
	return out
}

var fuzzAlphabet = []rune(" \t\n\r\v\f'sStTmMdDlLrReEvVabcxyzABCXYZ0123456789!?.,;:-_()[]{}<>/\\\"$+=^~|`@#%&*" +
	"éüñçÀÉŞßøΩω日本語中文한국어кириллица٣٤٥¼½²" + // letters and numbers beyond ASCII
	"\u0301\u0308\u093F" + // combining marks
	"\u00A0\u2028\u3000\u0085\u2003" + // non-ASCII whitespace
	"…—“”«»€£©®™✓🦙😀🚀" + // punctuation and symbols
	"\u0000\u0007\u009F\u200B\u200D\uE000") // controls, format, private use

func randomText(rng *rand.Rand) string {
	n := 1 + rng.Intn(24)
	var b strings.Builder
	for i := 0; i < n; i++ {
		r := fuzzAlphabet[rng.Intn(len(fuzzAlphabet))]
		// runs of the same class make the splitters' loops work harder
		reps := 1
		if rng.Intn(4) == 0 {
			reps = 1 + rng.Intn(4)
		}
		for j := 0; j < reps; j++ {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestCustomSplittersMatchRegex checks llama.cpp's hand-written gpt-2 and
// llama3 splitters (ported here) against the same patterns evaluated by the
// generic collapsed-regex path, as llama.cpp's own tests do.
func TestCustomSplittersMatchRegex(t *testing.T) {
	gpt2Regex := regexSplitter(t, patGPT2+`|\s+`)
	llama3Regex := regexSplitter(t, patLlama3)
	gpt2Custom := &preTokenizer{splitters: []splitter{{kind: splitGPT2}}}
	llama3Custom := &preTokenizer{splitters: []splitter{{kind: splitLlama3}}}
	rng := rand.New(rand.NewSource(1))
	fixed := []string{"", " ", "  ", "a  b", "a \n b", "Hello  world!!  ", "it's I'M we'Re", "\n\n\n", " \t\n ", "12345678", " 1234", "x   ", "!!\r\n\r\nz", "  🦙🦙 ", "a\u00A0\u00A0b"}
	for i := 0; i < 20000; i++ {
		var s string
		if i < len(fixed) {
			s = fixed[i]
		} else {
			s = randomText(rng)
		}
		cpts := decodeCpts(s)
		for _, c := range []struct {
			name           string
			custom, regexp *preTokenizer
		}{{"gpt2", gpt2Custom, gpt2Regex}, {"llama3", llama3Custom, llama3Regex}} {
			a, b := words(c.custom.split(cpts)), words(c.regexp.split(cpts))
			if strings.Join(a, "\x00") != strings.Join(b, "\x00") {
				t.Fatalf("%s %q:\ncustom %q\nregex  %q", c.name, s, a, b)
			}
		}
	}
}

func TestPreTokenizerSplits(t *testing.T) {
	for _, c := range []struct {
		pre, text string
		want      []string
	}{
		{"gpt-2", "Hello world! It's  me 123", []string{"Hello", " world", "!", " It", "'s", " ", " me", " 123"}},
		{"llama3", "Hello world! IT'S 12345\n\n  x", []string{"Hello", " world", "!", " IT", "'S", " ", "123", "45", "\n\n", " ", " x"}},
		{"qwen2", "abc 123 DON'T", []string{"abc", " ", "1", "2", "3", " DON", "'T"}},
		{"default", "a+b=12345", []string{"a", "+", "b", "=", "123", "45"}},
		{"starcoder", "x = 42", []string{"x", " =", " ", "4", "2"}},
		{"bloom", "Hello, world. Bye", []string{"Hello", ",", " world", ".", " Bye"}},
		{"deepseek-llm", "Hello 世界 42!", []string{"Hello", " ", "世界", " ", "42", "!"}},
		{"deepseek-v3", "Hello 世界 12345!", []string{"Hello", " ", "世界", " ", "123", "45", "!"}},
		{"tekken", "HelloWorld foo", []string{"Hello", "World", " foo"}},
		// o200k (gpt-oss): case runs split words, contractions stay on them
		{"gpt-4o", "CamelCaseWord they're HELLOWorld 12345", []string{"Camel", "Case", "Word", " they're", " HELLOWorld", " ", "123", "45"}},
		// later regexes split earlier matches again, as in llama.cpp
		{"chameleon", "a  b<sentinel:12>", []string{"a", "  ", "b", "<", "sentinel", ":", "1", "2", ">"}},
	} {
		p, err := lookupPre(c.pre)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := compilePre(p.exprs)
		if err != nil {
			t.Fatal(err)
		}
		got := words(sp.split(decodeCpts(c.text)))
		if strings.Join(got, "\x00") != strings.Join(c.want, "\x00") {
			t.Errorf("%s %q: got %q want %q", c.pre, c.text, got, c.want)
		}
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello world", " this is 🦙.cpp", "<|endoftext|>x<|bos|>", "\xff\xfe\xf0\x9f", "  \t\n\r\n 12345 it's", "日本語", "\u2028\u00A0a"} {
		f.Add(s)
	}
	var toks []*Tokenizer
	v, err := ByteLevelVocab(800)
	if err != nil {
		f.Fatal(err)
	}
	bl, err := New(v)
	if err != nil {
		f.Fatal(err)
	}
	toks = append(toks, bl)
	for _, name := range []string{"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"} {
		p := sharedDir + "/" + name
		if fileExists(p) {
			toks = append(toks, openTokenizer(f, p))
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tk := range toks {
			for _, parse := range []bool{false, true} {
				ids := tk.Encode(s, true, parse)
				for _, id := range ids {
					if id < 0 || int(id) >= tk.NVocab() {
						t.Fatalf("id %d out of range", id)
					}
				}
				d := tk.NewDecoder()
				var sb strings.Builder
				for _, id := range ids {
					out := d.Add(id)
					if !utf8.ValidString(out) {
						t.Fatalf("decoder emitted invalid UTF-8 %q", out)
					}
					sb.WriteString(out)
				}
				sb.WriteString(d.Flush())
				_ = tk.Detokenize(ids, true, true)
			}
			if tk.Model() == ModelBPE && utf8.ValidString(s) {
				if got := tk.Decode(tk.Encode(s, false, false)); got != s {
					t.Fatalf("%s: round trip %q -> %q", tk.Pre(), s, got)
				}
			}
		}
	})
}
