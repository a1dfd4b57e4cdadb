package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"shoal/engine/gguf"
)

// sharedDir is the llama.cpp vocab oracle folder, relative to this package.
const sharedDir = "../../../shared/tokenizer"

const testSeparator = "\n__ggml_vocab_test__\n"

type vocabCase struct {
	name   string
	path   string
	inputs []string
	want   [][]int32
}

func loadVocabCases(t testing.TB) []vocabCase {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(sharedDir, "*.gguf"))
	if len(paths) == 0 {
		t.Skipf("no vocab files in %s", sharedDir)
	}
	sort.Strings(paths)
	var cases []vocabCase
	for _, p := range paths {
		inp, err1 := os.ReadFile(p + ".inp")
		out, err2 := os.ReadFile(p + ".out")
		if err1 != nil || err2 != nil {
			continue
		}
		inputs := strings.Split(string(inp), testSeparator)
		if len(inputs) > 0 && inputs[len(inputs)-1] == "" {
			inputs = inputs[:len(inputs)-1]
		}
		lines := strings.Split(string(out), "\n")
		if len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		if len(lines) != len(inputs) {
			t.Fatalf("%s: %d inputs but %d expected lines", p, len(inputs), len(lines))
		}
		c := vocabCase{name: filepath.Base(p), path: p, inputs: inputs}
		for i, l := range lines {
			var ids []int32
			for _, f := range strings.Fields(l) {
				n, err := strconv.ParseInt(f, 10, 32)
				if err != nil {
					t.Fatalf("%s line %d: %v", p, i+1, err)
				}
				ids = append(ids, int32(n))
			}
			c.want = append(c.want, ids)
		}
		cases = append(cases, c)
	}
	if len(cases) == 0 {
		t.Skipf("no complete vocab tests in %s", sharedDir)
	}
	return cases
}

var (
	tokCacheMu sync.Mutex
	tokCache   = map[string]*Tokenizer{}
)

func openTokenizer(t testing.TB, path string) *Tokenizer {
	t.Helper()
	tokCacheMu.Lock()
	defer tokCacheMu.Unlock()
	if tk, ok := tokCache[path]; ok {
		return tk
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := FromGGUF(f)
	if errors.Is(err, ErrUnsupportedModel) {
		// e.g. a WordPiece (bert) or Unigram (t5) oracle file
		t.Skipf("%s: %v", filepath.Base(path), err)
	}
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tokCache[path] = tk
	return tk
}

// vocabByName returns a tokenizer for a shared vocab file, skipping when absent.
func vocabByName(t testing.TB, name string) *Tokenizer {
	t.Helper()
	p := filepath.Join(sharedDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s not available", p)
	}
	return openTokenizer(t, p)
}

func idsString(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, " %d", id)
	}
	return b.String()
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestVocabOracle checks Encode(text, false, false) against llama.cpp's
// expected ids for every vocab file in the shared folder.
func TestVocabOracle(t *testing.T) {
	for _, c := range loadVocabCases(t) {
		t.Run(c.name, func(t *testing.T) {
			tk := openTokenizer(t, c.path)
			pass := 0
			for i, in := range c.inputs {
				got := tk.Encode(in, false, false)
				if equalIDs(got, c.want[i]) {
					pass++
					continue
				}
				t.Errorf("test %d %q:\n got %s\nwant %s", i, in, idsString(got), idsString(c.want[i]))
			}
			t.Logf("%s: passed %d/%d", c.name, pass, len(c.inputs))
		})
	}
}

// TestVocabRoundTrip checks Decode(Encode(s)) == s: byte-level BPE is
// lossless, SentencePiece only adds (and Decode removes) the leading space.
func TestVocabRoundTrip(t *testing.T) {
	for _, c := range loadVocabCases(t) {
		t.Run(c.name, func(t *testing.T) {
			tk := openTokenizer(t, c.path)
			if tk.Model() == ModelWPM {
				t.Skip("WordPiece lowercases and drops whitespace and accents: no round trip")
			}
			n := 0
			for _, in := range c.inputs {
				if !utf8.ValidString(in) {
					continue
				}
				ids := tk.Encode(in, false, false)
				if got := tk.Decode(ids); got != in {
					t.Errorf("Decode(Encode(%q)) = %q", in, got)
				}
				// the streaming decoder agrees and stays valid UTF-8
				d := tk.NewDecoder()
				var sb strings.Builder
				for _, id := range ids {
					s := d.Add(id)
					if !utf8.ValidString(s) {
						t.Errorf("%q: decoder emitted invalid UTF-8 %q", in, s)
					}
					sb.WriteString(s)
				}
				sb.WriteString(d.Flush())
				if sb.String() != in {
					t.Errorf("streamed %q, want %q", sb.String(), in)
				}
				n++
			}
			t.Logf("%s: %d round trips", c.name, n)
		})
	}
}

func TestKnownLines(t *testing.T) {
	spm := vocabByName(t, "ggml-vocab-llama-spm.gguf")
	if got := idsString(spm.Encode("Hello world", false, false)); got != " 15043 3186" {
		t.Errorf("spm Hello world: %s", got)
	}
	if got := idsString(spm.Encode(" this is 🦙.cpp", false, false)); got != " 29871 445 338 29871 243 162 169 156 29889 8223" {
		t.Errorf("spm llama: %s", got)
	}
	if got := spm.Encode("Hello world", true, false); !equalIDs(got, []int32{1, 15043, 3186}) {
		t.Errorf("spm with BOS: %v", got)
	}
	gpt := vocabByName(t, "ggml-vocab-gpt-2.gguf")
	if got := idsString(gpt.Encode("Hello world", false, false)); got != " 15496 995" {
		t.Errorf("gpt-2 Hello world: %s", got)
	}
	if got := idsString(gpt.Encode(" this is 🦙.cpp", false, false)); got != " 428 318 12520 99 247 13 20322" {
		t.Errorf("gpt-2 llama: %s", got)
	}
	if got := gpt.Encode("Hello world", true, false); !equalIDs(got, []int32{15496, 995}) {
		t.Errorf("gpt-2 addSpecial (no add_bos): %v", got)
	}
}

func TestStreamingDecoderSplitsChar(t *testing.T) {
	spm := vocabByName(t, "ggml-vocab-llama-spm.gguf")
	ids := spm.Encode(" this is 🦙.cpp", false, false)
	d := spm.NewDecoder()
	var steps []string
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("invalid UTF-8 %q after token %d", s, id)
		}
		steps = append(steps, s)
	}
	steps = append(steps, d.Flush())
	if got := strings.Join(steps, ""); got != " this is 🦙.cpp" {
		t.Fatalf("streamed %q", got)
	}
	// The four byte tokens of 🦙 must yield "", "", "", "🦙".
	want := []string{"", " this", " is", " ", "", "", "", "🦙", ".", "cpp", ""}
	if len(steps) != len(want) {
		t.Fatalf("steps %q", steps)
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Fatalf("step %d: %q, want %q (all %q)", i, steps[i], want[i], steps)
		}
	}

	gpt := vocabByName(t, "ggml-vocab-gpt-2.gguf")
	d = gpt.NewDecoder()
	var all strings.Builder
	for _, id := range gpt.Encode(" this is 🦙.cpp", false, false) {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("gpt-2: invalid UTF-8 %q", s)
		}
		all.WriteString(s)
	}
	all.WriteString(d.Flush())
	if all.String() != " this is 🦙.cpp" {
		t.Fatalf("gpt-2 streamed %q", all.String())
	}
}

func TestDecoderInvalidBytes(t *testing.T) {
	v, err := ByteLevelVocab(300)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	d := tk.NewDecoder()
	// 0xF0 0x9F then a plain byte: the partial sequence can never complete.
	out := d.Add(0xF0) + d.Add(0x9F) + d.Add('a') + d.Add(0xE2) + d.Flush()
	if !utf8.ValidString(out) || out != "\uFFFD\uFFFDa\uFFFD" {
		t.Fatalf("got %q", out)
	}
}

func TestParseSpecial(t *testing.T) {
	spm := vocabByName(t, "ggml-vocab-llama-spm.gguf")
	bos, eos := spm.BOS(), spm.EOS()
	got := spm.Encode("<s>Hello</s>", false, true)
	if len(got) < 3 || got[0] != bos || got[len(got)-1] != eos {
		t.Errorf("spm parseSpecial: %v", got)
	}
	// A space prefix follows a special token, as in llama.cpp.
	if want := append(append([]int32{bos}, spm.Encode("Hello", false, false)...), eos); !equalIDs(got, want) {
		t.Errorf("spm parseSpecial: %v, want %v", got, want)
	}
	for _, id := range spm.Encode("<s>Hello</s>", false, false) {
		if id == bos || id == eos {
			t.Errorf("spm parseSpecial=false produced special id %d", id)
		}
	}

	gpt := vocabByName(t, "ggml-vocab-gpt-2.gguf")
	eot, ok := gpt.TokenID("<|endoftext|>")
	if !ok {
		t.Fatal("no <|endoftext|> in gpt-2 vocab")
	}
	got = gpt.Encode("Hello<|endoftext|> world", false, true)
	want := append(append(gpt.Encode("Hello", false, false), eot), gpt.Encode(" world", false, false)...)
	if !equalIDs(got, want) {
		t.Errorf("gpt-2 parseSpecial: %v, want %v", got, want)
	}
	for _, id := range gpt.Encode("Hello<|endoftext|> world", false, false) {
		if id == eot {
			t.Errorf("gpt-2 parseSpecial=false produced <|endoftext|>")
		}
	}
	if !gpt.IsEOG(eot) || !gpt.IsEOG(gpt.EOS()) {
		t.Errorf("gpt-2 <|endoftext|> should be EOG")
	}
	if !spm.IsEOG(eos) || spm.IsEOG(bos) {
		t.Errorf("spm EOG wrong")
	}
	if len(gpt.Piece(eot)) != 0 || string(gpt.PieceSpecial(eot)) != "<|endoftext|>" {
		t.Errorf("control piece: %q / %q", gpt.Piece(eot), gpt.PieceSpecial(eot))
	}
}

func TestPieces(t *testing.T) {
	spm := vocabByName(t, "ggml-vocab-llama-spm.gguf")
	if id, ok := spm.TokenID("<0x0A>"); !ok || string(spm.Piece(id)) != "\n" {
		t.Errorf("<0x0A> piece")
	}
	if id, ok := spm.TokenID("▁Hello"); !ok || string(spm.Piece(id)) != " Hello" {
		t.Errorf("▁Hello piece")
	}
	if len(spm.Piece(spm.BOS())) != 0 || string(spm.PieceSpecial(spm.BOS())) != "<s>" {
		t.Errorf("BOS piece")
	}
	if spm.NVocab() != 32000 || spm.Token(15043) != "▁Hello" || !spm.AddBOS() {
		t.Errorf("spm accessors")
	}
	gpt := vocabByName(t, "ggml-vocab-gpt-2.gguf")
	if id, ok := gpt.TokenID("Ġworld"); !ok || string(gpt.Piece(id)) != " world" {
		t.Errorf("Ġworld piece")
	}
	if gpt.NVocab() != 50257 || gpt.AddBOS() {
		t.Errorf("gpt-2 accessors")
	}
	// llama_detokenize applies clean_up_tokenization_spaces for gpt-2.
	if got := gpt.Detokenize(gpt.Encode("Hello , world !", false, false), false, false); got != "Hello, world!" {
		t.Errorf("Detokenize clean spaces: %q", got)
	}
	if got := gpt.Decode(gpt.Encode("Hello , world !", false, false)); got != "Hello , world !" {
		t.Errorf("Decode: %q", got)
	}
	if got := spm.Detokenize(spm.Encode("Hello", true, false), true, false); got != " Hello" {
		// llama.cpp keeps the space when it removes a BOS.
		t.Errorf("spm Detokenize with BOS: %q", got)
	}
}

func TestErrors(t *testing.T) {
	v, err := ByteLevelVocab(300)
	if err != nil {
		t.Fatal(err)
	}
	v.Pre = "no-such-pre"
	_, err = New(v)
	if err == nil || !strings.Contains(err.Error(), "no-such-pre") || !strings.Contains(err.Error(), "llama3") {
		t.Errorf("unknown pre: %v", err)
	}
	for _, m := range []string{"t5", "rwkv", "weird"} {
		v.Model = m
		v.Pre = "gpt-2"
		_, err = New(v)
		if err == nil || !strings.Contains(err.Error(), m) || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("model %s: %v", m, err)
		}
		if _, err := DefaultVocab(m, ""); err == nil {
			t.Errorf("DefaultVocab(%s) should fail", m)
		}
	}
	// The same through a GGUF file.
	for _, tc := range []struct{ model, pre, want string }{
		{"gpt2", "mystery", "mystery"},
		{"t5", "", "t5"},
	} {
		var buf bytes.Buffer
		w := gguf.NewWriter(&buf)
		w.AddKV("tokenizer.ggml.model", tc.model)
		if tc.pre != "" {
			w.AddKV("tokenizer.ggml.pre", tc.pre)
		}
		w.AddKV("tokenizer.ggml.tokens", []string{"a", "b"})
		w.AddKV("tokenizer.ggml.merges", []string{"a b"})
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		_, err = FromGGUF(f)
		f.Close()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("FromGGUF(%s/%s): %v", tc.model, tc.pre, err)
		}
	}
}

func TestPreTokenizersCompile(t *testing.T) {
	v, err := ByteLevelVocab(400)
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello World! It's 2025-02-14, 12345 apples; naïve café ÀÉ 你好世界 こんにちは 🦙 \t\n\n  end  "
	for _, name := range PreTokenizers() {
		v.Pre = name
		v.BOS = 256
		tk, err := New(v)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		ids := tk.Encode(text, false, false)
		if got := tk.Decode(ids); got != text {
			t.Errorf("%s: round trip %q", name, got)
		}
	}
}

func TestByteLevelVocab(t *testing.T) {
	if _, err := ByteLevelVocab(259); err == nil {
		t.Error("ByteLevelVocab(259) should fail")
	}
	for _, n := range []int{260, 512, 1000, 4096} {
		v, err := ByteLevelVocab(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Tokens) > n || len(v.Tokens) < 260 {
			t.Fatalf("size %d: %d tokens", n, len(v.Tokens))
		}
		v2, _ := ByteLevelVocab(n)
		if strings.Join(v.Tokens, "\x00") != strings.Join(v2.Tokens, "\x00") || strings.Join(v.Merges, "\x00") != strings.Join(v2.Merges, "\x00") {
			t.Fatal("not deterministic")
		}
		tk, err := New(v)
		if err != nil {
			t.Fatal(err)
		}
		if tk.Token(256) != ByteLevelBOS || tk.Token(257) != ByteLevelEOS || tk.BOS() != 256 || tk.EOS() != 257 || !tk.IsEOG(257) {
			t.Fatal("specials")
		}
		for _, s := range []string{"", "hello world", "The quick brown fox", "日本語のテキスト 🦙🦙", "func main() {\n\tfmt.Println(\"hi\")\n}\n", "\x00\x01 odd\u2028bytes\uFFFD", "<|bos|> not special"} {
			ids := tk.Encode(s, false, false)
			if got := tk.Decode(ids); got != s {
				t.Errorf("size %d: round trip %q -> %q", n, s, got)
			}
		}
		if got := tk.Encode("<|bos|>x<|eos|>", false, true); len(got) < 3 || got[0] != 256 || got[len(got)-1] != 257 {
			t.Errorf("parseSpecial: %v", got)
		}
		if got := tk.Encode("x", true, false); got[0] != 256 {
			t.Errorf("addSpecial: %v", got)
		}
		// 🦙 is four bytes; whatever tokens carry them, the stream stays valid.
		d := tk.NewDecoder()
		var all string
		for _, id := range tk.Encode("a🦙b", false, false) {
			s := d.Add(id)
			if !utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 step %q", s)
			}
			all += s
		}
		if all += d.Flush(); all != "a🦙b" {
			t.Errorf("streamed %q", all)
		}
	}
	v, _ := ByteLevelVocab(1 << 20)
	t.Logf("full byte-level vocabulary: %d tokens, %d merges", len(v.Tokens), len(v.Merges))
	tk, _ := New(v)
	ids := tk.Encode("The tokenizer turns text into numbers", false, false)
	if len(ids) > 12 {
		t.Errorf("training did not produce useful merges: %d tokens", len(ids))
	}
}

func TestEncodeSpeed(t *testing.T) {
	var b strings.Builder
	for b.Len() < 10<<10 {
		b.WriteString("The quick brown fox jumps over the lazy dog; naïve café 12345 🦙 <s> it's\n\t  ")
	}
	text := b.String()
	var toks []*Tokenizer
	if v, err := ByteLevelVocab(2000); err == nil {
		tk, _ := New(v)
		toks = append(toks, tk)
	}
	for _, c := range loadVocabCasesOrNone() {
		if tk := tryOpen(c.path); tk != nil {
			toks = append(toks, tk)
		}
	}
	for _, tk := range toks {
		tk.cacheMu.Lock()
		clear(tk.cache)
		tk.cacheMu.Unlock()
		start := time.Now()
		ids := tk.Encode(text, true, true)
		el := time.Since(start)
		t.Logf("%s/%s: %d bytes -> %d tokens in %v", tk.Model(), tk.Pre(), len(text), len(ids), el)
		if el > time.Second {
			t.Errorf("encoding 10 KB took %v", el)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestEncodeSpeedAllPre encodes 10 KB of mixed and of pathological text
// (long runs of one character class) with every pre-tokenizer.
func TestEncodeSpeedAllPre(t *testing.T) {
	v, err := ByteLevelVocab(1000)
	if err != nil {
		t.Fatal(err)
	}
	var mixed strings.Builder
	for mixed.Len() < 10<<10 {
		mixed.WriteString("Hello World! It's 2025-02-14, 12345 apples; naïve café ÀÉ 你好世界 こんにちは 🦙 \t\n\n  end  ")
	}
	texts := map[string]string{
		"mixed":  mixed.String(),
		"spaces": strings.Repeat(" ", 10<<10) + "x",
		"lines":  strings.Repeat(" \n", 5<<10),
		"letter": strings.Repeat("a", 10<<10),
		"digits": strings.Repeat("7", 10<<10),
		"punct":  strings.Repeat("!?", 5<<10),
		"cjk":    strings.Repeat("語", 3<<10),
	}
	for _, name := range PreTokenizers() {
		v.Pre = name
		tk, err := New(v)
		if err != nil {
			t.Fatal(err)
		}
		var worst time.Duration
		var worstText string
		for tn, text := range texts {
			start := time.Now()
			ids := tk.Encode(text, false, false)
			el := time.Since(start)
			if el > worst {
				worst, worstText = el, tn
			}
			if got := tk.Decode(ids); got != text {
				t.Errorf("%s/%s: round trip failed", name, tn)
			}
		}
		if worst > 2*time.Second {
			t.Errorf("%s: %s took %v", name, worstText, worst)
		}
		if testing.Verbose() {
			t.Logf("%-16s worst %-7s %v", name, worstText, worst)
		}
	}
}

func TestConcurrentEncode(t *testing.T) {
	v, err := ByteLevelVocab(600)
	if err != nil {
		t.Fatal(err)
	}
	v.Pre = "qwen2" // regex path
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"Hello world 123", "it's a test\n\n", "naïve café 🦙", "x = f(y) + 42;"}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tk.Encode(s, true, true)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				k := (g + i) % len(texts)
				if got := tk.Encode(texts[k], true, true); !equalIDs(got, want[k]) {
					t.Errorf("concurrent encode of %q differs", texts[k])
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

// tryOpen loads a vocab file, or returns nil when its model is unsupported.
func tryOpen(path string) *Tokenizer {
	f, err := gguf.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	tk, err := FromGGUF(f)
	if err != nil {
		return nil
	}
	return tk
}

func loadVocabCasesOrNone() []vocabCase {
	paths, _ := filepath.Glob(filepath.Join(sharedDir, "*.gguf"))
	var cs []vocabCase
	for _, p := range paths {
		cs = append(cs, vocabCase{name: filepath.Base(p), path: p})
	}
	return cs
}
