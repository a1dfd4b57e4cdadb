package tokenizer

import (
	"testing"
)

// vocabWith is ByteLevelVocab(300) with extra tokens of the given texts and
// types appended, in order; it returns the tokenizer and the extra ids.
func vocabWith(t *testing.T, texts []string, types []int32) (*Tokenizer, []int32) {
	t.Helper()
	v, err := ByteLevelVocab(300)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for i, s := range texts {
		ids = append(ids, int32(len(v.Tokens)))
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, 0)
		v.Types = append(v.Types, types[i])
	}
	tok, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	return tok, ids
}

func contains(ids []int32, id int32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// gpt-oss's header tokens are user-defined in llama.cpp (always rendered),
// so they are split out of text even when special text is not parsed; so is
// <|end|>, which does not end generation once <|return|> and <|call|> do.
func TestHarmonyHeaderTokens(t *testing.T) {
	texts := []string{"<|start|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"}
	types := []int32{TypeControl, TypeControl, TypeControl, TypeControl, TypeControl, TypeControl, TypeControl, TypeControl}
	tok, ids := vocabWith(t, texts, types)
	start, message, channel, constrain, end, ret, call, eot := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]
	got := tok.Encode("<|start|>user<|message|>hi<|end|><|channel|>x<|constrain|>y<|return|><|call|><|endoftext|>", false, false)
	for _, id := range []int32{start, message, channel, constrain, end} {
		if !contains(got, id) {
			t.Errorf("%q not split out without parseSpecial: %v", tok.Token(id), got)
		}
	}
	for _, id := range []int32{ret, call, eot} {
		if contains(got, id) {
			t.Errorf("control token %q split out without parseSpecial: %v", tok.Token(id), got)
		}
	}
	for id, want := range map[int32]bool{end: false, ret: true, call: true, eot: true, start: false} {
		if tok.IsEOG(id) != want {
			t.Errorf("IsEOG(%q) = %v, want %v", tok.Token(id), !want, want)
		}
	}

	// Without <|call|>, <|end|> stays an end-of-generation control token.
	tok, ids = vocabWith(t, []string{"<|end|>", "<|return|>"}, []int32{TypeControl, TypeControl})
	if got := tok.Encode("a<|end|>", false, false); contains(got, ids[0]) || !tok.IsEOG(ids[0]) {
		t.Errorf("<|end|> without <|call|>: ids %v, IsEOG %v; want it control and end of generation", got, tok.IsEOG(ids[0]))
	}
}

// A user-defined token whose text llama.cpp takes for an end of generation
// (Gemma's </s>, the HTML strike-through tag) becomes a control token, no
// longer split out of text unless special text is parsed; next to
// <|tool_response> it is a normal token instead (Gemma 4).
func TestEOGTextBecomesControl(t *testing.T) {
	tok, ids := vocabWith(t, []string{"</s>", "<eos>"}, []int32{TypeUserDefined, TypeControl})
	s := ids[0]
	if got := tok.Encode("a</s>b", false, false); contains(got, s) {
		t.Errorf("</s> split out without parseSpecial: %v", got)
	}
	if got := tok.Encode("a</s>b", false, true); !contains(got, s) {
		t.Errorf("</s> not split out with parseSpecial: %v", got)
	}
	if !tok.IsEOG(s) || !tok.IsEOG(ids[1]) {
		t.Errorf("IsEOG(</s>) = %v, IsEOG(<eos>) = %v, want both true", tok.IsEOG(s), tok.IsEOG(ids[1]))
	}

	tok, ids = vocabWith(t, []string{"</s>", "<|tool_response>"}, []int32{TypeUserDefined, TypeControl})
	if got := tok.Encode("a</s>b", false, true); contains(got, ids[0]) || tok.IsEOG(ids[0]) {
		t.Errorf("</s> next to <|tool_response>: ids %v, IsEOG %v; want a normal token", got, tok.IsEOG(ids[0]))
	}
}
