package tokenizer

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"shoal/engine/gguf"
)

// Token types as stored in tokenizer.ggml.token_type.
const (
	TypeUndefined   int32 = 0
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// NoToken marks an absent special token id.
const NoToken int32 = -1

// Tokenizer model names (tokenizer.ggml.model).
const (
	ModelSPM = "llama" // SentencePiece BPE with scores and byte fallback
	ModelBPE = "gpt2"  // byte-level BPE with merges
	// ModelWPM ("bert", WordPiece) is declared in wpm.go.
)

// Vocab is the plain-data description of a tokenizer, mirroring the
// tokenizer.ggml.* metadata. Special token ids use NoToken (-1) for "none";
// DefaultVocab returns llama.cpp's defaults for a model/pre pair.
type Vocab struct {
	Model string // "llama" (SPM) or "gpt2" (byte-level BPE)
	Pre   string // pre-tokenizer name, BPE only ("" means "default")
	Name  string // general.name; only used for llama.cpp's per-model token attributes

	Tokens []string
	Scores []float32 // optional, per token
	Types  []int32   // optional, per token (Type* constants); nil = all normal
	Merges []string  // BPE merges "left right", in rank order

	BOS, EOS, EOT, EOM, UNK, PAD int32
	ExtraEOG                     []int32 // further end-of-generation ids (e.g. FIM pad/repo/sep)

	AddBOS, AddEOS         bool
	AddSpacePrefix         bool
	RemoveExtraWhitespaces bool // read for completeness; llama.cpp's SPM tokenizer ignores it

	// WordPiece ("bert") only: the separator ([SEP]) appended when AddSEP,
	// and BERT's normalizer options (DefaultVocab turns both on).
	SEP                     int32
	AddSEP                  bool
	Lowercase, StripAccents bool
}

// token attributes (llama_token_attr).
type attr uint32

const (
	attrUndefined   attr = 0
	attrUnknown     attr = 1 << 0
	attrUnused      attr = 1 << 1
	attrNormal      attr = 1 << 2
	attrControl     attr = 1 << 3
	attrUserDefined attr = 1 << 4
	attrByte        attr = 1 << 5
	attrLStrip      attr = 1 << 7
	attrRStrip      attr = 1 << 8
)

func typeAttr(t int32) attr {
	switch t {
	case TypeNormal:
		return attrNormal
	case TypeUnknown:
		return attrUnknown
	case TypeControl:
		return attrControl
	case TypeUserDefined:
		return attrUserDefined
	case TypeUnused:
		return attrUnused
	case TypeByte:
		return attrByte
	}
	return attrUndefined
}

type mergeKey struct{ a, b string }

// Tokenizer encodes text to token ids and back. It is safe for concurrent use.
type Tokenizer struct {
	spm     bool
	preName string
	pre     preType
	split   *preTokenizer

	tokens  []string
	scores  []float32
	attrs   []attr
	toID    map[string]int32
	ranks   map[mergeKey]int32
	special []int32 // control/user-defined/unknown ids, longest text first

	bos, eos, eot, eom, unk, pad int32
	eog                          map[int32]bool

	addBOS, addEOS, addSpacePrefix, removeExtraWS bool

	// WordPiece ("bert"): wpm.go.
	wpm                 bool
	sep                 int32
	addSEP              bool
	lower, stripAccents bool
	maxTokenLen         int // longest token text in bytes

	piece        [][]byte // token_to_piece(special=false)
	pieceSpecial [][]byte // token_to_piece(special=true)

	cacheMu sync.Mutex
	cache   map[string][]int32
}

// DefaultVocab returns a Vocab holding llama.cpp's defaults for the given
// tokenizer model and pre-tokenizer (special ids, add_bos/add_eos,
// add_space_prefix). Tokens, scores, types and merges are left empty.
func DefaultVocab(model, pre string) (Vocab, error) {
	v := Vocab{Model: model, Pre: pre, BOS: NoToken, EOS: NoToken, EOT: NoToken, EOM: NoToken, UNK: NoToken, PAD: NoToken, SEP: NoToken}
	switch model {
	case ModelWPM:
		v.BOS, v.UNK, v.SEP, v.PAD = bertCLS, bertUNK, bertSEP, bertPAD
		v.AddBOS, v.AddSEP = true, true
		v.Lowercase, v.StripAccents = true, true
	case ModelSPM:
		v.BOS, v.EOS, v.UNK = 1, 2, 0
		v.AddBOS = true
		v.AddSpacePrefix = true
		v.Pre = ""
	case ModelBPE:
		v.BOS, v.EOS = 11, 11
		p, err := lookupPre(pre)
		if err != nil {
			return Vocab{}, err
		}
		v.AddBOS = p.addBOS
		if p.noBOS {
			v.BOS = NoToken
		}
	default:
		return Vocab{}, unsupportedModel(model)
	}
	return v, nil
}

// Errors FromGGUF and New wrap, for errors.Is.
var (
	ErrUnsupportedModel = errors.New("tokenizer model not supported")
	ErrUnknownPre       = errors.New("unknown pre-tokenizer type")
)

func unsupportedModel(model string) error {
	kind := ""
	switch model {
	case "t5":
		kind = " (Unigram)"
	case "rwkv":
		kind = " (RWKV trie)"
	case "plamo2":
		kind = " (PLaMo-2)"
	case "", "none", "no_vocab":
		return fmt.Errorf("tokenizer: %w: the model has no vocabulary (tokenizer.ggml.model %q)", ErrUnsupportedModel, model)
	}
	return fmt.Errorf("tokenizer: %w: tokenizer.ggml.model %q%s is not supported; supported: %q (SentencePiece), %q (byte-level BPE), %q (WordPiece)",
		ErrUnsupportedModel, model, kind, ModelSPM, ModelBPE, ModelWPM)
}

func lookupPre(pre string) (preType, error) {
	if pre == "" {
		pre = "default"
	}
	p, ok := preTypes[pre]
	if !ok {
		return preType{}, fmt.Errorf("tokenizer: %w %q (tokenizer.ggml.pre); known: %s", ErrUnknownPre, pre, strings.Join(PreTokenizers(), ", "))
	}
	return p, nil
}

// FromGGUF builds a tokenizer from a GGUF file's tokenizer.ggml.* metadata,
// applying llama.cpp's defaults for missing keys.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	model, ok := f.String("tokenizer.ggml.model")
	if !ok {
		return nil, errors.New("tokenizer: tokenizer.ggml.model is missing")
	}
	pre, _ := f.String("tokenizer.ggml.pre")
	v, err := DefaultVocab(model, pre)
	if err != nil {
		return nil, err
	}
	v.Name, _ = f.String("general.name")
	if v.Tokens, ok = f.Strings("tokenizer.ggml.tokens"); !ok {
		return nil, errors.New("tokenizer: tokenizer.ggml.tokens is missing or not a string array")
	}
	n := len(v.Tokens)
	if kv, ok := f.Lookup("tokenizer.ggml.scores"); ok {
		switch s := kv.Value.(type) {
		case []float32:
			v.Scores = s
		case []int32:
			v.Scores = make([]float32, len(s))
			for i, x := range s {
				v.Scores[i] = float32(x)
			}
		default:
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.scores has type %T, want float32 or int32 array", kv.Value)
		}
		if len(v.Scores) < n {
			return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(v.Scores), n)
		}
		v.Scores = v.Scores[:n]
	}
	if kv, ok := f.Lookup("tokenizer.ggml.token_type"); ok {
		t, ok := kv.Value.([]int32)
		if !ok {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.token_type has type %T, want int32 array", kv.Value)
		}
		if len(t) < n {
			return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(t), n)
		}
		v.Types = t[:n]
	}
	if model == ModelBPE {
		if v.Merges, ok = f.Strings("tokenizer.ggml.merges"); !ok {
			return nil, errors.New("tokenizer: tokenizer.ggml.merges is missing (required for gpt2 models)")
		}
	}
	if v.Pre == "" && model == ModelBPE {
		v.Pre = "default"
	}
	// Default ids outside the vocabulary are disabled; file ids outside it
	// are ignored (llama.cpp keeps the default).
	for _, id := range []*int32{&v.BOS, &v.EOS, &v.EOT, &v.EOM, &v.UNK, &v.PAD, &v.SEP} {
		if *id >= int32(n) {
			*id = NoToken
		}
	}
	readID := func(key string, dst *int32) {
		if u, ok := f.Uint(key); ok && u < uint64(n) {
			*dst = int32(u)
		}
	}
	readID("tokenizer.ggml.bos_token_id", &v.BOS)
	readID("tokenizer.ggml.eos_token_id", &v.EOS)
	readID("tokenizer.ggml.eot_token_id", &v.EOT)
	readID("tokenizer.ggml.eom_token_id", &v.EOM)
	readID("tokenizer.ggml.unknown_token_id", &v.UNK)
	readID("tokenizer.ggml.padding_token_id", &v.PAD)
	readID("tokenizer.ggml.seperator_token_id", &v.SEP) // llama.cpp's spelling
	for _, key := range []string{"tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id"} {
		if u, ok := f.Uint(key); ok && u < uint64(n) {
			v.ExtraEOG = append(v.ExtraEOG, int32(u))
		}
	}
	if b, ok := f.Bool("tokenizer.ggml.add_bos_token"); ok {
		v.AddBOS = b
	}
	if b, ok := f.Bool("tokenizer.ggml.add_eos_token"); ok {
		v.AddEOS = b
	}
	if b, ok := f.Bool("tokenizer.ggml.add_sep_token"); ok {
		v.AddSEP = b
	}
	if b, ok := f.Bool("tokenizer.ggml.normalizer.lowercase"); ok {
		v.Lowercase, v.StripAccents = b, b // strip_accents defaults to lowercase
	}
	if b, ok := f.Bool("tokenizer.ggml.normalizer.strip_accents"); ok {
		v.StripAccents = b
	}
	if b, ok := f.Bool("tokenizer.ggml.add_space_prefix"); ok {
		v.AddSpacePrefix = b
	}
	if b, ok := f.Bool("tokenizer.ggml.remove_extra_whitespaces"); ok {
		v.RemoveExtraWhitespaces = b
	}
	return New(v)
}

// Texts llama.cpp (0.7.0) uses to recognise special tokens that the
// converter did not tag (TestSpecialTextsAgainstLlama checks them). Where a
// vocabulary holds several texts of one list, llama.cpp takes one in the
// order of a hash map; these lists take the first.
var (
	eotTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}
	eomTexts = []string{"<|eom_id|>"}
	eogTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
		"<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[", "<|ifm|im_end|>"}

	// gpt-oss's header tokens, which llama.cpp always renders: user-defined
	// whatever their type, so split out of text even without parseSpecial.
	userDefinedTexts = []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}

	fimPreTexts = []string{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>", "<|plamo:fim_prefix|>"}
	fimSufTexts = []string{"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|plamo:fim_suffix|>"}
	fimMidTexts = []string{"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>", "<|plamo:fim_middle|>"}
	fimPadTexts = []string{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}
	fimRepTexts = []string{"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}
	fimSepTexts = []string{"<|file_sep|>", "<|plamo:file_separator|>"}
)

// New builds a tokenizer from plain data.
func New(v Vocab) (*Tokenizer, error) {
	t := &Tokenizer{
		bos: v.BOS, eos: v.EOS, eot: v.EOT, eom: v.EOM, unk: v.UNK, pad: v.PAD,
		addBOS: v.AddBOS, addEOS: v.AddEOS, addSpacePrefix: v.AddSpacePrefix, removeExtraWS: v.RemoveExtraWhitespaces,
		sep: NoToken,
	}
	switch v.Model {
	case ModelSPM:
		t.spm = true
	case ModelWPM:
		t.wpm = true
		t.sep, t.addSEP, t.lower, t.stripAccents = v.SEP, v.AddSEP, v.Lowercase, v.StripAccents
		t.addSpacePrefix = false // llama.cpp: no space prefix for WPM
	case ModelBPE:
		p, err := lookupPre(v.Pre)
		if err != nil {
			return nil, err
		}
		t.pre = p
		t.preName = v.Pre
		if t.preName == "" {
			t.preName = "default"
		}
		if t.split, err = compilePre(p.exprs); err != nil {
			return nil, err
		}
	default:
		return nil, unsupportedModel(v.Model)
	}
	n := len(v.Tokens)
	if n == 0 {
		return nil, errors.New("tokenizer: empty vocabulary")
	}
	if n > 1<<31-1 {
		return nil, errors.New("tokenizer: vocabulary too large")
	}
	if v.Scores != nil && len(v.Scores) != n {
		return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(v.Scores), n)
	}
	if v.Types != nil && len(v.Types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(v.Types), n)
	}
	t.tokens = make([]string, n)
	t.scores = make([]float32, n)
	t.attrs = make([]attr, n)
	t.toID = make(map[string]int32, n)
	for i, w := range v.Tokens {
		if w == "" {
			w = fmt.Sprintf("[EMPTY_%d]", i)
		}
		// A duplicate text maps to its last id, as in llama.cpp (c392e50).
		t.toID[w] = int32(i)
		t.tokens[i] = w
		t.maxTokenLen = max(t.maxTokenLen, len(w))
		if v.Scores != nil {
			t.scores[i] = v.Scores[i]
		}
		if v.Types != nil {
			t.attrs[i] = typeAttr(v.Types[i])
		} else {
			t.attrs[i] = attrNormal
		}
	}
	for name, id := range map[string]int32{"bos": v.BOS, "eos": v.EOS, "eot": v.EOT, "eom": v.EOM, "unknown": v.UNK, "padding": v.PAD, "separator": t.sep} {
		if id < NoToken || id >= int32(n) {
			return nil, fmt.Errorf("tokenizer: %s token id %d outside the vocabulary of %d", name, id, n)
		}
	}
	if t.addBOS && t.bos == NoToken {
		return nil, errors.New("tokenizer: add_bos_token is true, but bos_token_id is not set")
	}
	if t.addEOS && t.eos == NoToken {
		return nil, errors.New("tokenizer: add_eos_token is true, but eos_token_id is not set")
	}
	if t.addSEP && t.sep == NoToken {
		return nil, errors.New("tokenizer: add_sep_token is true, but seperator_token_id is not set")
	}
	if !t.spm && !t.wpm {
		t.ranks = make(map[mergeKey]int32, len(v.Merges))
		for i, m := range v.Merges {
			var k mergeKey
			if len(m) > 1 {
				if p := strings.IndexByte(m[1:], ' '); p >= 0 {
					k = mergeKey{m[:p+1], m[p+2:]}
				}
			}
			if _, ok := t.ranks[k]; !ok {
				t.ranks[k] = int32(i)
			}
		}
	}

	// Special tokens recognised by text, as in llama.cpp's vocab loader.
	makeControl := func(id int32) { t.attrs[id] |= attrControl }
	findText := func(texts []string) int32 {
		for _, s := range texts {
			if id, ok := t.toID[s]; ok {
				return id
			}
		}
		return NoToken
	}
	if t.eot == NoToken {
		if id := findText(eotTexts); id != NoToken {
			t.eot = id
			makeControl(id)
		}
	}
	if t.eom == NoToken {
		if id := findText(eomTexts); id != NoToken {
			t.eom = id
			makeControl(id)
		}
	}
	for _, texts := range [][]string{fimPreTexts, fimSufTexts, fimMidTexts} {
		if id := findText(texts); id != NoToken {
			makeControl(id)
		}
	}
	t.eog = map[int32]bool{}
	for _, texts := range [][]string{fimPadTexts, fimRepTexts, fimSepTexts} {
		if id := findText(texts); id != NoToken {
			makeControl(id)
			t.eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.toID[s]; ok {
			t.eog[id] = true
			makeControl(id)
		}
	}
	for _, s := range userDefinedTexts {
		if id, ok := t.toID[s]; ok {
			t.attrs[id] = attrUserDefined
		}
	}
	for _, id := range append([]int32{t.eos, t.eot, t.eom}, v.ExtraEOG...) {
		if id >= 0 && id < int32(n) {
			t.eog[id] = true
		}
	}
	t.eogWorkarounds()

	for id := range t.attrs {
		if t.attrs[id]&(attrControl|attrUserDefined|attrUnknown) != 0 {
			t.special = append(t.special, int32(id))
		}
	}
	sort.SliceStable(t.special, func(a, b int) bool {
		return len(t.tokens[t.special[a]]) > len(t.tokens[t.special[b]])
	})

	// Per-model token attributes llama.cpp derives from names.
	name := strings.ToLower(v.Name)
	switch {
	case strings.Contains(v.Pre, "jina-v2-de") || strings.Contains(v.Pre, "jina-v2-es") || strings.Contains(v.Pre, "jina-v2-code"):
		if id, ok := t.toID["<mask>"]; ok {
			t.attrs[id] |= attrLStrip
		}
	case strings.Contains(name, "phi-3") || strings.Contains(name, "phi3"):
		for _, id := range t.special {
			t.attrs[id] |= attrRStrip
		}
		if id, ok := t.toID["</s>"]; ok {
			t.attrs[id] |= attrRStrip
		}
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			if id, ok := t.toID[s]; ok {
				t.attrs[id] &^= attrRStrip
			}
		}
	}

	t.piece = make([][]byte, n)
	t.pieceSpecial = make([][]byte, n)
	for id := range t.tokens {
		t.piece[id] = t.tokenToPiece(int32(id), false)
		t.pieceSpecial[id] = t.tokenToPiece(int32(id), true)
	}
	t.cache = make(map[string][]int32)
	return t, nil
}

// eogWorkarounds are llama.cpp's exceptions to the end-of-generation texts:
// o200k_harmony's <|end|> (and solar-open's) ends a message, not the
// generation, once <|return|> and <|call|> (or <|calls|> and <|flush|>) do,
// and becomes user-defined; </s> next to Gemma 4's <|tool_response> or
// PLaMo's <|plamo:eos|> is an HTML tag, a normal token.
func (t *Tokenizer) eogWorkarounds() {
	eog := func(s string) (int32, bool) {
		id, ok := t.toID[s]
		return id, ok && t.eog[id]
	}
	_, ret := eog("<|return|>")
	_, call := eog("<|call|>")
	_, calls := eog("<|calls|>")
	_, flush := eog("<|flush|>")
	call = call || calls
	if end, ok := eog("<|end|>"); ok && call && (ret || flush) {
		delete(t.eog, end)
		t.attrs[end] = attrUserDefined
	}
	_, tool := eog("<|tool_response>")
	_, plamo := eog("<|plamo:eos|>")
	if s, ok := eog("</s>"); ok && (tool || plamo) {
		delete(t.eog, s)
		t.attrs[s] = attrNormal
	}
}

// NVocab is the number of tokens.
func (t *Tokenizer) NVocab() int { return len(t.tokens) }

// Token is the vocabulary text of id ("" when out of range).
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// TokenID looks up a token by its exact vocabulary text.
func (t *Tokenizer) TokenID(text string) (int32, bool) {
	id, ok := t.toID[text]
	return id, ok
}

// BOS is the beginning-of-sequence id (NoToken if none).
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS is the end-of-sequence id (NoToken if none).
func (t *Tokenizer) EOS() int32 { return t.eos }

// EOT is the end-of-turn id (NoToken if none).
func (t *Tokenizer) EOT() int32 { return t.eot }

// AddBOS reports whether Encode with addSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether Encode with addSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether id ends generation: eos, eot, eom and the control
// tokens llama.cpp recognises by text (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).
func (t *Tokenizer) IsEOG(id int32) bool { return id != NoToken && t.eog[id] }

// IsControl reports whether id is a control token.
func (t *Tokenizer) IsControl(id int32) bool {
	return id >= 0 && int(id) < len(t.attrs) && t.attrs[id]&attrControl != 0
}

// Pre is the pre-tokenizer name ("" for SentencePiece).
func (t *Tokenizer) Pre() string { return t.preName }

// Model is "llama" (SentencePiece), "gpt2" (byte-level BPE) or "bert"
// (WordPiece).
func (t *Tokenizer) Model() string {
	if t.spm {
		return ModelSPM
	}
	if t.wpm {
		return ModelWPM
	}
	return ModelBPE
}
