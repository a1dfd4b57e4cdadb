package jsonschema

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A regular-expression subset is translated into GBNF over the JSON
// encoding of the string: characters a JSON string cannot hold raw (the
// quote, the backslash, control characters) are emitted as JSON escapes.
// Where ECMA-262 and RE2 (Go) disagree on a class (\s, \S, .), the
// intersection is used, so every generated string matches under both.

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

type runeSet []runeRange // sorted, non-overlapping, non-adjacent

func normalize(rs []runeRange) runeSet {
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var out runeSet
	for _, r := range rs {
		if r.lo > r.hi {
			continue
		}
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			if r.hi > out[n-1].hi {
				out[n-1].hi = r.hi
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// complement is the set of Unicode scalar values not in s.
func (s runeSet) complement() runeSet {
	var out []runeRange
	next := rune(0)
	for _, r := range s {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, runeRange{next, utf8.MaxRune})
	}
	return runeSet(out).minus(runeSet{{0xD800, 0xDFFF}})
}

func (s runeSet) minus(t runeSet) runeSet {
	return s.intersect(t.complementRaw())
}

// complementRaw is the complement over [0, MaxRune].
func (s runeSet) complementRaw() runeSet {
	var out runeSet
	next := rune(0)
	for _, r := range s {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, runeRange{next, utf8.MaxRune})
	}
	return out
}

func (s runeSet) intersect(t runeSet) runeSet {
	var out []runeRange
	for _, a := range s {
		for _, b := range t {
			lo, hi := max(a.lo, b.lo), min(a.hi, b.hi)
			if lo <= hi {
				out = append(out, runeRange{lo, hi})
			}
		}
	}
	return normalize(out)
}

func (s runeSet) has(r rune) bool {
	for _, x := range s {
		if r >= x.lo && r <= x.hi {
			return true
		}
	}
	return false
}

var (
	setDigit = runeSet{{'0', '9'}}
	setWord  = normalize([]runeRange{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}})
	// \s: RE2's set (a subset of ECMA-262's).
	setSpaceRE2 = normalize([]runeRange{{'\t', '\n'}, {'\f', '\r'}, {' ', ' '}})
	// ECMA-262 white space and line terminators (a superset of RE2's).
	setSpaceECMA = normalize([]runeRange{{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680},
		{0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}})
	// '.': anything but line terminators (ECMA-262), which excludes RE2's "\n".
	setDot = runeSet{{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}.complement()
)

// specials must be JSON-escaped inside a string.
var specials = normalize([]runeRange{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}})

// setExpr renders a set of code points as one GBNF term over JSON string
// text.
func setExpr(s runeSet) string {
	raw := s.minus(specials)
	var alts []string
	if len(raw) == 1 && raw[0].lo == raw[0].hi {
		alts = append(alts, quote(string(raw[0].lo)))
	} else if len(raw) > 0 {
		var b strings.Builder
		b.WriteByte('[')
		for _, r := range raw {
			b.WriteString(classChar(r.lo))
			if r.hi > r.lo {
				b.WriteByte('-')
				b.WriteString(classChar(r.hi))
			}
		}
		b.WriteByte(']')
		alts = append(alts, b.String())
	}
	// Control characters: the short escape where JSON has one, and the
	// \u00XX form (either case of hex digits).
	ctl := s.intersect(runeSet{{0, 0x1F}})
	if len(ctl) == 1 && ctl[0] == (runeRange{0, 0x1F}) {
		alts = append(alts, `"\\u00" [01] [0-9a-fA-F]`)
		ctl = nil
	}
	for _, r := range ctl {
		for c := r.lo; c <= r.hi; c++ {
			alts = append(alts, uEscape(c))
		}
	}
	for _, c := range []rune{'\b', '\t', '\n', '\f', '\r', '"', '\\'} {
		if s.has(c) {
			alts = append(alts, quote(`\`+string("btnfr\"\\"[strings.IndexRune("\b\t\n\f\r\"\\", c)])))
		}
	}
	if s.has(0x7F) {
		alts = append(alts, uEscape(0x7F))
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return "( " + strings.Join(alts, " | ") + " )"
}

// uEscape is the GBNF term for the JSON escape \u00XX of c (c < 0x80),
// accepting either case of hex digits.
func uEscape(c rune) string {
	h := fmt.Sprintf("%02x", c)
	e := `"\\u00` + h[:1] + `"`
	if h[1] >= 'a' {
		return e + " [" + h[1:] + strings.ToUpper(h[1:]) + "]"
	}
	return `"\\u00` + h + `"`
}

// classChar writes a code point inside a GBNF character class.
func classChar(r rune) string {
	switch r {
	case ']', '[', '\\', '-', '^':
		return `\` + string(r)
	}
	if r < 0x20 || r == 0x7F {
		return fmt.Sprintf(`\x%02X`, r)
	}
	return string(r)
}

type rxParser struct {
	src []rune
	i   int
	ptr string
}

func (p *rxParser) err(msg string) error {
	return fmt.Errorf("jsonschema: \"pattern\" at %s is not supported: %s", ptrOrRoot(p.ptr), msg)
}

func (p *rxParser) peek() (rune, bool) {
	if p.i < len(p.src) {
		return p.src[p.i], true
	}
	return 0, false
}

func (c *conv) genPattern(pat, ptr string) (string, error) {
	if !utf8.ValidString(pat) {
		return "", invalid(ptr+"/pattern", "pattern is not valid UTF-8")
	}
	p := &rxParser{src: []rune(pat), ptr: ptr + "/pattern"}
	anchoredStart := len(p.src) > 0 && p.src[0] == '^'
	if anchoredStart {
		p.i++
	}
	anchoredEnd := false
	if n := len(p.src); n > p.i && p.src[n-1] == '$' {
		bs := 0 // backslashes before the '$'
		for j := n - 2; j >= p.i && p.src[j] == '\\'; j-- {
			bs++
		}
		if bs%2 == 0 {
			anchoredEnd = true
			p.src = p.src[:n-1]
		}
	}
	expr, _, err := p.parseAlt(0)
	if err != nil {
		return "", err
	}
	if p.i != len(p.src) {
		return "", p.err(fmt.Sprintf("unexpected %q", p.src[p.i]))
	}
	parts := []string{`"\""`}
	if !anchoredStart {
		parts = append(parts, c.prim("char")+"*")
	}
	if expr != "" {
		parts = append(parts, "( "+expr+" )")
	}
	if !anchoredEnd {
		parts = append(parts, c.prim("char")+"*")
	}
	parts = append(parts, `"\""`)
	return c.rule(hintFor(ptr, "pattern"), seq(parts...))
}

// parseAlt parses alternatives; it returns the expression (possibly with
// top-level "|") and whether it matches the empty string.
func (p *rxParser) parseAlt(depth int) (string, bool, error) {
	if depth > 32 {
		return "", false, p.err("groups nested too deep")
	}
	var alts []string
	nullable := false
	for {
		e, n, err := p.parseSeq(depth)
		if err != nil {
			return "", false, err
		}
		if e == "" {
			e = `""`
		}
		alts = append(alts, e)
		nullable = nullable || n
		r, ok := p.peek()
		if !ok || r != '|' {
			break
		}
		p.i++
	}
	if len(alts) == 1 && alts[0] == `""` {
		return "", true, nil
	}
	return strings.Join(alts, " | "), nullable, nil
}

func (p *rxParser) parseSeq(depth int) (string, bool, error) {
	var parts []string
	nullable := true
	for {
		r, ok := p.peek()
		if !ok || r == '|' || r == ')' {
			break
		}
		atom, n, err := p.parseAtom(depth)
		if err != nil {
			return "", false, err
		}
		atom, n, err = p.parseQuant(atom, n)
		if err != nil {
			return "", false, err
		}
		if atom != "" {
			parts = append(parts, atom)
		}
		nullable = nullable && n
	}
	return strings.Join(parts, " "), nullable, nil
}

func (p *rxParser) parseAtom(depth int) (string, bool, error) {
	r := p.src[p.i]
	p.i++
	switch r {
	case '(':
		if r2, ok := p.peek(); ok && r2 == '?' {
			if p.i+1 < len(p.src) && p.src[p.i+1] == ':' {
				p.i += 2
			} else {
				return "", false, p.err("lookaround and named groups")
			}
		}
		e, n, err := p.parseAlt(depth + 1)
		if err != nil {
			return "", false, err
		}
		if r2, ok := p.peek(); !ok || r2 != ')' {
			return "", false, p.err("missing )")
		}
		p.i++
		if e == "" {
			return "", true, nil
		}
		return "( " + e + " )", n, nil
	case ')':
		return "", false, p.err("unbalanced )")
	case '[':
		s, err := p.parseClass()
		if err != nil {
			return "", false, err
		}
		if len(s) == 0 {
			return "", false, p.err("empty character class")
		}
		return setExpr(s), false, nil
	case '.':
		return setExpr(setDot), false, nil
	case '^', '$':
		return "", false, p.err("anchors inside the pattern")
	case '*', '+', '?', '{':
		if r == '{' && !p.looksLikeQuant(p.i) {
			return setExpr(runeSet{{r, r}}), false, nil
		}
		return "", false, p.err("quantifier without operand")
	case '\\':
		s, err := p.parseEscape(false)
		if err != nil {
			return "", false, err
		}
		return setExpr(s), false, nil
	}
	return setExpr(runeSet{{r, r}}), false, nil
}

// looksLikeQuant reports whether the text after a '{' is a {n}, {n,} or
// {n,m} quantifier.
func (p *rxParser) looksLikeQuant(j int) bool {
	digits := 0
	for j < len(p.src) && p.src[j] >= '0' && p.src[j] <= '9' {
		j++
		digits++
	}
	if digits == 0 || j >= len(p.src) {
		return false
	}
	if p.src[j] == '}' {
		return true
	}
	if p.src[j] != ',' {
		return false
	}
	j++
	for j < len(p.src) && p.src[j] >= '0' && p.src[j] <= '9' {
		j++
	}
	return j < len(p.src) && p.src[j] == '}'
}

func (p *rxParser) parseQuant(atom string, nullable bool) (string, bool, error) {
	r, ok := p.peek()
	if !ok {
		return atom, nullable, nil
	}
	lo, hi := 1, 1
	switch r {
	case '*':
		lo, hi = 0, -1
		p.i++
	case '+':
		lo, hi = 1, -1
		p.i++
	case '?':
		lo, hi = 0, 1
		p.i++
	case '{':
		if !p.looksLikeQuant(p.i + 1) {
			return atom, nullable, nil
		}
		p.i++
		num := func() (int, error) {
			j := p.i
			for p.i < len(p.src) && p.src[p.i] >= '0' && p.src[p.i] <= '9' {
				p.i++
			}
			n, err := strconv.Atoi(string(p.src[j:p.i]))
			if err != nil || n > maxRepeat {
				return 0, p.err(fmt.Sprintf("repetition count above %d", maxRepeat))
			}
			return n, nil
		}
		var err error
		if lo, err = num(); err != nil {
			return "", false, err
		}
		hi = lo
		if p.src[p.i] == ',' {
			p.i++
			if p.src[p.i] == '}' {
				hi = -1
			} else if hi, err = num(); err != nil {
				return "", false, err
			}
		}
		p.i++ // '}'
		if hi >= 0 && hi < lo {
			return "", false, p.err("repetition {n,m} with m < n")
		}
	default:
		return atom, nullable, nil
	}
	if r2, ok := p.peek(); ok && r2 == '?' { // lazy: same language
		p.i++
	}
	if r2, ok := p.peek(); ok && (r2 == '*' || r2 == '+' || r2 == '?' || r2 == '{' && p.looksLikeQuant(p.i+1)) {
		return "", false, p.err("nested quantifiers")
	}
	if atom == "" {
		return "", true, nil
	}
	if nullable && hi < 0 {
		return "", false, p.err("unbounded repetition of an expression that matches the empty string")
	}
	return rep(atom, lo, hi), nullable || lo == 0, nil
}

// parseEscape parses the escape after a backslash.
func (p *rxParser) parseEscape(inClass bool) (runeSet, error) {
	r, ok := p.peek()
	if !ok {
		return nil, p.err("trailing backslash")
	}
	p.i++
	one := func(c rune) runeSet { return runeSet{{c, c}} }
	switch r {
	case 'd':
		return setDigit, nil
	case 'D':
		return setDigit.complement(), nil
	case 'w':
		return setWord, nil
	case 'W':
		return setWord.complement(), nil
	case 's':
		return setSpaceRE2, nil
	case 'S':
		return setSpaceECMA.complement(), nil
	case 'n':
		return one('\n'), nil
	case 't':
		return one('\t'), nil
	case 'r':
		return one('\r'), nil
	case 'f':
		return one('\f'), nil
	case 'v':
		return one('\v'), nil
	case 'x', 'u':
		n := 2
		if r == 'u' {
			n = 4
		}
		if p.i+n > len(p.src) {
			return nil, p.err("short \\" + string(r) + " escape")
		}
		v, err := strconv.ParseUint(string(p.src[p.i:p.i+n]), 16, 32)
		if err != nil {
			return nil, p.err("bad \\" + string(r) + " escape")
		}
		p.i += n
		if v >= 0xD800 && v <= 0xDFFF {
			return nil, p.err("surrogate escapes")
		}
		return one(rune(v)), nil
	}
	if r < 0x80 && !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
		return one(r), nil // escaped punctuation
	}
	return nil, p.err("escape \\" + string(r))
}

// parseClass parses a character class after '['.
func (p *rxParser) parseClass() (runeSet, error) {
	negate := false
	if r, ok := p.peek(); ok && r == '^' {
		negate = true
		p.i++
	}
	var rs []runeRange
	first := true
	for {
		r, ok := p.peek()
		if !ok {
			return nil, p.err("missing ]")
		}
		if r == ']' && !first {
			p.i++
			break
		}
		if r == ']' {
			return nil, p.err("empty class []")
		}
		first = false
		lo, single, err := p.classAtom()
		if err != nil {
			return nil, err
		}
		if !single {
			rs = append(rs, lo...)
			continue
		}
		if r2, ok := p.peek(); ok && r2 == '-' && p.i+1 < len(p.src) && p.src[p.i+1] != ']' {
			p.i++
			hi, single2, err := p.classAtom()
			if err != nil {
				return nil, err
			}
			if !single2 || hi[0].lo < lo[0].lo {
				return nil, p.err("bad class range")
			}
			rs = append(rs, runeRange{lo[0].lo, hi[0].lo})
			continue
		}
		rs = append(rs, lo...)
	}
	s := normalize(rs)
	if negate {
		s = s.complement()
	} else {
		s = s.minus(runeSet{{0xD800, 0xDFFF}})
	}
	return s, nil
}

// classAtom parses one class member: a character (single) or a class
// escape such as \d.
func (p *rxParser) classAtom() (runeSet, bool, error) {
	r := p.src[p.i]
	p.i++
	if r == '[' && p.i < len(p.src) && p.src[p.i] == ':' {
		return nil, false, p.err("POSIX classes")
	}
	if r != '\\' {
		return runeSet{{r, r}}, true, nil
	}
	if r2, ok := p.peek(); ok && r2 == 'b' {
		p.i++
		return runeSet{{'\b', '\b'}}, true, nil
	}
	s, err := p.parseEscape(true)
	if err != nil {
		return nil, false, err
	}
	single := len(s) == 1 && s[0].lo == s[0].hi
	return s, single, nil
}
