package grammar

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Limits applied to client-supplied grammars so that a hostile grammar cannot
// exhaust memory or CPU.
const (
	// MaxSourceLen is the largest grammar source accepted, in bytes.
	MaxSourceLen = 1 << 20
	// MaxRepeat is the largest bound allowed in {m}, {m,} and {m,n}.
	MaxRepeat = 10000
	// MaxElements caps the compiled size of a grammar (flat elements over all
	// rules, including the helper rules generated for groups, classes and
	// repetitions).
	MaxElements = 1 << 20
	// maxClassWork bounds the work of compiling one character class.
	maxClassWork = 1 << 22
	maxClassSeqs = 1 << 14
	// maxNesting caps parenthesis nesting in the source.
	maxNesting = 256
)

// ParseError is a grammar syntax or semantic error with its 1-based source
// position (column counted in characters).
type ParseError struct {
	Line, Col int
	Msg       string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("grammar: %d:%d: %s", e.Line, e.Col, e.Msg)
}

// irElem is one element of an alternative before flattening: either a byte
// set (index into sets) or a rule reference.
type irElem struct {
	ref   bool
	dfa   bool  // a UTF-8 class automaton state (index into parser.dfa)
	index int32 // set index, DFA state index or rule index
}

// dfaState is one state of a character class's byte automaton.
type dfaState struct {
	set  int32      // bytes allowed here (index into sets)
	next [256]int32 // next state, or -1: the class is complete
}

type irRule struct {
	name     string
	defined  bool
	helper   bool
	off      int // source offset of the definition (or first use for helpers)
	refOff   int // source offset of the first reference (for undefined rules)
	alts     [][]irElem
	nullable bool
}

type parser struct {
	src    string
	pos    int
	depth  int
	rules  []*irRule
	byName map[string]int32
	sets   [][4]uint64
	setIdx map[[4]uint64]int32
	nElems int
	// classCache maps a canonical range list to the helper rule matching it.
	classCache map[string]int32
	dfa        []dfaState
	cur        string // rule being defined (for helper names)
	nHelper    int
}

type bailout struct{ err *ParseError }

func (p *parser) errAt(off int, format string, args ...any) {
	line, col := position(p.src, off)
	panic(bailout{&ParseError{Line: line, Col: col, Msg: fmt.Sprintf(format, args...)}})
}

func position(src string, off int) (line, col int) {
	if off > len(src) {
		off = len(src)
	}
	line, col = 1, 1
	for _, r := range src[:off] {
		if r == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return line, col
}

// Parse compiles a GBNF grammar (llama.cpp dialect) whose start rule is root.
func Parse(src string) (g *Grammar, err error) {
	p := &parser{
		src:        src,
		byName:     map[string]int32{},
		setIdx:     map[[4]uint64]int32{},
		classCache: map[string]int32{},
	}
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bailout)
			if !ok {
				panic(r)
			}
			g, err = nil, b.err
		}
	}()
	if len(src) > MaxSourceLen {
		p.errAt(0, "grammar source too large (%d bytes, limit %d)", len(src), MaxSourceLen)
	}
	if !utf8.ValidString(src) {
		off := 0
		for off < len(src) {
			r, n := utf8.DecodeRuneInString(src[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		p.errAt(off, "invalid UTF-8 in grammar source")
	}
	p.skipSpace()
	for p.pos < len(src) {
		p.parseRule()
		p.skipSpace()
	}
	for _, r := range p.rules {
		if !r.defined {
			p.errAt(r.refOff, "undefined rule %q", r.name)
		}
	}
	root, ok := p.byName["root"]
	if !ok {
		p.errAt(0, "missing root rule (the start rule must be named root)")
	}
	p.checkLeftRecursion()
	return p.link(root), nil
}

func (p *parser) peek() byte {
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; c {
		case ' ', '\t', '\r', '\n':
			p.pos++
		case '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func (p *parser) parseName() string {
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// atRuleStart reports whether the input at p.pos is `name ::=`.
func (p *parser) atRuleStart() bool {
	i := p.pos
	for i < len(p.src) && isNameByte(p.src[i]) {
		i++
	}
	if i == p.pos {
		return false
	}
	for i < len(p.src) && (p.src[i] == ' ' || p.src[i] == '\t') {
		i++
	}
	return strings.HasPrefix(p.src[i:], "::=")
}

func (p *parser) ruleIndex(name string, off int) int32 {
	if i, ok := p.byName[name]; ok {
		return i
	}
	i := int32(len(p.rules))
	p.rules = append(p.rules, &irRule{name: name, refOff: off, off: off})
	p.byName[name] = i
	return i
}

func (p *parser) parseRule() {
	start := p.pos
	name := p.parseName()
	if name == "" {
		p.errAt(p.pos, "expected rule name, found %s", p.describe())
	}
	for p.pos < len(p.src) && (p.src[p.pos] == ' ' || p.src[p.pos] == '\t') {
		p.pos++
	}
	if !strings.HasPrefix(p.src[p.pos:], "::=") {
		p.errAt(p.pos, "expected ::= after rule name %q, found %s", name, p.describe())
	}
	p.pos += 3
	idx := p.ruleIndex(name, start)
	r := p.rules[idx]
	if r.defined {
		l, c := position(p.src, r.off)
		p.errAt(start, "rule %q redefined (first defined at %d:%d)", name, l, c)
	}
	r.defined = true
	r.off = start
	p.cur = name
	alts := p.parseAlts(false)
	if p.peek() == ')' {
		p.errAt(p.pos, "unbalanced ')'")
	}
	r.alts = alts
}

func (p *parser) describe() string {
	if p.pos >= len(p.src) {
		return "end of input"
	}
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return fmt.Sprintf("%q", r)
}

func (p *parser) parseAlts(nested bool) [][]irElem {
	alts := [][]irElem{p.parseSeq(nested)}
	for p.peek() == '|' {
		p.pos++
		alts = append(alts, p.parseSeq(nested))
	}
	return alts
}

func (p *parser) parseSeq(nested bool) []irElem {
	var seq []irElem
	for {
		p.skipSpace()
		c := p.peek()
		if p.pos >= len(p.src) || c == '|' || c == ')' {
			return seq
		}
		if !nested && p.atRuleStart() {
			return seq
		}
		start := p.pos
		item := p.parsePrimary()
		for {
			p.skipSpace()
			switch p.peek() {
			case '*':
				p.pos++
				item = p.repeat(item, 0, -1, start)
				continue
			case '+':
				p.pos++
				item = p.repeat(item, 1, -1, start)
				continue
			case '?':
				p.pos++
				item = p.repeat(item, 0, 1, start)
				continue
			case '{':
				lo, hi := p.parseBounds()
				item = p.repeat(item, lo, hi, start)
				continue
			}
			break
		}
		seq = append(seq, item...)
		p.count(len(item), start)
	}
}

func (p *parser) count(n, off int) {
	p.nElems += n
	if p.nElems > MaxElements {
		p.errAt(off, "grammar too large (more than %d compiled elements)", MaxElements)
	}
}

func (p *parser) parseNumber() (int, bool) {
	start := p.pos
	n := 0
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		if n <= MaxRepeat {
			n = n*10 + int(p.src[p.pos]-'0')
		}
		p.pos++
	}
	if p.pos == start {
		return 0, false
	}
	if n > MaxRepeat {
		p.errAt(start, "repetition bound %s exceeds the limit %d", p.src[start:p.pos], MaxRepeat)
	}
	return n, true
}

// parseBounds parses {m}, {m,}, {m,n} or {,n}; hi is -1 for unbounded.
func (p *parser) parseBounds() (lo, hi int) {
	open := p.pos
	p.pos++ // {
	p.skipSpace()
	lo, okLo := p.parseNumber()
	p.skipSpace()
	if p.peek() == '}' {
		if !okLo {
			p.errAt(open, "empty repetition bounds {}")
		}
		p.pos++
		return lo, lo
	}
	if p.peek() != ',' {
		p.errAt(p.pos, "bad repetition bounds: expected digit, ',' or '}', found %s", p.describe())
	}
	p.pos++
	p.skipSpace()
	hi, okHi := p.parseNumber()
	p.skipSpace()
	if p.peek() != '}' {
		p.errAt(p.pos, "bad repetition bounds: expected '}', found %s", p.describe())
	}
	p.pos++
	if !okLo && !okHi {
		p.errAt(open, "bad repetition bounds {,}")
	}
	if !okHi {
		return lo, -1
	}
	if lo > hi {
		p.errAt(open, "bad repetition bounds: minimum %d exceeds maximum %d", lo, hi)
	}
	return lo, hi
}

func (p *parser) newHelper(off int, alts [][]irElem) int32 {
	p.nHelper++
	i := int32(len(p.rules))
	name := fmt.Sprintf("%s~%d", p.cur, p.nHelper)
	p.rules = append(p.rules, &irRule{name: name, defined: true, helper: true, off: off, alts: alts})
	n := 1
	for _, a := range alts {
		n += len(a) + 1
	}
	p.count(n, off)
	return i
}

// operand turns an item (a sequence of elements) into a single element,
// wrapping it in a helper rule if needed.
func (p *parser) operand(item []irElem, off int) irElem {
	if len(item) == 1 {
		return item[0]
	}
	return irElem{ref: true, index: p.newHelper(off, [][]irElem{item})}
}

// repeat compiles item{lo,hi} (hi -1: unbounded) into a sequence. The result
// has O(lo + (hi-lo)) elements: item is referenced through one element, the
// unbounded tail is a right-recursive helper and the optional tail a chain of
// right-recursive helpers, so nesting repetitions never multiplies sizes.
func (p *parser) repeat(item []irElem, lo, hi int, off int) []irElem {
	op := p.operand(item, off)
	n := lo
	if hi > lo {
		n++
	}
	if hi < 0 {
		n++
	}
	p.count(n+2*max(hi-lo, 0), off)
	out := make([]irElem, 0, n)
	for range lo {
		out = append(out, op)
	}
	switch {
	case hi < 0:
		// star ::= op star | ε
		star := p.newHelper(off, nil)
		p.rules[star].alts = [][]irElem{{op, {ref: true, index: star}}, {}}
		out = append(out, irElem{ref: true, index: star})
	case hi > lo:
		// opt1 ::= op | ε ; optk ::= op opt(k-1) | ε
		prev := p.newHelper(off, [][]irElem{{op}, {}})
		for k := 2; k <= hi-lo; k++ {
			prev = p.newHelper(off, [][]irElem{{op, {ref: true, index: prev}}, {}})
		}
		out = append(out, irElem{ref: true, index: prev})
	}
	return out
}

func (p *parser) parsePrimary() []irElem {
	start := p.pos
	switch c := p.peek(); {
	case c == '"':
		return p.parseLiteral()
	case c == '[':
		return p.parseClass()
	case c == '.':
		p.pos++
		return p.classElems([]cpRange{{0, surrogateLo - 1}, {surrogateHi + 1, utf8.MaxRune}}, start)
	case c == '(':
		p.depth++
		if p.depth > maxNesting {
			p.errAt(start, "parentheses nested too deeply (limit %d)", maxNesting)
		}
		p.pos++
		alts := p.parseAlts(true)
		if p.peek() != ')' {
			p.errAt(start, "unterminated group: missing ')'")
		}
		p.pos++
		p.depth--
		if len(alts) == 1 {
			return alts[0]
		}
		return []irElem{{ref: true, index: p.newHelper(start, alts)}}
	case isNameByte(c):
		name := p.parseName()
		return []irElem{{ref: true, index: p.ruleIndex(name, start)}}
	default:
		p.errAt(start, "unexpected %s", p.describe())
		return nil
	}
}

func (p *parser) setIndex(s [4]uint64) int32 {
	if i, ok := p.setIdx[s]; ok {
		return i
	}
	i := int32(len(p.sets))
	p.sets = append(p.sets, s)
	p.setIdx[s] = i
	return i
}

func byteSetElem(p *parser, lo, hi byte) irElem {
	var s [4]uint64
	for b := int(lo); b <= int(hi); b++ {
		s[b>>6] |= 1 << (b & 63)
	}
	return irElem{index: p.setIndex(s)}
}

// parseChar reads one (possibly escaped) character of a literal or class.
func (p *parser) parseChar(inClass bool) rune {
	start := p.pos
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	p.pos += n
	if r != '\\' {
		return r
	}
	if p.pos >= len(p.src) {
		p.errAt(start, "unterminated escape sequence")
	}
	e := p.src[p.pos]
	p.pos++
	switch e {
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	case '\\', '"', '[', ']', '-', '^', '/', '\'':
		return rune(e)
	case 'x', 'u', 'U':
		digits := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
		var v rune
		for range digits {
			if p.pos >= len(p.src) {
				p.errAt(start, "truncated \\%c escape: want %d hex digits", e, digits)
			}
			h := p.src[p.pos]
			var d rune
			switch {
			case h >= '0' && h <= '9':
				d = rune(h - '0')
			case h >= 'a' && h <= 'f':
				d = rune(h-'a') + 10
			case h >= 'A' && h <= 'F':
				d = rune(h-'A') + 10
			default:
				p.errAt(start, "bad \\%c escape: want %d hex digits", e, digits)
			}
			v = v<<4 | d
			p.pos++
		}
		if v > utf8.MaxRune || (v >= surrogateLo && v <= surrogateHi) {
			p.errAt(start, "escape %s is not a valid Unicode scalar value", p.src[start:p.pos])
		}
		return v
	default:
		p.errAt(start, "unknown escape \\%c", e)
		return 0
	}
}

func (p *parser) parseLiteral() []irElem {
	start := p.pos
	p.pos++ // "
	var out []irElem
	var buf [4]byte
	for {
		if p.pos >= len(p.src) {
			p.errAt(start, "unterminated string literal")
		}
		if p.src[p.pos] == '"' {
			p.pos++
			return out
		}
		r := p.parseChar(false)
		n := utf8.EncodeRune(buf[:], r)
		for _, b := range buf[:n] {
			out = append(out, byteSetElem(p, b, b))
		}
		if len(out) > MaxElements {
			p.errAt(start, "string literal too long")
		}
	}
}

const (
	surrogateLo = 0xD800
	surrogateHi = 0xDFFF
)

type cpRange struct{ lo, hi rune }

// normalize sorts and merges ranges and removes surrogates.
func normalize(rs []cpRange) []cpRange {
	slices.SortFunc(rs, func(a, b cpRange) int { return int(a.lo - b.lo) })
	var out []cpRange
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	// cut out surrogates
	var res []cpRange
	for _, r := range out {
		if r.hi < surrogateLo || r.lo > surrogateHi {
			res = append(res, r)
			continue
		}
		if r.lo < surrogateLo {
			res = append(res, cpRange{r.lo, surrogateLo - 1})
		}
		if r.hi > surrogateHi {
			res = append(res, cpRange{surrogateHi + 1, r.hi})
		}
	}
	return res
}

func complement(rs []cpRange) []cpRange {
	var out []cpRange
	next := rune(0)
	for _, r := range rs {
		if r.lo > next {
			out = append(out, cpRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, cpRange{next, utf8.MaxRune})
	}
	return normalize(out)
}

func (p *parser) parseClass() []irElem {
	start := p.pos
	p.pos++ // [
	negate := false
	if p.peek() == '^' {
		negate = true
		p.pos++
	}
	var rs []cpRange
	for {
		if p.pos >= len(p.src) {
			p.errAt(start, "unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		itemOff := p.pos
		lo := p.parseChar(true)
		hi := lo
		if p.peek() == '-' && p.pos+1 < len(p.src) && p.src[p.pos+1] != ']' {
			p.pos++
			hi = p.parseChar(true)
			if hi < lo {
				p.errAt(itemOff, "bad character range %q-%q: end before start", lo, hi)
			}
		}
		rs = append(rs, cpRange{lo, hi})
		if len(rs) > MaxElements {
			p.errAt(start, "character class too long")
		}
	}
	rs = normalize(rs)
	if negate {
		rs = complement(rs)
	}
	if len(rs) == 0 {
		p.errAt(start, "character class matches no character")
	}
	return p.classElems(rs, start)
}

// classElems compiles a normalised code point set into elements: an ASCII-only
// set is a single byte-set element; otherwise a (cached) helper rule whose
// alternatives are the UTF-8 byte sequences of the set.
func (p *parser) classElems(rs []cpRange, off int) []irElem {
	if rs[len(rs)-1].hi < utf8.RuneSelf {
		var s [4]uint64
		for _, r := range rs {
			for c := r.lo; c <= r.hi; c++ {
				s[c>>6] |= 1 << (c & 63)
			}
		}
		return []irElem{{index: p.setIndex(s)}}
	}
	var key strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&key, "%x-%x,", r.lo, r.hi)
	}
	if i, ok := p.classCache[key.String()]; ok {
		return []irElem{{ref: true, index: i}}
	}
	var seqs [][]byteRange
	for _, r := range rs {
		utf8Sequences(r.lo, r.hi, func(seq []byteRange) {
			if len(seqs) >= maxClassSeqs {
				p.errAt(off, "character class too complex")
			}
			seqs = append(seqs, seq)
		})
	}
	start := p.buildDFA(seqs, off)
	i := p.newHelper(off, [][]irElem{{{dfa: true, index: start}}})
	p.classCache[key.String()] = i
	return []irElem{{ref: true, index: i}}
}

// buildDFA turns the UTF-8 byte-range sequences of a class into a
// deterministic byte automaton (subset construction over sequence
// positions) and returns its start state. One automaton state replaces the
// alternatives a class would otherwise need, so a class is one stack.
func (p *parser) buildDFA(seqs [][]byteRange, off int) int32 {
	type subset struct {
		depth int
		seqs  []int
	}
	ids := map[string]int32{}
	var todo []subset
	keyOf := func(s subset) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%d:", s.depth)
		for _, i := range s.seqs {
			fmt.Fprintf(&b, "%d,", i)
		}
		return b.String()
	}
	get := func(s subset) int32 {
		k := keyOf(s)
		if id, ok := ids[k]; ok {
			return id
		}
		id := int32(len(p.dfa))
		p.dfa = append(p.dfa, dfaState{})
		p.count(1+256/2, off) // a state's table weighs like ~128 elements
		ids[k] = id
		todo = append(todo, s)
		return id
	}
	work := 0
	all := make([]int, len(seqs))
	for i := range all {
		all[i] = i
	}
	start := get(subset{0, all})
	for len(todo) > 0 {
		s := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		id := ids[keyOf(s)]
		var set [4]uint64
		var next [256]int32
		var cont [256][]int
		var done [256]bool
		for _, i := range s.seqs {
			r := seqs[i][s.depth]
			work += int(r.hi-r.lo) + 1
			if work > maxClassWork {
				p.errAt(off, "character class too complex")
			}
			for b := int(r.lo); b <= int(r.hi); b++ {
				set[b>>6] |= 1 << (b & 63)
				if len(seqs[i]) == s.depth+1 {
					done[b] = true
				} else {
					cont[b] = append(cont[b], i)
				}
			}
		}
		for b := range 256 {
			switch {
			case done[b]:
				// UTF-8 sequences sharing a prefix have the same length,
				// so a byte never both completes and continues a class.
				next[b] = -1
			case len(cont[b]) > 0:
				next[b] = get(subset{s.depth + 1, cont[b]})
			}
		}
		p.dfa[id].set = p.setIndex(set)
		p.dfa[id].next = next
	}
	return start
}

type byteRange struct{ lo, hi byte }

// utf8Sequences calls emit with byte-range sequences whose concatenated
// languages are exactly the UTF-8 encodings of the code points in [lo, hi]
// (which must contain no surrogates). Each range is split at encoding-length
// boundaries and then until every continuation byte position spans a full
// aligned block, so each piece is a product of byte ranges.
func utf8Sequences(lo, hi rune, emit func([]byteRange)) {
	for _, b := range [...]rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= b && hi > b {
			utf8Sequences(lo, b, emit)
			utf8Sequences(b+1, hi, emit)
			return
		}
	}
	n := utf8.RuneLen(lo)
	if n == 1 {
		emit([]byteRange{{byte(lo), byte(hi)}})
		return
	}
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				utf8Sequences(lo, lo|m, emit)
				utf8Sequences((lo|m)+1, hi, emit)
				return
			}
			if hi&m != m {
				utf8Sequences(lo, (hi&^m)-1, emit)
				utf8Sequences(hi&^m, hi, emit)
				return
			}
		}
	}
	var a, b [4]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	seq := make([]byteRange, n)
	for k := range n {
		seq[k] = byteRange{a[k], b[k]}
	}
	emit(seq)
}

// checkLeftRecursion computes nullable rules and refuses any rule that can
// reach itself without consuming input (the matcher would loop).
func (p *parser) checkLeftRecursion() {
	p.computeNullable()
	// left-corner graph
	state := make([]uint8, len(p.rules)) // 0 new, 1 on stack, 2 done
	var path []int32
	var visit func(i int32)
	visit = func(i int32) {
		state[i] = 1
		path = append(path, i)
		for _, alt := range p.rules[i].alts {
			for _, e := range alt {
				if !e.ref {
					break
				}
				switch state[e.index] {
				case 1:
					k := slices.Index(path, e.index)
					var names []string
					for _, j := range path[k:] {
						names = append(names, p.ruleLabel(j))
					}
					names = append(names, p.ruleLabel(e.index))
					p.errAt(p.rules[e.index].off, "left recursion: rule %s can reach itself without consuming input (%s)",
						p.ruleLabel(e.index), strings.Join(names, " -> "))
				case 0:
					visit(e.index)
				}
				if !p.rules[e.index].nullable {
					break
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = 2
	}
	for i := range p.rules {
		if state[i] == 0 {
			visit(int32(i))
		}
	}
}

// computeNullable marks the rules that can match the empty string, in time
// linear in the grammar size (worklist over "pending" counts per alternative).
func (p *parser) computeNullable() {
	type use struct{ rule, alt int32 }
	users := make([][]use, len(p.rules))
	pending := make([][]int32, len(p.rules))
	var work []int32
	for i, r := range p.rules {
		pending[i] = make([]int32, len(r.alts))
		for j, alt := range r.alts {
			n := int32(0)
			for _, e := range alt {
				if !e.ref {
					n = -1
					break
				}
				n++
			}
			pending[i][j] = n
			if n == 0 && !r.nullable {
				r.nullable = true
				work = append(work, int32(i))
			}
			if n > 0 {
				for _, e := range alt {
					users[e.index] = append(users[e.index], use{int32(i), int32(j)})
				}
			}
		}
	}
	for len(work) > 0 {
		k := work[len(work)-1]
		work = work[:len(work)-1]
		for _, u := range users[k] {
			pending[u.rule][u.alt]--
			if pending[u.rule][u.alt] == 0 && !p.rules[u.rule].nullable {
				p.rules[u.rule].nullable = true
				work = append(work, u.rule)
			}
		}
	}
}

func (p *parser) ruleLabel(i int32) string {
	r := p.rules[i]
	if !r.helper {
		return r.name
	}
	l, c := position(p.src, r.off)
	return fmt.Sprintf("(expression at %d:%d in %s)", l, c, strings.SplitN(r.name, "~", 2)[0])
}

func (p *parser) seqNullable(alt []irElem) bool {
	for _, e := range alt {
		if !e.ref || !p.rules[e.index].nullable {
			return false
		}
	}
	return true
}
