package tokenizer_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"shoal/engine/tokenizer"
)

var writeReal = flag.String("write-real", "", "write testdata/real/chat.txt and, into this folder, a small model per real vocabulary of TestRealVocabsAgainstLlama (for tokids)")

// realVocab is a real model's vocabulary, built from a file that a Go module
// on the module proxy carries (the file is read from the module cache, never
// copied into this repository).
type realVocab struct {
	name   string // file stem in testdata/real
	module string // module@version
	file   string // the file's path in the module
	build  func([]byte) (tokenizer.Vocab, error)
}

var realVocabs = []realVocab{
	// gpt-oss: o200k_base's ranks plus o200k_harmony's special tokens.
	{"gpt-oss", "github.com/pkoukk/tiktoken-go-loader@v0.0.2", "assets/o200k_base.tiktoken", harmonyVocab},
	// Gemma 2's SentencePiece model (Gemma 3's own is not reachable here).
	{"gemma2", "github.com/ollama/ollama@v0.17.4", "tokenizer/testdata/gemma2/tokenizer.model", gemmaVocab},
}

// realRuns are the checks per vocabulary: which strings, and whether Encode
// adds BOS and parses special-token text (as for a chat prompt).
var realRuns = []struct {
	name          string
	chat, special bool
}{
	{"plain", false, false},
	{"chat", true, false},
	{"chat-special", true, true},
}

// TestRealVocabsAgainstLlama: with each vocabulary of realVocabs, the ids of
// the 300 strings of testdata/pre/strings.txt and the 120 of
// testdata/real/chat.txt are llama.cpp 0.7.0's (testdata/real: how they were
// made is in its README). A vocabulary whose module is not reachable is
// skipped.
func TestRealVocabsAgainstLlama(t *testing.T) {
	strs, chat := preStrings(), chatStrings()
	if *writeReal != "" {
		writeStrings(t, filepath.Join("testdata", "real", "chat.txt"), chat)
	}
	checkStrings(t, filepath.Join("testdata", "pre", "strings.txt"), strs)
	checkStrings(t, filepath.Join("testdata", "real", "chat.txt"), chat)
	for _, rv := range realVocabs {
		t.Run(rv.name, func(t *testing.T) {
			v, err := rv.build(moduleFile(t, rv.module, rv.file))
			if err != nil {
				t.Fatal(err)
			}
			if *writeReal != "" {
				writeVocabModel(t, v, filepath.Join(*writeReal, rv.name+".gguf"))
				t.Skip("wrote the model: run tokids, then this test again")
			}
			tok, err := tokenizer.New(v)
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range realRuns {
				t.Run(run.name, func(t *testing.T) {
					in := strs
					if run.chat {
						in = chat
					}
					compareIDs(t, tok, in, filepath.Join("testdata", "real", rv.name+"."+run.name+".out"), run.special)
				})
			}
		})
	}
}

// chatFragments are chat-template markers of gpt-oss (harmony) and Gemma,
// other special-looking texts of their vocabularies, and whitespace that
// Gemma holds as user-defined tokens.
var chatFragments = []string{
	"<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>",
	"<|startoftext|>", "<|endoftext|>", "<|endofprompt|>", "<|reserved_200000|>", "user", "assistant",
	"analysis", "final", " to=functions.get_weather", "json", "<start_of_turn>", "<end_of_turn>", "user\n",
	"model\n", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<unused0>", "[@BOS@]", "<s>", "</s>",
	"<table>", "<code>", "</code>", "<h1>", "[toxicity=0]", "\n", "\n\n\n", "  ", "     ", "\t\t\t", " ",
}

// chatStrings are 120 strings: whole chat turns of both templates, then
// mixes of chatFragments and preFragments, fixed by the seed.
func chatStrings() []string {
	out := []string{
		"<|start|>user<|message|>hi<|end|>",
		"<|start|>system<|message|>You are ChatGPT.\nReasoning: low<|end|><|start|>user<|message|>What is 2+2?<|end|><|start|>assistant",
		"<|start|>assistant<|channel|>analysis<|message|>Just add.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
		"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
		"<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
		"<bos><start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\nWaves fold into foam<end_of_turn>\n",
		"<start_of_turn>user\n  indented\tcode:\n\n    x = 1\n<end_of_turn>",
		"<b>bold</b> and <s>struck</s>, <code>x := 1</code>",
	}
	rng := rand.New(rand.NewPCG(37, 2))
	for len(out) < 120 {
		var b strings.Builder
		for range 1 + rng.IntN(6) {
			if rng.IntN(3) < 2 {
				b.WriteString(chatFragments[rng.IntN(len(chatFragments))])
			} else {
				b.WriteString(preFragments[rng.IntN(len(preFragments))])
			}
		}
		out = append(out, b.String())
	}
	return out
}

// moduleFile reads file from module (module@version) through the go
// command, which finds it in the module cache or downloads it from the
// module proxy, checked against the checksum database. It skips the test
// when the module is not reachable.
func moduleFile(t *testing.T, module, file string) []byte {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to find %s: %v", module, err)
	}
	out, err := exec.Command(goCmd, "mod", "download", "-json", module).Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Dir == "" {
		t.Skipf("module %s is not reachable (%s %v): this vocabulary is not checked", module, info.Error, errors.Join(err, jerr))
	}
	b, err := os.ReadFile(filepath.Join(info.Dir, filepath.FromSlash(file)))
	if err != nil {
		t.Skipf("module %s: %v: this vocabulary is not checked", module, err)
	}
	return b
}

// o200k_harmony's vocabulary as gpt-oss's tokenizer.json holds it, and as
// llama.cpp's convert_hf_to_gguf.py writes it: the ranks of o200k_base as
// byte-level tokens, the added tokens 199998..200018 (all special, so
// control), and "[PADi]" (unused) up to the model's vocab_size.
const harmonyVocabSize = 201088

var harmonySpecial = map[int]string{
	199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
	200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
	200018: "<|endofprompt|>",
}

// harmonyVocab builds gpt-oss's vocabulary from o200k_base.tiktoken (one
// "base64-token rank" line per token, ranks 0, 1, ...). Its merges are
// those Hugging Face's tiktoken converter derives, which gpt-oss's
// tokenizer.json holds: for each token in rank order, every split into two
// tokens, ordered by the ranks of the left part, then of the right one.
func harmonyVocab(raw []byte) (tokenizer.Vocab, error) {
	var toks [][]byte
	rank := map[string]int{}
	for i, line := range bytes.Split(bytes.TrimRight(raw, "\n"), []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) != 2 {
			return tokenizer.Vocab{}, fmt.Errorf("o200k line %d: %q", i+1, line)
		}
		tok, err := base64.StdEncoding.DecodeString(string(f[0]))
		if err != nil {
			return tokenizer.Vocab{}, fmt.Errorf("o200k line %d: %v", i+1, err)
		}
		if r, err := strconv.Atoi(string(f[1])); err != nil || r != i {
			return tokenizer.Vocab{}, fmt.Errorf("o200k line %d: rank %q, want %d", i+1, f[1], i)
		}
		toks = append(toks, tok)
		rank[string(tok)] = i
	}
	if len(toks) != 199998 {
		return tokenizer.Vocab{}, fmt.Errorf("o200k_base has %d ranks, want 199998", len(toks))
	}
	v := tokenizer.Vocab{
		Model: tokenizer.ModelBPE, Pre: "gpt-4o",
		Tokens: make([]string, harmonyVocabSize), Types: make([]int32, harmonyVocabSize),
		BOS: 199998, EOS: 200002, PAD: 199999, EOT: tokenizer.NoToken, EOM: tokenizer.NoToken, UNK: tokenizer.NoToken,
	}
	for id := range v.Tokens {
		switch s, special := harmonySpecial[id]; {
		case id < len(toks):
			v.Tokens[id], v.Types[id] = tokenizer.ByteEncode(toks[id]), tokenizer.TypeNormal
		case special:
			v.Tokens[id], v.Types[id] = s, tokenizer.TypeControl
		case id <= 200018:
			v.Tokens[id], v.Types[id] = fmt.Sprintf("<|reserved_%d|>", id), tokenizer.TypeControl
		default:
			v.Tokens[id], v.Types[id] = fmt.Sprintf("[PAD%d]", id), tokenizer.TypeUnused
		}
	}
	var splits [][2]int
	for _, tok := range toks {
		splits = splits[:0]
		for i := 1; i < len(tok); i++ {
			l, okl := rank[string(tok[:i])]
			r, okr := rank[string(tok[i:])]
			if okl && okr {
				splits = append(splits, [2]int{l, r})
			}
		}
		slices.SortFunc(splits, func(a, b [2]int) int {
			if a[0] != b[0] {
				return a[0] - b[0]
			}
			return a[1] - b[1]
		})
		for _, s := range splits {
			v.Merges = append(v.Merges, v.Tokens[s[0]]+" "+v.Tokens[s[1]])
		}
	}
	return v, nil
}

// SentencePiece piece types (sentencepiece_model.proto).
const (
	spNormal      = 1
	spUnknown     = 2
	spControl     = 3
	spUserDefined = 4
	spUnused      = 5
	spByte        = 6
)

type spPiece struct {
	text  string
	score float32
	typ   uint64
}

// gemmaVocab builds Gemma 2's vocabulary from its tokenizer.model as
// convert_hf_to_gguf.py writes it (Gemma2Model: _set_vocab_sentencepiece,
// add_space_prefix false; add_bos true from tokenizer_config.json). The
// model's control, unknown and user-defined pieces are the added tokens of
// tokenizer_config.json (inferred: that file is not reachable here): those
// marked special (<pad>, <eos>, <bos>, <unk>, <start_of_turn>,
// <end_of_turn>) or looking special (<mask>, <2mass>, [@BOS@], <unused*>)
// become control tokens, the rest user-defined with "▁" written as a space;
// all score -1000.
func gemmaVocab(raw []byte) (tokenizer.Vocab, error) {
	pieces, err := sentencePieces(raw)
	if err != nil {
		return tokenizer.Vocab{}, err
	}
	n := len(pieces)
	v := tokenizer.Vocab{
		Model: tokenizer.ModelSPM, Pre: "default",
		Tokens: make([]string, n), Scores: make([]float32, n), Types: make([]int32, n),
		BOS: 2, EOS: 1, UNK: 3, PAD: 0, EOT: tokenizer.NoToken, EOM: tokenizer.NoToken,
		AddBOS: true,
	}
	for i, p := range pieces {
		v.Tokens[i], v.Scores[i], v.Types[i] = p.text, p.score, tokenizer.TypeNormal
		switch p.typ {
		case spUnused:
			v.Types[i] = tokenizer.TypeUnused
		case spByte:
			v.Types[i] = tokenizer.TypeByte
		case spUnknown, spControl, spUserDefined:
			v.Scores[i] = -1000
			switch {
			case p.typ != spUserDefined || p.text == "<start_of_turn>" || p.text == "<end_of_turn>",
				slices.Contains([]string{"<pad>", "<mask>", "<2mass>", "[@BOS@]"}, p.text),
				strings.HasPrefix(p.text, "<|") && strings.HasSuffix(p.text, "|>"),
				strings.HasPrefix(p.text, "<unused") && strings.HasSuffix(p.text, ">"):
				v.Types[i] = tokenizer.TypeControl
			default:
				v.Tokens[i], v.Types[i] = strings.ReplaceAll(p.text, "\u2581", " "), tokenizer.TypeUserDefined
			}
		}
	}
	return v, nil
}

// sentencePieces reads the pieces (field 1) of a SentencePiece ModelProto.
func sentencePieces(raw []byte) ([]spPiece, error) {
	var pieces []spPiece
	err := protoFields(raw, func(field uint64, _ uint64, body []byte) error {
		if field != 1 {
			return nil
		}
		p := spPiece{typ: spNormal}
		err := protoFields(body, func(field, val uint64, body []byte) error {
			switch field {
			case 1:
				p.text = string(body)
			case 2:
				p.score = math.Float32frombits(uint32(val))
			case 3:
				p.typ = val
			}
			return nil
		})
		pieces = append(pieces, p)
		return err
	})
	if err == nil && len(pieces) == 0 {
		err = errors.New("sentencepiece model: no pieces")
	}
	return pieces, err
}

// protoFields calls fn for each field of a protobuf message: val holds a
// varint or fixed-width value, body a length-delimited one.
func protoFields(b []byte, fn func(field, val uint64, body []byte) error) error {
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return errors.New("protobuf: bad field key")
		}
		b = b[n:]
		var val uint64
		var body []byte
		switch key & 7 {
		case 0:
			if val, n = binary.Uvarint(b); n <= 0 {
				return errors.New("protobuf: bad varint")
			}
			b = b[n:]
		case 1, 5:
			w := 8
			if key&7 == 5 {
				w = 4
			}
			if len(b) < w {
				return errors.New("protobuf: short fixed-width value")
			}
			val = binary.LittleEndian.Uint64(append(b[:w:w], make([]byte, 8-w)...))
			b = b[w:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return errors.New("protobuf: bad length")
			}
			body, b = b[n:n+int(l)], b[n+int(l):]
		default:
			return fmt.Errorf("protobuf: wire type %d", key&7)
		}
		if err := fn(key>>3, val, body); err != nil {
			return err
		}
	}
	return nil
}
