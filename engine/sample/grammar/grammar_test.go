package grammar_test

import (
	"errors"
	"strings"
	"testing"

	"shoal/engine/sample/grammar"
)

var jsonGrammar = grammar.JSONGrammarForTest

func mustParse(t testing.TB, src string) *grammar.Grammar {
	t.Helper()
	g, err := grammar.Parse(src)
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return g
}

func matches(g *grammar.Grammar, s string) bool {
	m := g.NewMatcher()
	return m.AcceptBytes([]byte(s)) && m.CanEnd()
}

func TestAcceptRefuse(t *testing.T) {
	cases := []struct {
		name    string
		grammar string
		accept  []string
		refuse  []string
	}{
		{"literal", `root ::= "hello"`, []string{"hello"}, []string{"", "hell", "hello!", "Hello"}},
		{"escapes", `root ::= "a\n\t\r\\\"\x41\u00e9\U0001F600"`, []string{"a\n\t\r\\\"A\u00e9\U0001F600"}, []string{"a"}},
		{"empty literal", `root ::= "" "x" ""`, []string{"x"}, []string{""}},
		{"class", `root ::= [a-c0-9_]`, []string{"a", "b", "c", "0", "9", "_"}, []string{"d", "", "ab", "-"}},
		{"class dash at end", `root ::= [a-]+`, []string{"a", "-", "a-a"}, []string{"b"}},
		{"class escapes", `root ::= [\]\[\\\-]+`, []string{"]", "[", "\\", "-", "][\\-"}, []string{"a"}},
		{"negated class", `root ::= [^"\\]*`, []string{"", "abc", "é", "日本", "\U0001F600", "\n"}, []string{"\"", "\\", "a\"b"}},
		{"negated ascii excludes", `root ::= [^a-z]`, []string{"A", "é", "\x7f", "\u07ff", "\u0800", "\uffff", "\U00010000", "\U0010FFFF"}, []string{"a", "z", "", "\xed\xa0\x80", "\xc0\x80", "\xf4\x90\x80\x80"}},
		{"greek range", `root ::= [α-ω]+`, []string{"α", "ω", "λμ", "αβγδεζηθικλμνξοπρστυφχψω"}, []string{"Α", "a", "", "\xce"}},
		{"mixed range", `root ::= [a-zα-ω\u4e00-\u9fff]*`, []string{"aβ中", "", "z\u9fff"}, []string{"A", "\u4dff"}},
		{"dot", `root ::= ...`, []string{"abc", "aé日", "\U0001F600\U0010FFFF\x00"}, []string{"ab", "abcd", "\xff\xfe\xfd", "\xed\xa0\x80ab", "\xc1\xbfab"}},
		{"dot 4 byte", `root ::= .`, []string{"\U00010000", "\U0010FFFF", "\u0080", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff"}, []string{"\xf4\x90\x80\x80", "\xf0\x8f\xbf\xbf", "\xe0\x9f\xbf", "\xed\xbf\xbf", "\x80", ""}},
		{"star", `root ::= "a"*`, []string{"", "a", "aaaa"}, []string{"b", "ab"}},
		{"plus", `root ::= "ab"+`, []string{"ab", "abab"}, []string{"", "a", "aba"}},
		{"optional", `root ::= "a"? "b"`, []string{"b", "ab"}, []string{"a", "aab", ""}},
		{"exact", `root ::= "a"{3}`, []string{"aaa"}, []string{"aa", "aaaa"}},
		{"zero", `root ::= "x" "a"{0} "y"`, []string{"xy"}, []string{"xay"}},
		{"0 to 3", `root ::= "a"{0,3}`, []string{"", "a", "aa", "aaa"}, []string{"aaaa"}},
		{"at least 2", `root ::= "a"{2,}`, []string{"aa", "aaa", strings.Repeat("a", 100)}, []string{"", "a"}},
		{"upto", `root ::= "a"{,2} "b"`, []string{"b", "ab", "aab"}, []string{"aaab"}},
		{"bounded range", `root ::= [0-9]{2,4}`, []string{"12", "123", "1234"}, []string{"1", "12345"}},
		{"nested groups", `root ::= ("a" ("b" | "c")*){1,2} "d"?`, []string{"a", "abcb", "abac", "acd", "aad"}, []string{"", "b", "aaa", "ad d"}},
		{"nested repetition", `root ::= (("ab"){2}){2}`, []string{"abababab"}, []string{"ababab"}},
		{"alternation", `root ::= "cat" | "car" | "dog"`, []string{"cat", "car", "dog"}, []string{"ca", "cow"}},
		{"balanced parens", `root ::= p
p ::= ("(" p ")")*`, []string{"", "()", "(())", "()()", "(()())"}, []string{"(", ")", "(()", "())"}},
		{"recursion", `root ::= expr
expr ::= term ("+" term)*
term ::= [0-9]+ | "(" expr ")"`, []string{"1", "1+2", "(1+2)+3", "((4))"}, []string{"1+", "(1", "+1"}},
		{"multiline continuation", "root ::= \"a\"\n  \"b\"\n  | \"c\"\nx ::= \"y\"", []string{"ab", "c"}, []string{"a", "y"}},
		{"comments", "# hi\nroot ::= \"a\" # trailing\n # more\n | \"b\"", []string{"a", "b"}, []string{"#"}},
		{"forward reference", `root ::= x x
x ::= "q"`, []string{"qq"}, []string{"q"}},
		{"empty alternative", `root ::= "a" | `, []string{"a", ""}, []string{"b"}},
		{"names", `root ::= my-rule_2
my-rule_2 ::= "z"`, []string{"z"}, nil},
		{"large states", `root ::= [a-c]{0,100} [b-d]{0,100} [a-d]{0,100} "x"`, []string{"x", strings.Repeat("ab", 50) + strings.Repeat("bcd", 40) + "x", strings.Repeat("b", 300) + "x"}, []string{strings.Repeat("b", 301) + "x", "aex"}},
		{"empty class negation any", `root ::= [^]`, []string{"a", "é"}, []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := mustParse(t, tc.grammar)
			for _, s := range tc.accept {
				if !matches(g, s) {
					t.Errorf("refused %q, want accepted", s)
				}
			}
			for _, s := range tc.refuse {
				if matches(g, s) {
					t.Errorf("accepted %q, want refused", s)
				}
			}
		})
	}
}

func TestJSON(t *testing.T) {
	g := mustParse(t, jsonGrammar)
	valid := []string{
		`{}`, `[]`, `0`, `-1.5e10`, `"x"`, `true`, `null`,
		`{"a": 1, "b": [true, false, null], "c": {"d": "e\n\u00e9"}}`,
		`[1, 2.25, -3, "four", {"five": 5}]`,
		"{\n  \"k\": \"日本語\"\n}",
		`"\"\\\/\b\f\n\r\t\u1234"`,
		` [ ] `,
		`[[[[[[[[[[]]]]]]]]]]`,
	}
	invalid := []string{
		``, `{`, `{"a"}`, `{"a":}`, `[1,]`, `[,1]`, `01`, `1.`, `.5`, `"abc`, `"a\x"`,
		"\"tab\there\"", `{'a': 1}`, `tru`, `nul`, `[1 2]`, `{"a":1,}`, `"\u12G4"`, `+1`,
	}
	for _, s := range valid {
		if !matches(g, s) {
			t.Errorf("refused valid JSON %q", s)
		}
	}
	for _, s := range invalid {
		if matches(g, s) {
			t.Errorf("accepted invalid JSON %q", s)
		}
	}
}

func TestMatcherAPI(t *testing.T) {
	g := mustParse(t, `root ::= "ab" | "ac" | "a"`)
	m := g.NewMatcher()
	if m.CanEnd() || m.Done() {
		t.Fatal("start: CanEnd/Done")
	}
	if nb := m.NextBytes(); nb != bits('a') {
		t.Fatalf("NextBytes at start = %v", nb)
	}
	if m.AcceptByte('x') {
		t.Fatal("accepted x")
	}
	if !m.AcceptByte('a') {
		t.Fatal("refused a")
	}
	if !m.CanEnd() || m.Done() {
		t.Fatal("after a: want CanEnd and not Done")
	}
	if nb := m.NextBytes(); nb != bits('b', 'c') {
		t.Fatalf("NextBytes after a = %v", nb)
	}
	c := m.Clone()
	if m.AcceptBytes([]byte("bx")) {
		t.Fatal("AcceptBytes bx accepted")
	}
	// all or nothing: m unchanged
	if nb := m.NextBytes(); nb != bits('b', 'c') {
		t.Fatalf("AcceptBytes failure changed state: %v", nb)
	}
	if !m.AcceptByte('c') || !m.Done() || !m.CanEnd() {
		t.Fatal("after ac: want Done")
	}
	if m.AcceptByte('c') {
		t.Fatal("accepted after Done")
	}
	// clone independent
	if !c.AcceptByte('b') || !c.Done() {
		t.Fatal("clone")
	}
	if !m.Done() {
		t.Fatal("clone affected original")
	}
}

func bits(bs ...byte) (s [4]uint64) {
	for _, b := range bs {
		s[b/64] |= 1 << (b % 64)
	}
	return s
}

// TestClassExhaustive checks, for every code point, that a class accepts its
// UTF-8 encoding exactly when the code point is in the class, and that
// NextBytes never offers a byte that cannot start a valid sequence.
func TestClassExhaustive(t *testing.T) {
	classes := []struct {
		src string
		in  func(r rune) bool
	}{
		{`[^"\\]`, func(r rune) bool { return r != '"' && r != '\\' }},
		{`[α-ω]`, func(r rune) bool { return r >= 'α' && r <= 'ω' }},
		{`.`, func(r rune) bool { return true }},
		{`[\u0100-\u2fff\U00010400-\U0001ffff]`, func(r rune) bool { return r >= 0x100 && r <= 0x2fff || r >= 0x10400 && r <= 0x1ffff }},
		{`[^\x00-\x7f\u0800-\U0010FFFF]`, func(r rune) bool { return r >= 0x80 && r < 0x800 }},
	}
	step := rune(1)
	if testing.Short() {
		step = 7
	}
	for _, c := range classes {
		g := mustParse(t, "root ::= "+c.src)
		for r := rune(0); r <= 0x10FFFF; r += step {
			if r >= 0xD800 && r <= 0xDFFF {
				continue
			}
			got := matches(g, string(r))
			if got != c.in(r) {
				t.Fatalf("%s: U+%04X accepted=%v", c.src, r, got)
			}
		}
		// invalid sequences: surrogates, overlongs, beyond U+10FFFF
		for _, bad := range []string{"\xed\xa0\x80", "\xed\xbf\xbf", "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xf0\x80\x80\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff", "\x80"} {
			if matches(g, bad) {
				t.Errorf("%s accepted invalid UTF-8 %q", c.src, bad)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, src, want string
	}{
		{"undefined", "root ::= foo", "1:10: undefined rule \"foo\""},
		{"undefined later line", "root ::= a\na ::= \"x\" b", "2:11: undefined rule \"b\""},
		{"missing root", `main ::= "x"`, "1:1: missing root"},
		{"empty", ``, "missing root"},
		{"unterminated literal", "root ::= \"abc", "1:10: unterminated string literal"},
		{"unterminated class", "root ::= [abc", "1:10: unterminated character class"},
		{"unterminated group", "root ::= (\"a\"", "1:10: unterminated group"},
		{"unbalanced paren", "root ::= \"a\")", "1:13: unbalanced ')'"},
		{"bad escape", `root ::= "\q"`, "1:11: unknown escape \\q"},
		{"bad hex", `root ::= "\xZZ"`, "bad \\x escape"},
		{"surrogate escape", `root ::= "\uD800"`, "not a valid Unicode scalar value"},
		{"too big escape", `root ::= "\U00110000"`, "not a valid Unicode scalar value"},
		{"reversed range", `root ::= [z-a]`, "1:11: bad character range"},
		{"empty class", `root ::= []`, "matches no character"},
		{"bounds reversed", `root ::= "a"{3,2}`, "1:13: bad repetition bounds: minimum 3 exceeds maximum 2"},
		{"bounds too big", `root ::= "a"{0,10001}`, "repetition bound 10001 exceeds the limit 10000"},
		{"bounds huge", `root ::= "a"{99999999999999999999}`, "exceeds the limit"},
		{"bounds empty", `root ::= "a"{}`, "empty repetition bounds"},
		{"bounds junk", `root ::= "a"{1;2}`, "bad repetition bounds"},
		{"bounds unterminated", `root ::= "a"{1,2`, "bad repetition bounds"},
		{"left recursion direct", "root ::= root \"a\" | \"b\"", "left recursion: rule root"},
		{"left recursion indirect", "root ::= a\na ::= b \"x\"\nb ::= \"\" root", "left recursion"},
		{"left recursion nullable", "root ::= x* root \"a\"\nx ::= \"b\"", "left recursion"},
		{"star of nullable", `root ::= ("a"?)*`, "left recursion"},
		{"redefined", "root ::= \"a\"\nroot ::= \"b\"", "2:1: rule \"root\" redefined (first defined at 1:1)"},
		{"missing ::=", "root = \"a\"", "1:6: expected ::="},
		{"no name", "::= \"a\"", "1:1: expected rule name"},
		{"bad char", "root ::= \"a\" @", "1:14: unexpected '@'"},
		{"too large", "root ::= " + strings.Repeat(`"a"{10000} `, 120), "grammar too large"},
		{"nesting", "root ::= " + strings.Repeat("(", 300) + strings.Repeat(")", 300), "nested too deeply"},
		{"invalid utf8", "root ::= \"\xff\"", "invalid UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := grammar.Parse(tc.src)
			if err == nil {
				t.Fatalf("Parse succeeded, want error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
			var pe *grammar.ParseError
			if !errors.As(err, &pe) || pe.Line < 1 || pe.Col < 1 {
				t.Fatalf("error %v is not a positioned *ParseError", err)
			}
		})
	}
}

// TestHostile checks that pathological grammars are either refused or stay
// within bounded work.
func TestHostile(t *testing.T) {
	var b strings.Builder
	b.WriteString("root ::= r40\nr0 ::= \"a\"\n")
	for i := 1; i <= 40; i++ {
		b.WriteString("r" + itoa(i) + " ::= r" + itoa(i-1) + " | r" + itoa(i-1) + "\n")
	}
	if _, err := grammar.Parse(b.String()); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("exponential ambiguity: err = %v", err)
	}
	// large but linear repetitions compile
	g := mustParse(t, `root ::= ("ab"{0,10000} "c"){0,10000} "d"`)
	if !matches(g, strings.Repeat("ababc", 50)+"d") {
		t.Error("nested bounded repetition refused")
	}
	// deep nesting is capped, not unbounded
	g = mustParse(t, "root ::= \"(\" root \")\" | \"x\"")
	m := g.NewMatcher()
	depth := 0
	for depth < 5000 && m.AcceptByte('(') {
		depth++
	}
	if depth >= 5000 {
		t.Errorf("nesting depth not capped")
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		jsonGrammar,
		`root ::= "a"`,
		`root ::= [^"\\]* "x"{2,5}`,
		`root ::= ("a" | "b")+ . [α-ω]?`,
		"root ::= x\nx ::= \"(\" x \")\" | \"\"",
		`root ::= "\u00e9\x41\U0001F600" [\x00-\x7f]`,
		`root ::= root`,
		`root ::= "a"{,3} "b"{2,}`,
		"root ::= # c\n  \"a\"\n",
		`root ::= [`,
		`root ::= "`,
		`root ::= (`,
	} {
		f.Add(s, []byte("{\"a\": [1, 2]}"))
	}
	f.Fuzz(func(t *testing.T, src string, input []byte) {
		g, err := grammar.Parse(src)
		if err != nil {
			var pe *grammar.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *ParseError", err)
			}
			return
		}
		m := g.NewMatcher()
		for _, b := range input {
			nb := m.NextBytes()
			allowed := nb[b/64]&(1<<(b%64)) != 0
			if got := m.AcceptByte(b); got != allowed && !(allowed && !got) {
				t.Fatalf("AcceptByte(%q) = %v, NextBytes says %v", b, got, allowed)
			}
		}
		_ = m.CanEnd()
		_ = m.Done()

		// masks over a small vocabulary agree with trying every token
		pieces := fuzzPieces(input)
		st := grammar.NewConstraint(g, grammar.NewVocab(pieces, []int32{0})).Start()
		sm := g.NewMatcher()
		for step := 0; step < 4; step++ {
			mask := st.Mask()
			var next int32 = -1
			for id, p := range pieces {
				want := id == 0 && sm.CanEnd() || id > 0 && sm.Clone().AcceptBytes(p)
				if got := mask[id/64]&(1<<(id%64)) != 0; got != want {
					t.Fatalf("step %d token %d %q: mask %v, brute force %v", step, id, p, got, want)
				}
				if want && id > 0 && (next < 0 || len(p) > len(pieces[next])) {
					next = int32(id)
				}
			}
			if next < 0 {
				break
			}
			if err := st.Accept(next); err != nil {
				t.Fatal(err)
			}
			sm.AcceptBytes(pieces[next])
		}
	})
}

func TestHostileClass(t *testing.T) {
	var b strings.Builder
	b.WriteString("root ::= [")
	for r := rune(0x100); r < 0x100+2*40000; r += 2 {
		b.WriteRune(r)
	}
	b.WriteString("]")
	_, err := grammar.Parse(b.String())
	if err == nil || !strings.Contains(err.Error(), "too complex") {
		t.Fatalf("err = %v", err)
	}
	// a moderately fragmented class still compiles and matches exactly
	b.Reset()
	b.WriteString("root ::= [")
	for r := rune(0x100); r < 0x100+2*500; r += 2 {
		b.WriteRune(r)
	}
	b.WriteString("]")
	g := mustParse(t, b.String())
	for r := rune(0xF0); r < 0x100+2*520; r++ {
		want := r >= 0x100 && r < 0x100+2*500 && r%2 == 0
		if got := matches(g, string(r)); got != want {
			t.Fatalf("U+%04X: %v", r, got)
		}
	}
}

// TestGBNFExamples runs grammars in the style of llama.cpp's GBNF guide and
// its JSON-schema converter output.
func TestGBNFExamples(t *testing.T) {
	cases := []struct {
		name, src      string
		accept, refuse []string
	}{
		{"list", `# a grammar for lists
root ::= ("- " item)+
item ::= [^\n]+ "\n"`, []string{"- a\n", "- milk\n- 日本\n"}, []string{"", "- \n", "- a", "* a\n"}},
		{"chess", `# chess moves
root ::= (
    # first move
    "1. " move " " move "\n"

    # more moves
    ([1-9] [0-9]? ". " move " " move "\n")+
)
move ::= (pawn | nonpawn | castle) [+#]?
pawn ::= [a-h] [1-8]
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?`, []string{"1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n2. O-O-O Qxd8#\n"}, []string{"1. e4 e5\n", "1. e9 e5\n2. a1 a2\n"}},
		{"schema name-age", `char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
item ::= "{" space item-name-kv "," space item-age-kv "}" space
item-age ::= ([0-9] | ([1-8] [0-9] | [9] [0-9]) | "1" ([0-4] [0-9] | [5] "0")) space
item-age-kv ::= "\"age\"" space ":" space item-age
item-name ::= "\"" char{1,100} "\"" space
item-name-kv ::= "\"name\"" space ":" space item-name
root ::= "[" space item ("," space item){1,3} "]" space
space ::= | " " | "\n" [ \t]{0,20}`,
			[]string{`[{"name": "Ada", "age": 36},{"name":"Alan \"T\"","age":41}]`, "[\n {\"name\": \"é\", \"age\": 150}, {\"name\": \"x\", \"age\": 0}]"},
			[]string{`[{"name": "Ada", "age": 36}]`, `[{"name": "", "age": 36},{"name":"A","age":4}]`, `[{"name": "A", "age": 151},{"name":"A","age":4}]`, `[{"age": 36, "name": "A"},{"name":"A","age":4}]`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := mustParse(t, tc.src)
			for _, s := range tc.accept {
				if !matches(g, s) {
					t.Errorf("refused %q", s)
				}
			}
			for _, s := range tc.refuse {
				if matches(g, s) {
					t.Errorf("accepted %q", s)
				}
			}
		})
	}
}

func fuzzPieces(input []byte) [][]byte {
	pieces := [][]byte{[]byte("<eos>")}
	for b := range 256 {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, p := range []string{"é", "日本", "\U0001F600", "ab", "abc", "\"", "\\u", "  "} {
		pieces = append(pieces, []byte(p))
	}
	for i := 0; i+3 <= len(input) && i < 60; i += 3 {
		pieces = append(pieces, input[i:i+3], input[i:min(i+5, len(input))])
	}
	return pieces
}
