package grammar

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"

	"shoal/engine/gguf"
	"shoal/engine/tokenizer"
)

// jsonGrammar is a JSON value grammar (RFC 8259 syntax, whitespace limited to
// a bounded run between tokens as llama.cpp's json.gbnf does).
const jsonGrammar = `
# a JSON value
root   ::= ws value ws
value  ::= object | array | string | number | ("true" | "false" | "null")

object ::=
  "{" ws (
            member
    (ws "," ws member)*
  )? ws "}"
member ::= string ws ":" ws value

array  ::=
  "[" ws (
            value
    (ws "," ws value)*
  )? ws "]"

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\""

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?

ws ::= | " " | "\n" [ \t]{0,20}
`

func mustParseI(t testing.TB, src string) *Grammar {
	t.Helper()
	g, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// bruteMask is the reference: every token's piece tried on a clone.
func bruteMask(v *Vocab, m *Matcher, pieces [][]byte, eog []int32) []uint64 {
	mask := make([]uint64, (len(pieces)+63)/64)
	isEOG := map[int32]bool{}
	for _, id := range eog {
		isEOG[id] = true
	}
	for i, p := range pieces {
		ok := false
		if isEOG[int32(i)] {
			ok = m.CanEnd()
		} else if len(p) > 0 {
			ok = m.Clone().AcceptBytes(p)
		}
		if ok {
			mask[i/64] |= 1 << (i % 64)
		}
	}
	return mask
}

func maskIDs(mask []uint64) []int32 {
	var out []int32
	for w, x := range mask {
		for b := 0; b < 64; b++ {
			if x&(1<<b) != 0 {
				out = append(out, int32(w*64+b))
			}
		}
	}
	return out
}

func diffMasks(t *testing.T, what string, got, want []uint64, pieces [][]byte) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	n := 0
	for i := range pieces {
		g := got[i/64]&(1<<(i%64)) != 0
		w := want[i/64]&(1<<(i%64)) != 0
		if g != w && n < 10 {
			t.Errorf("%s: token %d %q: mask %v, brute force %v", what, i, pieces[i], g, w)
			n++
		}
	}
	if n == 0 {
		t.Errorf("%s: masks differ in padding bits", what)
	}
}

func syntheticVocab(rng *rand.Rand) (pieces [][]byte, eog []int32) {
	pieces = append(pieces, nil, []byte{}) // control tokens
	for b := 0; b < 256; b++ {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, s := range []string{`{"`, `":`, `": `, `", "`, `"}`, `]}`, `}]`, `true`, `false`, `null`, `nul`, `[1`,
		`\u`, `\u00e9`, `\"`, `\\`, `é`, "\xc3", "\xa9", "日本", "\xe6\x97", `", `, `, "`, "\n  ", "\n\t", "  ", " ",
		`12`, `-0`, `0.5`, `e+`, `E-1`, `1e`, `{}`, `[]`, `[[`, `]]`, `"a"`, `"`, `""`, `,`, `:`, "\U0001F600", "\xf0\x9f",
		"\x7f", "\x00", "a\"b", `a`, `ab`, `abc`, `key`, `value`, `true,`, `null]`, `{"a":1}`, `0`, `00`, `01`} {
		pieces = append(pieces, []byte(s))
	}
	alpha := []byte(`{}[]":, 0123456789.-+eEtrufalsn\\` + "\n é")
	for range 600 {
		n := 1 + rng.IntN(6)
		p := make([]byte, n)
		for i := range p {
			p[i] = alpha[rng.IntN(len(alpha))]
		}
		pieces = append(pieces, p)
	}
	pieces = append(pieces, []byte("</s>")) // an EOG token with text
	eog = []int32{int32(len(pieces) - 1), 0}
	return pieces, eog
}

// prefixes are JSON document prefixes whose states exercise many contexts.
var jsonPrefixes = []string{
	``, ` `, `{`, `{"`, `{"a`, `{"a"`, `{"a":`, `{"a": `, `{"a": "x`, `{"a": "x\`, `{"a": "x\u00`, `{"a": "é`,
	"{\"a\": \"\xe6\x97", `{"a": 1`, `{"a": 1.`, `{"a": 1.5e`, `{"a": -`, `{"a": [`, `{"a": [t`, `{"a": [true`,
	`{"a": [true,`, `{"a": [true, {`, `{"a": [true, {}]`, `{"a": [true, {}]}`, "{\"a\": [true, {}]}\n ", `[`, `[[[`,
	`[1, 2`, `"`, `"abc"`, `0`, `12`, `nu`, `false`, "{\n\t\t", `{"a":{"b":{"c":"`,
}

func prefixState(t testing.TB, c *Constraint, prefix string) *State {
	t.Helper()
	s := c.Start()
	if !s.m.AcceptBytes([]byte(prefix)) {
		t.Fatalf("prefix %q refused", prefix)
	}
	return s
}

func checkMasks(t *testing.T, g *Grammar, prefixes []string, pieces [][]byte, eog []int32, walks int, steps int, seed uint64) {
	v := NewVocab(pieces, eog)
	c := NewConstraint(g, v)
	check := func(what string, s *State) {
		got := s.Mask()
		want := bruteMask(v, s.m, pieces, eog)
		diffMasks(t, what, got, want, pieces)
		for _, id := range []int32{0, 1, 2, int32(len(pieces) - 1), int32(len(pieces) / 2)} {
			s2 := s.Clone()
			s2.mask = nil
			if a, w := s2.Allowed(id), want[id/64]&(1<<(id%64)) != 0; a != w {
				t.Errorf("%s: Allowed(%d) = %v, want %v", what, id, a, w)
			}
		}
	}
	for _, p := range prefixes {
		check("prefix "+p, prefixState(t, c, p))
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	for w := range walks {
		s := c.Start()
		for i := 0; i < steps; i++ {
			mask := s.Mask()
			ids := maskIDs(mask)
			if len(ids) == 0 {
				t.Fatalf("walk %d step %d: empty mask", w, i)
			}
			// prefer short structural tokens sometimes so walks leave strings
			tok := ids[rng.IntN(len(ids))]
			if rng.IntN(3) == 0 {
				for range 8 {
					cand := ids[rng.IntN(len(ids))]
					if len(pieces[cand]) > 0 && len(pieces[cand]) <= 2 {
						tok = cand
						break
					}
				}
			}
			if i%3 == 0 {
				check("walk", s)
			}
			if v.isEOG[tok] {
				if !s.CanEnd() {
					t.Fatalf("EOG allowed but not CanEnd")
				}
				if err := s.Accept(tok); err != nil {
					t.Fatal(err)
				}
				if err := s.Accept(tok); err == nil {
					t.Fatal("Accept after EOG succeeded")
				}
				break
			}
			if err := s.Accept(tok); err != nil {
				t.Fatalf("walk %d: Accept(%d %q) of a masked token: %v", w, tok, pieces[tok], err)
			}
		}
	}
}

func TestMaskSynthetic(t *testing.T) {
	g := mustParseI(t, jsonGrammar)
	rng := rand.New(rand.NewPCG(1, 2))
	pieces, eog := syntheticVocab(rng)
	checkMasks(t, g, jsonPrefixes, pieces, eog, 30, 60, 3)

	// other grammars: classes, dot, repetition
	for _, src := range []string{
		`root ::= [α-ω]{1,3} "-" .* "!"`,
		`root ::= ("ab" | "a" "b"* | [^a-c])+`,
		`root ::= "x"{2,5} ([0-9] | [^\x00-\x7f])?`,
		// many stacks per state (exercises the hashed dedupe)
		"root ::= [a-e ]{0,80} [b-f]{0,80} (\"x\" | [a-z]{0,40} \"y\")",
	} {
		checkMasks(t, mustParseI(t, src), nil, pieces, eog, 10, 20, 5)
	}
}

func TestStateAPI(t *testing.T) {
	g := mustParseI(t, `root ::= "ab" | "abc"`)
	pieces := [][]byte{nil, []byte("a"), []byte("b"), []byte("c"), []byte("ab"), []byte("x"), nil}
	v := NewVocab(pieces, []int32{6})
	if v.Len() != 7 {
		t.Fatalf("Len = %d", v.Len())
	}
	c := NewConstraint(g, v)
	s := c.Start()
	if got := maskIDs(s.Mask()); !slices.Equal(got, []int32{1, 4}) {
		t.Fatalf("start mask %v", got)
	}
	if len(s.Mask()) != 1 {
		t.Fatalf("mask length %d", len(s.Mask()))
	}
	if s.Allowed(6) || s.Allowed(0) || !s.Allowed(4) || s.Allowed(-1) || s.Allowed(99) {
		t.Fatal("Allowed at start")
	}
	if err := s.Accept(6); err == nil {
		t.Fatal("EOG accepted before CanEnd")
	}
	if err := s.Accept(0); err == nil {
		t.Fatal("control token accepted")
	}
	if err := s.Accept(5); err == nil {
		t.Fatal("x accepted")
	}
	if err := s.Accept(4); err != nil {
		t.Fatal(err)
	}
	if !s.CanEnd() || s.Done() {
		t.Fatal("after ab: want CanEnd, not Done")
	}
	if got := maskIDs(s.Mask()); !slices.Equal(got, []int32{3, 6}) {
		t.Fatalf("mask after ab %v", got)
	}
	b := s.Clone()
	if err := s.Accept(3); err != nil {
		t.Fatal(err)
	}
	if !s.Done() {
		t.Fatal("after abc: want Done")
	}
	if got := maskIDs(s.Mask()); !slices.Equal(got, []int32{6}) {
		t.Fatalf("mask when done %v", got)
	}
	if err := s.Accept(6); err != nil {
		t.Fatal(err)
	}
	if err := s.Accept(6); err == nil || s.Allowed(6) || s.CanEnd() || !s.Done() {
		t.Fatal("state after EOG")
	}
	if got := maskIDs(s.Mask()); len(got) != 0 {
		t.Fatalf("mask after EOG %v", got)
	}
	// clone unaffected
	if got := maskIDs(b.Mask()); !slices.Equal(got, []int32{3, 6}) {
		t.Fatalf("clone mask %v", got)
	}
	// a state no token can continue: all-zero mask
	g2 := mustParseI(t, `root ::= "q"`)
	s2 := NewConstraint(g2, v).Start()
	if got := maskIDs(s2.Mask()); len(got) != 0 {
		t.Fatalf("dead mask %v", got)
	}
}

// TestCanonicalKey: the same state reached through different histories has
// the same key, so it shares a cache entry.
func TestCanonicalKey(t *testing.T) {
	g := mustParseI(t, `root ::= ("a" x | "b" x | "a" y | "b" y)
x ::= "c" | "d"
y ::= "d" | "c"`)
	m1, m2 := g.NewMatcher(), g.NewMatcher()
	m1.AcceptByte('a')
	m2.AcceptByte('b')
	k1, k2 := string(m1.cur.key(nil)), string(m2.cur.key(nil))
	if k1 != k2 {
		t.Fatal("equal states (x and y called in tail position) have different keys")
	}
	g = mustParseI(t, jsonGrammar)
	pieces := [][]byte{[]byte("1"), []byte(`{"a": "`), []byte(`{"b": "`), []byte(`x`)}
	c := NewConstraint(g, NewVocab(pieces, nil))
	s1, s2 := c.Start(), c.Start()
	s1.Accept(1)
	s2.Accept(2)
	s1.Mask()
	n := c.CacheLen()
	s2.Mask()
	if c.CacheLen() != n {
		t.Fatal("equal states did not share a cache entry")
	}
}

func TestCacheBound(t *testing.T) {
	g := mustParseI(t, `root ::= [0-9]*`)
	// every state is the same: a 1-entry cache
	c := NewConstraint(g, NewVocab([][]byte{[]byte("1")}, nil))
	c.limit = 3
	g = mustParseI(t, `root ::= "a"{0,100}`)
	c = NewConstraint(g, NewVocab([][]byte{[]byte("a")}, nil))
	c.limit = 3
	s := c.Start()
	for range 50 {
		s.Mask()
		if err := s.Accept(0); err != nil {
			t.Fatal(err)
		}
	}
	if c.CacheLen() > 3 {
		t.Fatalf("cache grew to %d", c.CacheLen())
	}
}

func TestConcurrentMasks(t *testing.T) {
	g := mustParseI(t, jsonGrammar)
	rng := rand.New(rand.NewPCG(9, 9))
	pieces, eog := syntheticVocab(rng)
	v := NewVocab(pieces, eog)
	c := NewConstraint(g, v)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, p := range jsonPrefixes {
				if (i+w)%2 == 0 {
					continue
				}
				s := c.Start()
				s.m.AcceptBytes([]byte(p))
				want := bruteMask(v, s.m, pieces, eog)
				if !slices.Equal(s.Mask(), want) {
					t.Errorf("prefix %q: concurrent mask differs", p)
				}
			}
		}()
	}
	wg.Wait()
}

// TestUTF8Sequences checks the range split on random ranges against
// utf8.EncodeRune.
func TestUTF8Sequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for range 300 {
		lo := rune(rng.IntN(0x110000))
		hi := lo + rune(rng.IntN(0x3000))
		if hi > 0x10FFFF {
			hi = 0x10FFFF
		}
		for _, r := range normalize([]cpRange{{lo, hi}}) {
			var seqs [][]byteRange
			utf8Sequences(r.lo, r.hi, func(s []byteRange) { seqs = append(seqs, s) })
			in := func(b []byte) int {
				n := 0
				for _, s := range seqs {
					if len(s) != len(b) {
						continue
					}
					ok := true
					for i := range s {
						ok = ok && b[i] >= s[i].lo && b[i] <= s[i].hi
					}
					if ok {
						n++
					}
				}
				return n
			}
			for range 200 {
				c := r.lo + rune(rng.IntN(int(r.hi-r.lo)+1))
				if n := in(utf8.AppendRune(nil, c)); n != 1 {
					t.Fatalf("U+%X in [%X,%X] matched by %d sequences", c, r.lo, r.hi, n)
				}
			}
			// every sequence decodes to code points inside the range
			for _, s := range seqs {
				for range 20 {
					b := make([]byte, len(s))
					for i := range s {
						b[i] = s[i].lo + byte(rng.IntN(int(s[i].hi-s[i].lo)+1))
					}
					c, n := utf8.DecodeRune(b)
					if n != len(b) || c == utf8.RuneError || c < r.lo || c > r.hi {
						t.Fatalf("sequence %v produces %x outside [%X,%X]", s, b, r.lo, r.hi)
					}
				}
			}
		}
	}
}

// sharedTokenizerDir finds ../shared/tokenizer next to the repository root.
func sharedTokenizerDir(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Skip(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("repository root not found")
		}
		dir = parent
	}
	p := filepath.Join(dir, "..", "shared", "tokenizer")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s not available", p)
	}
	return p
}

type realVocab struct {
	tk     *tokenizer.Tokenizer
	pieces [][]byte
	eog    []int32
	v      *Vocab
}

var (
	realMu    sync.Mutex
	realCache = map[string]*realVocab{}
)

func loadRealVocab(t testing.TB, name string) *realVocab {
	t.Helper()
	p := filepath.Join(sharedTokenizerDir(t), name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s not available", p)
	}
	realMu.Lock()
	defer realMu.Unlock()
	if rv, ok := realCache[p]; ok {
		return rv
	}
	f, err := gguf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Skipf("%s: %v", name, err)
	}
	rv := &realVocab{tk: tk}
	for id := range int32(tk.NVocab()) {
		var piece []byte
		if !tk.IsControl(id) {
			piece = tk.Piece(id)
		}
		rv.pieces = append(rv.pieces, piece)
		if tk.IsEOG(id) {
			rv.eog = append(rv.eog, id)
		}
	}
	rv.v = NewVocab(rv.pieces, rv.eog)
	realCache[p] = rv
	return rv
}

func TestMaskRealVocab(t *testing.T) {
	g := mustParseI(t, jsonGrammar)
	for _, name := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		t.Run(name, func(t *testing.T) {
			rv := loadRealVocab(t, name)
			walks, steps := 4, 25
			if testing.Short() {
				walks, steps = 1, 10
			}
			checkMasks(t, g, jsonPrefixes, rv.pieces, rv.eog, walks, steps, 11)
			// a real document tokenized by the model's tokenizer is accepted
			doc := `{"name": "Ada", "tags": ["x", "y"], "n": -1.5e3, "ok": true, "z": null, "s": "日本 é"}`
			c := NewConstraint(g, rv.v)
			s := c.Start()
			for _, id := range rv.tk.Encode(doc, false, false) {
				if !s.Allowed(id) || !maskHas(s.Mask(), id) {
					t.Fatalf("token %d %q of a valid doc not allowed", id, rv.pieces[id])
				}
				if err := s.Accept(id); err != nil {
					t.Fatal(err)
				}
			}
			if !s.CanEnd() || len(rv.eog) == 0 || !maskHas(s.Mask(), rv.eog[0]) {
				t.Fatalf("EOG not allowed after a complete document")
			}
		})
	}
}

func maskHas(m []uint64, id int32) bool { return m[id>>6]&(1<<(id&63)) != 0 }

func benchState(b *testing.B, vocab, prefix string) (*Constraint, *State) {
	rv := loadRealVocab(b, vocab)
	g := mustParseI(b, jsonGrammar)
	c := NewConstraint(g, rv.v)
	return c, prefixState(b, c, prefix)
}

func BenchmarkMaskCold(b *testing.B) {
	for _, bc := range []struct{ name, vocab, prefix string }{
		{"objectKey", "ggml-vocab-llama-spm.gguf", `{"a": 1, "`},
		{"string", "ggml-vocab-llama-spm.gguf", `{"a": "xy`},
		{"value", "ggml-vocab-llama-spm.gguf", `{"a": `},
		{"gpt2-string", "ggml-vocab-gpt-2.gguf", `{"a": "xy`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, s := benchState(b, bc.vocab, bc.prefix)
			cpu0 := processCPU()
			for b.Loop() {
				c.computeMask(&s.m.cur)
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkMaskCached: Mask + Accept per token while generating a JSON
// document token by token, with a warm cache (the steady state of many
// sequences sharing a Constraint).
func BenchmarkMaskCached(b *testing.B) {
	rv := loadRealVocab(b, "ggml-vocab-llama-spm.gguf")
	g := mustParseI(b, jsonGrammar)
	c := NewConstraint(g, rv.v)
	doc := `{"name": "Ada Lovelace", "born": 1815, "tags": ["math", "poetry"], "ok": true, "nested": {"a": [1, 2, 3], "b": null}}`
	ids := rv.tk.Encode(doc, false, false)
	run := func() {
		s := c.Start()
		for _, id := range ids {
			m := s.Mask()
			if m[id>>6]&(1<<(id&63)) == 0 {
				b.Fatalf("token %d not allowed", id)
			}
			if err := s.Accept(id); err != nil {
				b.Fatal(err)
			}
		}
	}
	run() // warm the cache
	cpu0 := processCPU()
	b.ResetTimer()
	for b.Loop() {
		run()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/token")
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N*len(ids)), "cpu-ns/token")
}

func TestMaskBudget(t *testing.T) {
	g := mustParseI(t, jsonGrammar)
	rng := rand.New(rand.NewPCG(5, 5))
	pieces, eog := syntheticVocab(rng)
	v := NewVocab(pieces, eog)
	c := NewConstraint(g, v)
	defer func(old int) { maxMaskWork = old }(maxMaskWork)
	maxMaskWork = 200
	s := prefixState(t, c, `{"a": "`)
	got := s.Mask()
	want := bruteMask(v, s.m, pieces, eog)
	n := 0
	for i := range got {
		if got[i]&^want[i] != 0 {
			t.Fatal("partial mask allows a refused token")
		}
		n += len(maskIDs(got[i : i+1]))
	}
	if n == 0 || slices.Equal(got, want) {
		t.Fatalf("budget did not cut the walk (%d tokens)", n)
	}
	if c.CacheLen() != 0 {
		t.Fatal("partial mask cached")
	}
}

// TestMaskInternFull exercises the walk when its state table is full.
func TestMaskInternFull(t *testing.T) {
	defer func(old int32) { maxWalkStates = old }(maxWalkStates)
	g := mustParseI(t, jsonGrammar)
	rng := rand.New(rand.NewPCG(6, 6))
	pieces, eog := syntheticVocab(rng)
	for _, n := range []int32{0, 1, 3} {
		maxWalkStates = n
		checkMasks(t, g, jsonPrefixes, pieces, eog, 3, 20, uint64(n))
	}
}
