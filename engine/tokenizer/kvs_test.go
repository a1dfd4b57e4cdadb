package tokenizer

import (
	"bytes"
	"slices"
	"testing"

	"shoal/engine/gguf"
)

// TestVocabKVsRoundTrip writes a padded byte-level vocabulary as GGUF
// metadata, reads it back and checks the tokenizer encodes the same ids.
func TestVocabKVsRoundTrip(t *testing.T) {
	v, err := ByteLevelVocab(600)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	v.Pad(2000)
	var buf bytes.Buffer
	w := gguf.NewWriter(&buf)
	for _, kv := range v.KVs() {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if tok.NVocab() != 2000 {
		t.Fatalf("n_vocab %d", tok.NVocab())
	}
	text := "Hello, world! Ünïcödé <|unused_700|> 12345\n\tend"
	a, b := orig.Encode(text, true, true), tok.Encode(text, true, true)
	if !slices.Equal(a, b) {
		t.Fatalf("ids differ after the round trip:\n%v\n%v", a, b)
	}
	if got := tok.Decode(tok.Encode(text, false, false)); got != text {
		t.Fatalf("decode %q", got)
	}
}
