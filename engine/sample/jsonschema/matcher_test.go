package jsonschema

import (
	"encoding/json"
	"fmt"
	"math/big"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	sj "github.com/santhosh-tekuri/jsonschema/v6"

	"shoal/engine/sample/grammar"
)

type schemaCase struct {
	name    string
	schema  string
	valid   []string
	invalid []string
}

var schemaCases = []schemaCase{
	{
		name:   "object required optional",
		schema: `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"}},"required":["name"],"additionalProperties":false}`,
		valid:  []string{`{"name":"x"}`, `{"name":"x","age":3}`, `{"name":"x","email":"e"}`, `{"name":"","age":-12,"email":"a\"b"}`, "{ \"name\" : \"x\" ,\n  \"age\": 1\n}"},
		invalid: []string{`{}`, `{"age":3}`, `{"age":3,"name":"x"}`, `{"name":"x",}`, `{"name":"x","other":1}`, `{"name":1}`,
			`{"name":"x","age":1.5}`, `{"name":"x","age":01}`, `{"name":"a` + "\n" + `"}`, `{"name":"\x"}`, `{"name":"x"} `, ` {"name":"x"}`},
	},
	{
		name:    "all optional",
		schema:  `{"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"number"}}}`,
		valid:   []string{`{}`, `{"a":true}`, `{"b":null}`, `{"c":1.5e-3}`, `{"a":false,"c":0}`, `{"b":null,"c":-0.25}`, `{"a":true,"b":null,"c":1E+2}`},
		invalid: []string{`{,"a":true}`, `{"b":null,"a":true}`, `{"a":true,}`, `{"c":.5}`, `{"c":1.}`, `{"c":+1}`},
	},
	{
		name:    "nested arrays",
		schema:  `{"type":"array","items":{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":1,"maxItems":3},"minItems":2,"maxItems":4}`,
		valid:   []string{`[[1],[2]]`, `[[1,2,3],[0],[9,9]]`, `[ [1] , [2] , [3] , [4] ]`},
		invalid: []string{`[]`, `[[1]]`, `[[1],[]]`, `[[1],[2],[3],[4],[5]]`, `[[1,2,3,4],[1]]`, `[[10],[1]]`, `[[-1],[1]]`},
	},
	{
		name:    "mixed enum",
		schema:  `{"enum":["red",42,null,true,{"a":[1,"x"]},[],-1.5,"with \"quote\" and \\ and \n"]}`,
		valid:   []string{`"red"`, `42`, `null`, `true`, `{"a":[1,"x"]}`, `[]`, `-1.5`, `"with \"quote\" and \\ and \n"`},
		invalid: []string{`"blue"`, `43`, `false`, `{"a":[1]}`, `"red" `},
	},
	{
		name:    "anyOf",
		schema:  `{"anyOf":[{"type":"string","maxLength":3},{"type":"integer","minimum":10,"maximum":20},{"type":"array","items":{"type":"boolean"},"maxItems":2}]}`,
		valid:   []string{`"abc"`, `""`, `10`, `20`, `[]`, `[true,false]`},
		invalid: []string{`"abcd"`, `9`, `21`, `[true,true,true]`, `null`},
	},
	{
		name:    "tree recursion",
		schema:  `{"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},"required":["value"],"additionalProperties":false}},"$ref":"#/$defs/node"}`,
		valid:   []string{`{"value":1}`, `{"value":1,"children":[]}`, `{"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4}]}]}`},
		invalid: []string{`{"value":1,"children":[{}]}`, `{"children":[]}`, `{"value":1,"children":[{"value":1},{"value":1},{"value":1},{"value":1}]}`},
	},
	{
		name:    "integer range",
		schema:  `{"type":"integer","minimum":-123,"maximum":4567}`,
		valid:   []string{`-123`, `0`, `4567`, `-1`, `999`},
		invalid: []string{`-124`, `4568`, `-0`, `00`, `1.0`, `45670`},
	},
	{
		name:    "integer exclusive",
		schema:  `{"type":"integer","exclusiveMinimum":-7.5,"exclusiveMaximum":100}`,
		valid:   []string{`-7`, `99`, `0`},
		invalid: []string{`-8`, `100`},
	},
	{
		name:   "number unit interval",
		schema: `{"type":"object","properties":{"p":{"type":"number","minimum":0,"maximum":1},"q":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":100},"r":{"type":"number","minimum":-5,"maximum":-2},"s":{"type":"number","exclusiveMinimum":-3,"maximum":2},"t":{"type":"number","minimum":10},"u":{"type":"number","exclusiveMaximum":0}},"required":["p","q","r","s","t","u"]}`,
		valid:  []string{`{"p":0,"q":0.5,"r":-5,"s":-2.999,"t":10,"u":-0.001}`, `{"p":1.000,"q":99.99,"r":-2.0,"s":2,"t":1234.5,"u":-123}`, `{"p":0.25,"q":1,"r":-3.5,"s":0,"t":10.0,"u":-1}`},
		invalid: []string{`{"p":1.01,"q":1,"r":-3,"s":0,"t":10,"u":-1}`, `{"p":1,"q":0,"r":-3,"s":0,"t":10,"u":-1}`, `{"p":1,"q":0.0,"r":-3,"s":0,"t":10,"u":-1}`, `{"p":1,"q":100,"r":-3,"s":0,"t":10,"u":-1}`,
			`{"p":1,"q":1,"r":-5.5,"s":0,"t":10,"u":-1}`, `{"p":1,"q":1,"r":-1.9,"s":0,"t":10,"u":-1}`, `{"p":1,"q":1,"r":-3,"s":-3,"t":10,"u":-1}`, `{"p":1,"q":1,"r":-3,"s":2.5,"t":10,"u":-1}`,
			`{"p":1,"q":1,"r":-3,"s":0,"t":9.99,"u":-1}`, `{"p":1,"q":1,"r":-3,"s":0,"t":10,"u":0}`, `{"p":1,"q":1,"r":-3,"s":0,"t":10,"u":-0.0}`, `{"p":1e0,"q":1,"r":-3,"s":0,"t":10,"u":-1}`},
	},
	{
		name:    "recursive ref with siblings",
		schema:  `{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},"next":{"$ref":"#/$defs/node","required":["v"]}},"additionalProperties":false}},"$ref":"#/$defs/node","required":["next"]}`,
		valid:   []string{`{"next":{"v":1}}`, `{"v":2,"next":{"v":1,"next":{"v":3}}}`},
		invalid: []string{`{"v":1}`, `{"next":{}}`, `{"next":{"v":1,"next":{}}}`},
	},
	{
		name:    "required without schema",
		schema:  `{"type":"object","properties":{"a":{"type":"null"}},"required":["b","a"],"additionalProperties":{"type":"boolean"}}`,
		valid:   []string{`{"a":null,"b":true}`},
		invalid: []string{`{"a":null,"b":1}`, `{"a":null}`},
	},
	{
		name:    "integer min only",
		schema:  `{"type":"integer","minimum":18}`,
		valid:   []string{`18`, `1000000`, `9999999999999999`},
		invalid: []string{`17`, `-18`, `0`},
	},
	{
		name:    "string lengths",
		schema:  `{"type":"object","properties":{"code":{"type":"string","minLength":2,"maxLength":4},"word":{"type":"string","minLength":1}},"required":["code","word"]}`,
		valid:   []string{`{"code":"ab","word":"x"}`, `{"code":"\u00e9\u00e9\u00e9\u00e9","word":"日本"}`, `{"code":"日本語","word":"\n"}`, `{"code":"\"\\","word":"\ud7ff"}`},
		invalid: []string{`{"code":"a","word":"x"}`, `{"code":"abcde","word":"x"}`, `{"code":"ab","word":""}`, `{"code":"\ud83d\ude00","word":"x"}`},
	},
	{
		name:    "prefixItems",
		schema:  `{"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":{"type":"boolean"},"maxItems":4}`,
		valid:   []string{`["a",1]`, `["a",1,true]`, `["a",1,true,false]`},
		invalid: []string{`["a"]`, `[1,"a"]`, `["a",1,true,false,true]`, `["a",1,2]`},
	},
	{
		name:    "type array and const",
		schema:  `{"type":"object","properties":{"v":{"type":["string","null"]},"k":{"const":"fixed"}},"required":["v","k"]}`,
		valid:   []string{`{"v":null,"k":"fixed"}`, `{"v":"s","k":"fixed"}`},
		invalid: []string{`{"v":1,"k":"fixed"}`, `{"v":null,"k":"other"}`},
	},
	{
		name:    "allOf merge",
		schema:  `{"allOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},{"properties":{"b":{"type":"integer","maximum":5}},"required":["b"]}]}`,
		valid:   []string{`{"a":"x","b":5}`},
		invalid: []string{`{"a":"x"}`, `{"b":1}`, `{"a":"x","b":6}`},
	},
	{
		name:    "free map",
		schema:  `{"type":"object","additionalProperties":{"type":"integer","minimum":0,"maximum":3}}`,
		valid:   []string{`{}`, `{"x":1}`, `{"x":1,"y":3}`},
		invalid: []string{`{"x":4}`, `{"x":1,}`},
	},
	{
		name:    "any value",
		schema:  `{}`,
		valid:   []string{`1`, `"s"`, `[1,{"a":null}]`, `{"a":[true,false]}`, `-0.5e10`},
		invalid: []string{`[1,]`, `{"a"}`, `tru`, `'s'`},
	},
	{
		name:    "formats",
		schema:  `{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"d":{"type":"string","format":"date"},"t":{"type":"string","format":"time"},"dt":{"type":"string","format":"date-time"}},"required":["id","d","t","dt"]}`,
		valid:   []string{`{"id":"123e4567-e89b-12d3-a456-426614174000","d":"2024-03-31","t":"12:34:56Z","dt":"2024-12-01T00:00:00.123+05:30"}`},
		invalid: []string{`{"id":"123e4567e89b12d3a456426614174000","d":"2024-03-31","t":"12:34:56Z","dt":"2024-12-01T00:00:00Z"}`, `{"id":"123e4567-e89b-12d3-a456-426614174000","d":"2024-02-30","t":"12:34:56Z","dt":"2024-12-01T00:00:00Z"}`, `{"id":"123e4567-e89b-12d3-a456-426614174000","d":"2024-03-31","t":"24:00:00Z","dt":"2024-12-01T00:00:00Z"}`},
	},
	{
		name:    "pattern anchored",
		schema:  `{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{2}-\\d{3,5}(x|yz)?$"},"q":{"type":"string","pattern":"^(\\w+\\s?)+\\.$"}},"required":["sku","q"]}`,
		valid:   []string{`{"sku":"AB-123","q":"hi there."}`, `{"sku":"ZZ-12345yz","q":"a."}`},
		invalid: []string{`{"sku":"AB-12","q":"a."}`, `{"sku":"ab-123","q":"a."}`, `{"sku":"AB-123","q":"a"}`},
	},
	{
		name:    "pattern unanchored and escapes",
		schema:  `{"type":"array","items":{"type":"string","pattern":"[\"\\\\]x|\\.[^a-z\\n]"},"minItems":1,"maxItems":3}`,
		valid:   []string{`["\"x"]`, `["ab\\xcd"]`, `[".A", "zz.\t"]`},
		invalid: []string{`["x"]`, `[".a"]`, `[".\n"]`},
	},
	{
		name:    "openai math reasoning",
		schema:  `{"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":"string"}},"required":["steps","final_answer"],"additionalProperties":false}`,
		valid:   []string{`{"steps":[{"explanation":"e","output":"o"}],"final_answer":"x = -3.75"}`, `{"steps":[],"final_answer":""}`},
		invalid: []string{`{"steps":[{"output":"o"}],"final_answer":"x"}`, `{"final_answer":"x","steps":[]}`},
	},
	{
		name:    "openai ui recursive",
		schema:  `{"type":"object","properties":{"type":{"type":"string","description":"The type of the UI component","enum":["div","button","header","section","field","form"]},"label":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}},"attributes":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"value":{"type":"string"}},"required":["name","value"],"additionalProperties":false}}},"required":["type","label","children","attributes"],"additionalProperties":false}`,
		valid:   []string{`{"type":"form","label":"L","children":[{"type":"button","label":"b","children":[],"attributes":[{"name":"n","value":"v"}]}],"attributes":[]}`},
		invalid: []string{`{"type":"span","label":"L","children":[],"attributes":[]}`},
	},
	{
		name:    "openai linked list",
		schema:  `{"type":"object","properties":{"linked_list":{"$ref":"#/$defs/linked_list_node"}},"$defs":{"linked_list_node":{"type":"object","properties":{"value":{"type":"number"},"next":{"anyOf":[{"$ref":"#/$defs/linked_list_node"},{"type":"null"}]}},"additionalProperties":false,"required":["next","value"]}},"required":["linked_list"],"additionalProperties":false}`,
		valid:   []string{`{"linked_list":{"value":1,"next":{"value":2.5,"next":null}}}`},
		invalid: []string{`{"linked_list":{"value":1}}`, `{"linked_list":null}`},
	},
	{
		name:    "openai definitions and nullable",
		schema:  `{"type":"object","properties":{"event":{"$ref":"#/definitions/ev"},"tags":{"type":["array","null"],"items":{"type":"string","enum":["a","b"]}}},"required":["event","tags"],"additionalProperties":false,"definitions":{"ev":{"type":"object","properties":{"name":{"type":"string","title":"Name"},"attendees":{"type":"array","items":{"type":"string"},"minItems":1}},"required":["name","attendees"],"additionalProperties":false}}}`,
		valid:   []string{`{"event":{"name":"n","attendees":["x"]},"tags":null}`, `{"event":{"name":"n","attendees":["x","y"]},"tags":["a","b","a"]}`},
		invalid: []string{`{"event":{"name":"n","attendees":[]},"tags":null}`, `{"event":{"name":"n","attendees":["x"]},"tags":["c"]}`},
	},
	{
		name:    "oneOf disjoint",
		schema:  `{"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"integer","minimum":1,"maximum":100}},"required":["kind","side"],"additionalProperties":false}]}`,
		valid:   []string{`{"kind":"circle","r":2.5}`, `{"kind":"square","side":100}`},
		invalid: []string{`{"kind":"circle","side":2}`, `{"kind":"square","side":0}`},
	},
}

func compileBoth(t testing.TB, schema string) (*grammar.Grammar, *sj.Schema) {
	t.Helper()
	src, err := Grammar([]byte(schema))
	if err != nil {
		t.Fatalf("Grammar: %v", err)
	}
	g, err := grammar.Parse(src)
	if err != nil {
		t.Fatalf("grammar.Parse: %v\n%s", err, src)
	}
	doc, err := sj.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := sj.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem:///schema.json")
	if err != nil {
		t.Fatalf("reference validator: %v", err)
	}
	return g, sch
}

func accepts(g *grammar.Grammar, doc string) bool {
	m := g.NewMatcher()
	return m.AcceptBytes([]byte(doc)) && m.CanEnd()
}

func validate(sch *sj.Schema, doc string) error {
	inst, err := sj.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

func TestExamples(t *testing.T) {
	for _, tc := range schemaCases {
		t.Run(tc.name, func(t *testing.T) {
			g, sch := compileBoth(t, tc.schema)
			for _, d := range tc.valid {
				if err := validate(sch, d); err != nil {
					t.Fatalf("test bug: %s is not valid: %v", d, err)
				}
				if !accepts(g, d) {
					t.Errorf("valid document refused: %s", d)
				}
			}
			for _, d := range tc.invalid {
				if accepts(g, d) {
					t.Errorf("invalid document accepted: %s", d)
				}
			}
		})
	}
}

// walk generates one document by choosing among the bytes the matcher
// allows. It returns false if it did not finish within the step budget.
func walk(g *grammar.Grammar, rng *rand.Rand) ([]byte, bool) {
	return walkN(g, rng, 20000)
}

// walkN is walk with at most hard bytes.
func walkN(g *grammar.Grammar, rng *rand.Rand, hard int) ([]byte, bool) {
	m := g.NewMatcher()
	var out []byte
	var allowed []byte
	const soft = 200
	for len(out) < hard {
		if m.Done() {
			return out, true
		}
		if m.CanEnd() {
			p := 0.3
			if len(out) > soft {
				p = 0.9
			}
			if rng.Float64() < p {
				return out, true
			}
		}
		next := m.NextBytes()
		allowed = allowed[:0]
		for w, bitsW := range next {
			for bitsW != 0 {
				i := bits.TrailingZeros64(bitsW)
				bitsW &^= 1 << i
				allowed = append(allowed, byte(w*64+i))
			}
		}
		if len(allowed) == 0 {
			return out, false // dead end: neither end nor continue
		}
		b := allowed[rng.IntN(len(allowed))]
		if len(out) > soft && rng.Float64() < 0.9 {
			// Bias towards closing: prefer quotes and closing brackets.
			var closers []byte
			for _, c := range allowed {
				if c == '"' || c == ']' || c == '}' {
					closers = append(closers, c)
				}
			}
			if len(closers) > 0 {
				b = closers[rng.IntN(len(closers))]
			}
		}
		if !m.AcceptByte(b) {
			panic("matcher refused a byte from NextBytes: " + strconv.Quote(string(append(out, b))))
		}
		out = append(out, b)
	}
	return out, false
}

func TestRandomWalk(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 40
	}
	for ci, tc := range schemaCases {
		t.Run(tc.name, func(t *testing.T) {
			g, sch := compileBoth(t, tc.schema)
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			unfinished := 0
			for range n {
				doc, ok := walk(g, rng)
				if !ok {
					unfinished++
					continue
				}
				if !utf8.Valid(doc) {
					t.Errorf("invalid UTF-8: %q", doc)
					continue
				}
				if !json.Valid(doc) {
					t.Errorf("not JSON: %q", doc)
					continue
				}
				if err := validate(sch, string(doc)); err != nil {
					t.Errorf("invalid document %s: %v", doc, err)
				}
			}
			if unfinished > n/20 {
				t.Errorf("%d of %d walks did not finish", unfinished, n)
			}
		})
	}
}

func TestIntRangeMatcher(t *testing.T) {
	for _, r := range [][2]int{{-123, 4567}, {-4567, 123}, {-999, -10}, {0, 0}, {7, 7}, {-1, 1}, {100, 999}} {
		src, err := Grammar([]byte(`{"type":"integer","minimum":` + strconv.Itoa(r[0]) + `,"maximum":` + strconv.Itoa(r[1]) + `}`))
		if err != nil {
			t.Fatal(err)
		}
		g, err := grammar.Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		for n := r[0] - 1000; n <= r[1]+1000; n++ {
			if got, want := accepts(g, strconv.Itoa(n)), n >= r[0] && n <= r[1]; got != want {
				t.Fatalf("[%d,%d] %d: accepted %v", r[0], r[1], n, got)
			}
		}
	}
}

func TestAnyObject(t *testing.T) {
	g, err := grammar.Parse(AnyObject())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{`{}`, `{"a":1}`, `{"a":{"b":[1,"x",null]},"c":true}`} {
		if !accepts(g, d) {
			t.Errorf("refused %s", d)
		}
	}
	for _, d := range []string{`[]`, `1`, `{"a":1,}`, `"x"`} {
		if accepts(g, d) {
			t.Errorf("accepted %s", d)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		doc, ok := walk(g, rng)
		if !ok {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal(doc, &v); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
}

// TestGrammarsParse checks that every grammar the tests produce parses,
// including with a prefix.
func TestRulesParse(t *testing.T) {
	for _, tc := range schemaCases {
		src, root, err := Rules([]byte(tc.schema), "x-")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := grammar.Parse("root ::= " + root + "\n" + src); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestManyOptionalProperties(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range 400 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"p` + strconv.Itoa(i) + `":{"type":"integer"}`)
	}
	b.WriteString(`},"required":["p399"]}`)
	g, sch := compileBoth(t, b.String())
	for _, d := range []string{`{"p399":1}`, `{"p0":1,"p399":2}`, `{"p5":1,"p77":2,"p398":3,"p399":4}`} {
		if !accepts(g, d) {
			t.Errorf("refused %s", d)
		}
	}
	for _, d := range []string{`{}`, `{"p5":1}`, `{"p77":2,"p5":1,"p399":4}`} {
		if accepts(g, d) {
			t.Errorf("accepted %s", d)
		}
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for range 50 {
		doc, ok := walk(g, rng)
		if !ok {
			continue
		}
		if err := validate(sch, string(doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

func TestLargeEnum(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"type":"array","items":{"enum":[`)
	for i := range 5000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"value-` + strconv.Itoa(i) + `",` + strconv.Itoa(i*7))
	}
	b.WriteString(`,"value-","vàlue-é","vàlue-ê",""]},"maxItems":3}`)
	g, sch := compileBoth(t, b.String())
	for _, d := range []string{`["value-0"]`, `["value-4999",34993]`, `["value-"]`, `[""]`, `["vàlue-é","vàlue-ê",0]`, `[70]`} {
		if !accepts(g, d) {
			t.Errorf("refused %s", d)
		}
	}
	for _, d := range []string{`["value-5000"]`, `["value"]`, `[34994]`, `["vàlue-e"]`, `[" "]`} {
		if accepts(g, d) {
			t.Errorf("accepted %s", d)
		}
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for range 200 {
		doc, ok := walk(g, rng)
		if !ok {
			t.Errorf("walk did not finish: %q", doc)
			continue
		}
		if err := validate(sch, string(doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

// TestNumberRangeMatcher checks bounded numbers over a grid: an accepted
// number is always in range, and an in-range number without trailing
// fraction zeros is always accepted.
func TestNumberRangeMatcher(t *testing.T) {
	var cands []string
	for i := -8; i <= 8; i++ {
		s := strconv.Itoa(i)
		cands = append(cands, s, s+".0", s+".00")
		for _, f := range []string{"5", "25", "05", "9", "001", "9999999999999999"} {
			cands = append(cands, s+"."+f)
		}
		if i == 0 {
			cands = append(cands, "-0", "-0.5", "-0.0", "-0.25")
		}
	}
	for lo := -4; lo <= 4; lo++ {
		for hi := lo; hi <= lo+4; hi++ {
			for ex := range 4 {
				loEx, hiEx := ex&1 != 0, ex&2 != 0
				if lo == hi && (loEx || hiEx) {
					continue
				}
				kmin, kmax := "minimum", "maximum"
				if loEx {
					kmin = "exclusiveMinimum"
				}
				if hiEx {
					kmax = "exclusiveMaximum"
				}
				schema := fmt.Sprintf(`{"type":"number","%s":%d,"%s":%d}`, kmin, lo, kmax, hi)
				src, err := Grammar([]byte(schema))
				if err != nil {
					t.Fatalf("%s: %v", schema, err)
				}
				g, err := grammar.Parse(src)
				if err != nil {
					t.Fatalf("%s: %v", schema, err)
				}
				for _, c := range cands {
					v, _ := new(big.Rat).SetString(c)
					in := v.Cmp(big.NewRat(int64(lo), 1)) > 0 || !loEx && v.Cmp(big.NewRat(int64(lo), 1)) == 0
					in = in && (v.Cmp(big.NewRat(int64(hi), 1)) < 0 || !hiEx && v.Cmp(big.NewRat(int64(hi), 1)) == 0)
					got := accepts(g, c)
					if got && !in {
						t.Errorf("%s accepts %s", schema, c)
					}
					canonical := !strings.Contains(c, ".") || !strings.HasSuffix(c, "0")
					if in && canonical && !got && c != "-0" && !strings.HasPrefix(c, "-0.") {
						t.Errorf("%s refuses %s", schema, c)
					}
				}
			}
		}
	}
}
