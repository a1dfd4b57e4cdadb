package tokenizer_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"shoal/engine/tokenizer"
)

// Texts that llama.cpp 0.7.0's vocabulary loader treats specially, read
// from the string table of its libllama (and llama.cpp's source): ends of
// generation (made control tokens), gpt-oss's always-rendered header
// tokens, then the alternatives of each fill-in-the-middle token (made
// control tokens, the last three ends of generation too). Texts nothing
// happens to close the list.
var (
	specialEOGTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
		"<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<｜end▁of▁sentence｜>",
		"[e~[", "<|ifm|im_end|>"}
	specialHeaderTexts = []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}
	specialFIMTexts    = [][]string{
		{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>", "<|plamo:fim_prefix|>"},
		{"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|plamo:fim_suffix|>"},
		{"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>", "<|plamo:fim_middle|>"},
		{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
		{"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
		{"<|file_sep|>", "<|plamo:file_separator|>"},
	}
	specialNoneTexts = []string{"<|im_start|>", "<s>", "<start_of_turn>", "<unused5>", "<|eot|>", "<|endofprompt|>", "[SEP]"}
)

// specialTriggers are the texts that change what llama.cpp makes of <|end|>
// (gpt-oss, solar-open) and </s> (Gemma 4, PLaMo): model k of
// TestSpecialTextsAgainstLlama holds specialTriggers[k]; <|plamo:eos|>
// counts as the end of sequence.
var specialTriggers = [][]string{
	{}, {"<|return|>", "<|call|>"}, {"<|calls|>", "<|flush|>"}, {"<|tool_response>"}, {"<|return|>"},
	{"<|call|>", "<|flush|>"}, {"<|plamo:eos|>"}, {"<|return|>", "<|calls|>", "<|tool_response>"},
	{"<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|tool_response>"},
}

// specialTextVocab is model k: ByteLevelVocab(2048) with every text of
// specialEOGTexts, specialHeaderTexts and specialNoneTexts, the k-th
// alternative of each fill-in-the-middle token and specialTriggers[k]
// appended as user-defined tokens, which llama.cpp splits out of text even
// when special text is not parsed, unless it made them control tokens.
func specialTextVocab(t *testing.T, k int) tokenizer.Vocab {
	v, err := tokenizer.ByteLevelVocab(2048)
	if err != nil {
		t.Fatal(err)
	}
	texts := append(append(append([]string(nil), specialEOGTexts...), specialHeaderTexts...), specialNoneTexts...)
	for _, alts := range specialFIMTexts {
		if k < len(alts) {
			texts = append(texts, alts[k])
		}
	}
	for _, s := range append(texts, specialTriggers[k]...) {
		if s == "<|plamo:eos|>" {
			v.EOS = int32(len(v.Tokens))
		}
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, 0)
		v.Types = append(v.Types, tokenizer.TypeUserDefined)
	}
	return v
}

// specialTextStrings are each text of the models alone, then between two
// letters.
func specialTextStrings() []string {
	var texts []string
	texts = append(append(append(texts, specialEOGTexts...), specialHeaderTexts...), specialNoneTexts...)
	for _, alts := range specialFIMTexts {
		texts = append(texts, alts...)
	}
	texts = append(texts, "<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|tool_response>", "<|plamo:eos|>")
	var out []string
	for _, s := range texts {
		out = append(out, s, "a"+s+"b")
	}
	return out
}

// TestSpecialTextsAgainstLlama: with each model of specialTextVocab, the ids
// of specialTextStrings, special text parsed or not, are llama.cpp 0.7.0's
// (testdata/real: how they were made is in its README): the texts llama.cpp
// makes control tokens or ends of generation by their spelling are the
// same in shoal.
func TestSpecialTextsAgainstLlama(t *testing.T) {
	strs := specialTextStrings()
	path := filepath.Join("testdata", "real", "special-texts", "strings.txt")
	if *writeReal != "" {
		writeStrings(t, path, strs)
	}
	checkStrings(t, path, strs)
	for k := range specialTriggers {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			v := specialTextVocab(t, k)
			if *writeReal != "" {
				writeVocabModel(t, v, filepath.Join(*writeReal, fmt.Sprintf("special-texts-%d.gguf", k)))
				t.Skip("wrote the model: run tokids, then this test again")
			}
			tok, err := tokenizer.New(v)
			if err != nil {
				t.Fatal(err)
			}
			for _, special := range []bool{false, true} {
				name := fmt.Sprintf("%d.plain.out", k)
				if special {
					name = fmt.Sprintf("%d.special.out", k)
				}
				compareIDs(t, tok, strs, filepath.Join("testdata", "real", "special-texts", name), special)
			}
		})
	}
}
