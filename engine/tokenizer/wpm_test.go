package tokenizer

import (
	"bytes"
	"strings"
	"testing"

	"shoal/engine/gguf"
)

// testWPMVocab is a tiny BERT vocabulary as llama.cpp's converter stores it:
// word-initial pieces carry "▁", "##" continuations are stored bare.
func testWPMVocab(t *testing.T) Vocab {
	t.Helper()
	v, err := DefaultVocab(ModelWPM, "")
	if err != nil {
		t.Fatal(err)
	}
	v.Tokens = []string{
		"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", // 0-4
		"▁hello", "▁world", "▁un", "aff", "able", // 5-9
		"▁!", "▁,", "▁the", "▁cafe", "▁中", // 10-14
		"▁国", "ing", "▁play", "▁a", "▁$", // 15-19
		"▁5", "▁Hello", "▁b", "▁ab", "s", // 20-24
		"▁naive", "▁한", "▁ᄒ", // 25-27
	}
	v.Types = make([]int32, len(v.Tokens))
	for i := range v.Types {
		v.Types[i] = TypeNormal
	}
	for i := 0; i <= 4; i++ {
		v.Types[i] = TypeControl
	}
	v.Types[1] = TypeUnknown
	v.PAD, v.UNK, v.BOS, v.SEP = 0, 1, 2, 3
	return v
}

func TestWordPieceEncode(t *testing.T) {
	tk, err := New(testWPMVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	if tk.Model() != ModelWPM || tk.BOS() != 2 || tk.SEP() != 3 || !tk.AddBOS() || !tk.AddSEP() {
		t.Fatalf("model %q bos %d sep %d add %v %v", tk.Model(), tk.BOS(), tk.SEP(), tk.AddBOS(), tk.AddSEP())
	}
	for _, c := range []struct {
		in   string
		want []int32
	}{
		{"", nil},
		{"Hello, World!", []int32{5, 11, 6, 10}},
		{"  hello\t\nworld  ", []int32{5, 6}},
		{"unaffable", []int32{7, 8, 9}},
		{"playing plays", []int32{17, 16, 17, 24}},
		{"Café CAFÉ cafe\u0301", []int32{13, 13, 13}}, // accents stripped, composed or combining
		{"naïve", []int32{25}},
		{"xyz", []int32{1}},                 // nothing matches
		{"playx", []int32{1}},               // a prefix matches, the rest not: the whole word is [UNK]
		{"中国", []int32{14, 15}},             // each CJK ideograph is a word
		{"a中b", []int32{18, 14, 22}},        // and splits the words around it
		{"$5", []int32{19, 20}},             // ASCII symbols split
		{"a\x00b\u200bs", []int32{23, 24}},  // NUL and format characters dropped inside a word
		{"the[MASK]", []int32{12, 1, 1, 1}}, // without parse_special "[MASK]" is text: [ mask ]
		{"한", []int32{27}},                  // llama.cpp's NFD keeps a Hangul syllable's leading jamo only
	} {
		got := tk.Encode(c.in, false, false)
		if !equalIDs(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	// Special tokens: [CLS] ... [SEP] and parse_special.
	if got, want := tk.Encode("hello world", true, false), []int32{2, 5, 6, 3}; !equalIDs(got, want) {
		t.Errorf("with special tokens: %v, want %v", got, want)
	}
	if got, want := tk.Encode("", true, false), []int32{2, 3}; !equalIDs(got, want) {
		t.Errorf("empty with special tokens: %v, want %v", got, want)
	}
	if got, want := tk.Encode("the [MASK] play", false, true), []int32{12, 4, 17}; !equalIDs(got, want) {
		t.Errorf("parse_special: %v, want %v", got, want)
	}
	if got, want := tk.Decode(tk.Encode("Hello, unaffable world", true, false)), "hello , unaffable world"; got != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
}

func TestWordPieceOptions(t *testing.T) {
	v := testWPMVocab(t)
	v.Lowercase, v.StripAccents = false, false
	v.AddSEP = false
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in   string
		want []int32
	}{
		{"Hello hello", []int32{21, 5}},
		{"Café", []int32{1}},
		{"cafe\u0301", []int32{1}}, // the mark stays part of the word
	} {
		if got := tk.Encode(c.in, false, false); !equalIDs(got, c.want) {
			t.Errorf("cased Encode(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	if got, want := tk.Encode("hello", true, false), []int32{2, 5}; !equalIDs(got, want) {
		t.Errorf("add_sep false: %v, want %v", got, want)
	}
	// Lowercase without accent stripping.
	v.Lowercase = true
	tk, err = New(v)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tk.Encode("HELLO Café", false, false), []int32{5, 1}; !equalIDs(got, want) {
		t.Errorf("lowercase only: %v, want %v", got, want)
	}
	// add_sep without a separator is an error, as in llama.cpp.
	v.AddSEP, v.SEP = true, NoToken
	if _, err := New(v); err == nil {
		t.Error("add_sep without a separator id: no error")
	}
}

func TestWordPieceFromGGUF(t *testing.T) {
	for _, lower := range []bool{true, false} {
		v := testWPMVocab(t)
		v.Lowercase, v.StripAccents = lower, lower
		var buf bytes.Buffer
		w := gguf.NewWriter(&buf)
		for _, kv := range v.KVs() {
			w.AddKV(kv.Key, kv.Value)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		tk, err := FromGGUF(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := []int32{2, 21, 3}
		if lower {
			want = []int32{2, 5, 3}
		}
		if got := tk.Encode("Hello", true, false); !equalIDs(got, want) {
			t.Errorf("lowercase=%v: %v, want %v", lower, got, want)
		}
	}
	// A file with only the model and tokens gets llama.cpp's BERT defaults:
	// [CLS]=101, [SEP]=102, [UNK]=100, lowercase and accent stripping on.
	toks := make([]string, 110)
	for i := range toks {
		toks[i] = "▁w" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	toks[100], toks[101], toks[102] = "[UNK]", "[CLS]", "[SEP]"
	toks[0] = "▁cafe"
	var buf bytes.Buffer
	w := gguf.NewWriter(&buf)
	w.AddKV("tokenizer.ggml.model", "bert")
	w.AddKV("tokenizer.ggml.tokens", toks)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tk.Encode("CAFÉ zzz", true, false), []int32{101, 0, 100, 102}; !equalIDs(got, want) {
		t.Errorf("defaults: %v, want %v", got, want)
	}
}

func TestNFDBase(t *testing.T) {
	for _, c := range []struct{ in, want rune }{
		{'a', 'a'}, {'é', 'e'}, {'É', 'E'}, {'ñ', 'n'}, {'ǖ', 'u'}, {'Å', 'A'}, {'Å', 'A'}, // U+212B ANGSTROM SIGN
		{'ῷ', 'ω'}, {'한', 'ᄒ'}, {'가', 'ᄀ'}, {'힣', 'ᄒ'}, {'中', '中'}, {'ß', 'ß'},
	} {
		if got := nfdBase(c.in); got != c.want {
			t.Errorf("nfdBase(%U) = %U, want %U", c.in, got, c.want)
		}
	}
}

func TestTinyWordPieceVocab(t *testing.T) {
	v := TinyWordPieceVocab(512)
	if len(v.Tokens) != 512 {
		t.Fatalf("%d tokens", len(v.Tokens))
	}
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	got := tk.Encode("Hello, World! Searching 42 Zebras.", true, false)
	var pieces []string
	for _, id := range got {
		pieces = append(pieces, tk.Token(id))
	}
	want := "[CLS] ▁hello ▁, ▁world ▁! ▁search ing ▁4 2 ▁z e b r a s ▁. [SEP]"
	if s := strings.Join(pieces, " "); s != want {
		t.Errorf("pieces %q, want %q", s, want)
	}
}
