package tokenizer

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"unicode"

	"github.com/dlclark/regexp2"
)

// Pre-tokenizer regexes, as listed per LLAMA_VOCAB_PRE_TYPE_* in llama.cpp's
// llama-vocab.cpp. They are written in the dialect llama.cpp feeds to its
// unicode_regex_split (std::regex, ECMAScript grammar, after "collapsing"
// \p{..} classes); see compileSplitter for how they are run here.
const (
	patGPT2    = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
	patLlama3  = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patQwen2   = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patBloom   = ` ?[^(\s|.,!?…。，、।۔،)]+`
	patTekken  = `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patGPT4o   = `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patDSV3    = `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patSeedCd  = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+`
	patBailing = `'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`
)

var (
	exprsDefault = []string{`[\p{P}\$\+<=>\^~\|]+`, patGPT2, `\p{N}+`, `[0-9][0-9][0-9]`}
	exprsLlama3  = []string{patLlama3}
	// The letter class is spelled with escapes: several of its code points
	// (U+1F7D, U+1FBE, U+2126, U+212A, ...) are canonical singletons that
	// Unicode normalization of the source would silently change.
	exprsDSLLM = []string{
		`[\r\n]`,
		"\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
		`\s?[!-/:-~！-／：-～‘-‟　-。]+`,
		`\s+$`,
		`[一-龥ࠀ-一가-퟿]+`,
		`\p{N}+`,
	}
	exprsDSCoder = []string{`[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`}
	exprsDSV3    = []string{`\p{N}{1,3}`, `[一-龥぀-ゟ゠-ヿ]+`, patDSV3}
	exprsFalcon  = []string{"[\\p{P}\\$\\+<=>\\^~\\|`]+", patGPT2, `[0-9][0-9][0-9]`}
	exprsStarCdr = []string{`\p{N}`, patGPT2}
	exprsGPT2    = []string{patGPT2}
	exprsQwen2   = []string{patQwen2}
	exprsBloom   = []string{patBloom}
	exprsViking  = []string{patBloom, `\p{N}`}
	exprsTekken  = []string{patTekken}
	exprsChamel  = []string{
		`<sentinel:[0-9]+>`,
		`(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z`,
		`([\t\n]|    |  )`,
		`\p{N}`,
		"[\\p{P}!-/:-@\\[-`{-~]",
		patGPT2,
	}
	exprsGPT4o   = []string{patGPT4o}
	exprsSeedCdr = []string{patSeedCd}
	exprsBailing = []string{patBailing}
)

// preType describes one tokenizer.ggml.pre value: its regexes and the
// vocabulary flags llama.cpp sets alongside it.
type preType struct {
	exprs        []string
	ignoreMerges bool // a pre-token that is itself a token skips the merges
	addBOS       bool // default add_bos
	keepSpaces   bool // clean_spaces = false on detokenize
	noBOS        bool // special_bos_id = NULL by default
}

// preTypes maps tokenizer.ggml.pre names to their definition; several names
// share one pattern list, as in llama.cpp.
var preTypes = map[string]preType{
	"default": {exprs: exprsDefault},

	"llama3":    {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"llama-v3":  {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"llama-bpe": {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"falcon3":   {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"falcon-h1": {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"pixtral":   {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"midm-2.0":  {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"lfm2":      {exprs: exprsLlama3, ignoreMerges: true, addBOS: true},
	"dbrx":      {exprs: exprsLlama3},
	"smaug-bpe": {exprs: exprsLlama3},

	"deepseek-llm":   {exprs: exprsDSLLM, keepSpaces: true},
	"deepseek-coder": {exprs: exprsDSCoder, keepSpaces: true},
	"deepseek-v3":    {exprs: exprsDSV3, keepSpaces: true},
	"hunyuan-dense":  {exprs: exprsDSV3, keepSpaces: true},

	"falcon": {exprs: exprsFalcon},

	"starcoder":  {exprs: exprsStarCdr},
	"refact":     {exprs: exprsStarCdr},
	"command-r":  {exprs: exprsStarCdr, keepSpaces: true},
	"smollm":     {exprs: exprsStarCdr, keepSpaces: true},
	"codeshell":  {exprs: exprsStarCdr},
	"exaone":     {exprs: exprsStarCdr},
	"minerva-7b": {exprs: exprsStarCdr},

	"gpt-2":        {exprs: exprsGPT2},
	"phi-2":        {exprs: exprsGPT2},
	"jina-es":      {exprs: exprsGPT2},
	"jina-de":      {exprs: exprsGPT2},
	"gigachat":     {exprs: exprsGPT2},
	"jina-v1-en":   {exprs: exprsGPT2},
	"jina-v2-es":   {exprs: exprsGPT2},
	"jina-v2-de":   {exprs: exprsGPT2},
	"jina-v2-code": {exprs: exprsGPT2},
	"roberta-bpe":  {exprs: exprsGPT2},
	"mpt":          {exprs: exprsGPT2},
	"olmo":         {exprs: exprsGPT2},
	"gpt-neox":     {exprs: exprsGPT2}, // alias: GPT-NeoX tokenizers use the OLMo/MPT split
	"jais":         {exprs: exprsGPT2},
	"trillion":     {exprs: exprsGPT2, keepSpaces: true},
	"exaone4":      {exprs: exprsGPT2},

	"stablelm2":        {exprs: exprsQwen2},
	"qwen2":            {exprs: exprsQwen2, keepSpaces: true},
	"deepseek-r1-qwen": {exprs: exprsQwen2, keepSpaces: true},
	"megrez":           {exprs: exprsQwen2},
	"hunyuan":          {exprs: exprsQwen2, keepSpaces: true},
	"grok-2":           {exprs: exprsQwen2, keepSpaces: true},

	"poro-chat":    {exprs: exprsBloom, keepSpaces: true},
	"bloom":        {exprs: exprsBloom},
	"gpt3-finnish": {exprs: exprsBloom},

	"chatglm-bpe": {exprs: exprsLlama3, noBOS: true},
	"glm4":        {exprs: exprsLlama3, noBOS: true},

	"viking": {exprs: exprsViking, keepSpaces: true},

	"tekken": {exprs: exprsTekken, keepSpaces: true, ignoreMerges: true, addBOS: true},

	"chameleon": {exprs: exprsChamel, addBOS: true, keepSpaces: true},

	"gpt-4o": {exprs: exprsGPT4o, keepSpaces: true},
	"llama4": {exprs: exprsGPT4o, keepSpaces: true},

	"seed-coder": {exprs: exprsSeedCdr, keepSpaces: true},
	"bailingmoe": {exprs: exprsBailing, keepSpaces: true},
}

// PreTokenizers lists the supported tokenizer.ggml.pre names, sorted.
func PreTokenizers() []string {
	names := make([]string, 0, len(preTypes))
	for n := range preTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// splitKind is how one regex of a pre-tokenizer is evaluated.
type splitKind int

const (
	splitGPT2      splitKind = iota // llama.cpp's hand-written gpt-2 splitter
	splitLlama3                     // llama.cpp's hand-written llama3 splitter
	splitCollapsed                  // regex over category-collapsed text
	splitWide                       // regex over the code points
)

type splitter struct {
	kind splitKind
	re   *regexp2.Regexp
}

// preTokenizer splits text into pre-tokens exactly like llama.cpp's
// unicode_regex_split.
type preTokenizer struct {
	splitters    []splitter
	needCollapse bool
}

var (
	preCacheMu sync.Mutex
	preCache   = map[string]*preTokenizer{}
)

// unicode categories llama.cpp recognises in patterns, with the collapsed
// code point standing for non-ASCII members and the ASCII members.
var ucatNames = []struct {
	name string
	cat  cptFlags
}{
	{`\p{N}`, flagNumber},
	{`\p{L}`, flagLetter},
	{`\p{P}`, flagPunct},
	{`\p{M}`, flagMark},
	{`\p{S}`, flagSymbol},
	{`\p{Lu}`, flagLetter},
	{`\p{Ll}`, flagLetter},
	{`\p{Lt}`, flagLetter},
	{`\p{Lm}`, flagLetter},
	{`\p{Lo}`, flagLetter},
}

func ucatRune(c cptFlags) rune {
	switch c {
	case flagNumber:
		return 0xD1
	case flagLetter:
		return 0xD2
	case flagPunct:
		return 0xD3
	case flagMark:
		return 0xD4
	case flagSymbol:
		return 0xD5
	}
	return 0xD0
}

// ASCII members of each collapsed category, as llama.cpp's k_ucat_map
// (note: '~' is not in its symbol set).
func ucatASCII(c cptFlags) string {
	switch c {
	case flagNumber:
		return `0-9`
	case flagLetter:
		return `A-Za-z`
	case flagPunct:
		return `!-#%-*,-/:-;?-@\[-\]_\{\}`
	case flagSymbol:
		return `\$\+<->\^` + "`" + `\|`
	}
	return ""
}

func usesUcat(expr string) bool {
	for _, u := range ucatNames {
		if strings.Contains(expr, u.name) {
			return true
		}
	}
	return false
}

// collapseRegex rewrites \p{..} classes to the collapsed representation,
// following llama.cpp's unicode_regex_split.
func collapseRegex(expr string) (string, error) {
	for _, r := range expr {
		if r >= 128 {
			return "", fmt.Errorf("regex %q mixes unicode categories and non-ASCII characters", expr)
		}
	}
	var b strings.Builder
	inside := false
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		if c == '[' && (i == 0 || expr[i-1] != '\\') {
			b.WriteByte('[')
			inside = true
			continue
		}
		if inside && c == ']' && expr[i-1] != '\\' {
			b.WriteByte(']')
			inside = false
			continue
		}
		if c == '\\' && i+3 < len(expr) && expr[i+1] == 'p' && expr[i+2] == '{' {
			if cl := strings.IndexByte(expr[i+3:], '}'); cl >= 0 && i+3+cl <= i+10 {
				end := i + 3 + cl
				pat := expr[i : end+1]
				found := false
				for _, u := range ucatNames {
					if u.name == pat {
						if !inside {
							b.WriteByte('[')
						}
						b.WriteRune(ucatRune(u.cat))
						b.WriteString(ucatASCII(u.cat))
						if !inside {
							b.WriteByte(']')
						}
						found = true
						break
					}
				}
				if found {
					i = end
					continue
				}
			}
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

// Character classes of std::regex's ECMAScript grammar in the "C" locale.
const (
	ecmaSpace = `\t\n\x0B\f\r\x20`
	ecmaDigit = `0-9`
	ecmaWord  = `A-Za-z0-9_`
)

// ecmaRewrite turns an ECMAScript-grammar pattern into an equivalent
// regexp2 pattern: \s, \d, \w get their ASCII-only meaning and $ anchors at
// the very end of the input only.
func ecmaRewrite(expr string) (string, error) {
	var b strings.Builder
	rs := []rune(expr)
	inClass := false
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		if c == '\\' && i+1 < len(rs) {
			n := rs[i+1]
			i++
			var set string
			neg := false
			switch n {
			case 's', 'S':
				set, neg = ecmaSpace, n == 'S'
			case 'd', 'D':
				set, neg = ecmaDigit, n == 'D'
			case 'w', 'W':
				set, neg = ecmaWord, n == 'W'
			case 'b', 'B':
				return "", fmt.Errorf("regex %q: word boundaries are not supported", expr)
			default:
				b.WriteRune('\\')
				b.WriteRune(n)
				continue
			}
			switch {
			case inClass && neg:
				return "", fmt.Errorf("regex %q: negated class escape inside a class is not supported", expr)
			case inClass:
				b.WriteString(set)
			case neg:
				b.WriteString("[^" + set + "]")
			default:
				b.WriteString("[" + set + "]")
			}
			continue
		}
		switch {
		case c == '[' && !inClass:
			inClass = true
			b.WriteRune(c)
			// a leading ']' (or '^]') is a literal in ECMAScript only when
			// escaped, so nothing special to do here.
		case c == ']' && inClass:
			inClass = false
			b.WriteRune(c)
		case c == '$' && !inClass:
			b.WriteString(`\z`)
		default:
			b.WriteRune(c)
		}
	}
	return b.String(), nil
}

func compilePre(exprs []string) (*preTokenizer, error) {
	key := strings.Join(exprs, "\x00")
	preCacheMu.Lock()
	defer preCacheMu.Unlock()
	if p, ok := preCache[key]; ok {
		return p, nil
	}
	p := &preTokenizer{}
	for _, e := range exprs {
		switch e {
		case patGPT2:
			p.splitters = append(p.splitters, splitter{kind: splitGPT2})
			continue
		case patLlama3, `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:
			p.splitters = append(p.splitters, splitter{kind: splitLlama3})
			continue
		}
		kind := splitWide
		src := e
		if usesUcat(e) {
			kind = splitCollapsed
			p.needCollapse = true
			var err error
			if src, err = collapseRegex(e); err != nil {
				return nil, err
			}
		}
		src, err := ecmaRewrite(src)
		if err != nil {
			return nil, err
		}
		re, err := regexp2.Compile(src, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: compiling pre-tokenizer regex %q: %w", e, err)
		}
		p.splitters = append(p.splitters, splitter{kind: kind, re: re})
	}
	preCache[key] = p
	return p, nil
}

// split returns the pre-tokens of text as code point slices of cpts.
func (p *preTokenizer) split(cpts []rune) [][]rune {
	offsets := []int{len(cpts)}
	if len(cpts) == 0 {
		offsets = offsets[:0]
	}
	var collapsed, wide []rune
	for _, s := range p.splitters {
		switch s.kind {
		case splitGPT2:
			offsets = splitCustomGPT2(cpts, offsets)
		case splitLlama3:
			offsets = splitCustomLlama3(cpts, offsets)
		case splitCollapsed:
			if collapsed == nil {
				collapsed = collapseText(cpts)
			}
			offsets = splitRegex(s.re, collapsed, offsets)
		case splitWide:
			if wide == nil {
				wide = make([]rune, len(cpts))
				for i, r := range cpts {
					if r > 0x7F && flagsOf(r).is(flagWhitespace) {
						r = 0x0B
					}
					wide[i] = r
				}
			}
			offsets = splitRegex(s.re, wide, offsets)
		}
	}
	words := make([][]rune, 0, len(offsets))
	start := 0
	for _, n := range offsets {
		words = append(words, cpts[start:start+n])
		start += n
	}
	return words
}

// collapseText maps every non-ASCII code point to a single stand-in for its
// category (whitespace to \v), as llama.cpp does before running std::regex.
func collapseText(cpts []rune) []rune {
	out := make([]rune, len(cpts))
	for i, r := range cpts {
		if r < 128 {
			out[i] = r
			continue
		}
		f := flagsOf(r)
		if f.is(flagWhitespace) {
			out[i] = 0x0B
			continue
		}
		out[i] = ucatRune(f.category())
	}
	return out
}

// splitRegex splits each fragment into the regex's matches and the gaps
// between them.
func splitRegex(re *regexp2.Regexp, text []rune, offsets []int) []int {
	out := make([]int, 0, len(offsets))
	start := 0
	for _, n := range offsets {
		frag := text[start : start+n]
		prev := 0
		m, err := re.FindRunesMatch(frag)
		for err == nil && m != nil {
			idx, l := m.Index, m.Length
			if idx > prev {
				out = append(out, idx-prev)
			}
			if l > 0 {
				out = append(out, l)
			}
			prev = idx + l
			m, err = re.FindNextMatch(m)
		}
		if prev < n {
			out = append(out, n-prev)
		}
		start += n
	}
	return out
}

const outOfRange = -1

// cutter walks one fragment [ini,end) of the code points cpts that a
// custom splitter cuts into pieces, appending their lengths to out; the
// current piece starts at cut.
type cutter struct {
	cpts          []rune
	ini, end, cut int
	out           []int
}

// splitFragments runs split over every fragment of offsets and returns
// the lengths of the pieces.
func splitFragments(cpts []rune, offsets []int, split func(f *cutter)) []int {
	f := cutter{cpts: cpts, out: make([]int, 0, len(offsets))}
	for _, n := range offsets {
		f.ini, f.end = f.end, f.end+n
		f.cut = f.ini
		split(&f)
	}
	return f.out
}

func (f *cutter) get(pos int) rune {
	if pos >= f.ini && pos < f.end {
		return f.cpts[pos]
	}
	return outOfRange
}

func (f *cutter) flags(pos int) cptFlags {
	if pos >= f.ini && pos < f.end {
		return flagsOf(f.cpts[pos])
	}
	return 0
}

// add ends the current piece at e and returns its length.
func (f *cutter) add(e int) int {
	l := e - f.cut
	if l > 0 {
		f.out = append(f.out, l)
	}
	f.cut = e
	return l
}

// contraction is the length of the contraction ('s 't 're 've 'm 'll 'd)
// at pos, its letters mapped through fold first; 0 if there is none.
func (f *cutter) contraction(pos int, fold func(rune) rune) int {
	if f.get(pos) != '\'' || pos+1 >= f.end {
		return 0
	}
	nx := fold(f.get(pos + 1))
	if nx == 's' || nx == 't' || nx == 'm' || nx == 'd' {
		return 2
	}
	if pos+2 < f.end {
		nn := fold(f.get(pos + 2))
		if (nx == 'r' && nn == 'e') || (nx == 'v' && nn == 'e') || (nx == 'l' && nn == 'l') {
			return 3
		}
	}
	return 0
}

// spaces cuts at pos what \s+(?!\S)|\s+ matches (all but the last of
// several spaces followed by a non-space, else the whole run), or the one
// code point at pos when it is not a space, and returns the position after
// the piece.
func (f *cutter) spaces(pos int) int {
	nws := 0
	for f.flags(pos + nws).is(flagWhitespace) {
		nws++
	}
	switch {
	case nws > 1 && f.get(pos+nws) != outOfRange:
		pos += nws - 1
	case nws > 0:
		pos += nws
	default:
		pos++
	}
	f.add(pos)
	return pos
}

func sameCpt(r rune) rune { return r }

// splitCustomGPT2 is llama.cpp's unicode_regex_split_custom_gpt2:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitCustomGPT2(cpts []rune, offsets []int) []int {
	return splitFragments(cpts, offsets, func(f *cutter) {
		for pos := f.ini; pos < f.end; {
			if n := f.contraction(pos, sameCpt); n > 0 {
				pos += f.add(pos + n)
				continue
			}
			f2 := f.flags(pos)
			sp := 0
			if f.get(pos) == ' ' {
				f2 = f.flags(pos + 1)
				sp = 1
			}
			var in func(cptFlags) bool
			switch {
			case f2.is(flagLetter):
				in = func(c cptFlags) bool { return c.is(flagLetter) }
			case f2.is(flagNumber):
				in = func(c cptFlags) bool { return c.is(flagNumber) }
			case !f2.is(flagWhitespace|flagLetter|flagNumber) && f2 != 0:
				in = func(c cptFlags) bool { return !c.is(flagWhitespace|flagLetter|flagNumber) && c != 0 }
			default:
				pos = f.spaces(pos)
				continue
			}
			pos += sp
			for in(f2) {
				pos++
				f2 = f.flags(pos)
			}
			f.add(pos)
		}
	})
}

func lowerCpt(r rune) rune {
	if r >= 'A' && r <= 'Z' {
		return r + 'a' - 'A'
	}
	if r < 128 {
		return r
	}
	return unicode.ToLower(r)
}

// splitCustomLlama3 is llama.cpp's unicode_regex_split_custom_llama3:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitCustomLlama3(cpts []rune, offsets []int) []int {
	return splitFragments(cpts, offsets, func(f *cutter) {
		for pos := f.ini; pos < f.end; {
			cpt := f.get(pos)
			fl := f.flags(pos)
			if n := f.contraction(pos, lowerCpt); n > 0 {
				pos += f.add(pos + n)
				continue
			}
			// [^\r\n\p{L}\p{N}]?\p{L}+
			if !(cpt == '\r' || cpt == '\n' || fl.is(flagNumber)) {
				if fl.is(flagLetter) || f.flags(pos+1).is(flagLetter) {
					pos++
					for f.flags(pos).is(flagLetter) {
						pos++
					}
					f.add(pos)
					continue
				}
			}
			// \p{N}{1,3}
			if fl.is(flagNumber) {
				i0 := pos
				for f.flags(pos).is(flagNumber) {
					pos++
					if pos-i0 >= 3 {
						f.add(pos)
						i0 = pos
					}
				}
				f.add(pos)
				continue
			}
			// <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the first
			// code point's own flags for "is assigned")
			f2 := fl
			sp := 0
			if cpt == ' ' {
				f2 = f.flags(pos + 1)
				sp = 1
			}
			if !f2.is(flagWhitespace|flagLetter|flagNumber) && fl != 0 {
				pos += sp
				for !f2.is(flagWhitespace|flagLetter|flagNumber) && f2 != 0 {
					pos++
					f2 = f.flags(pos)
				}
				for c2 := f.get(pos); c2 == '\r' || c2 == '\n'; c2 = f.get(pos) {
					pos++
				}
				f.add(pos)
				continue
			}
			// \s*[\r\n]+
			lastRN := 0
			for nws := 0; f.flags(pos + nws).is(flagWhitespace); nws++ {
				if c2 := f.get(pos + nws); c2 == '\r' || c2 == '\n' {
					lastRN = pos + nws + 1
				}
			}
			if lastRN > 0 {
				pos = lastRN
				f.add(pos)
				continue
			}
			pos = f.spaces(pos)
		}
	})
}
