package jsonschema

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"shoal/engine/sample/grammar"
)

func TestErrors(t *testing.T) {
	cases := []struct {
		name, schema, want string
	}{
		{"patternProperties", `{"type":"object","properties":{"a":{"type":"object","patternProperties":{"x":{}}}}}`,
			`jsonschema: "patternProperties" at /properties/a is not supported`},
		{"not", `{"not":{"type":"string"}}`, `"not" at / is not supported`},
		{"if", `{"type":"object","if":{},"then":{}}`, `"if" at / is not supported`},
		{"multipleOf", `{"type":"integer","multipleOf":3}`, `"multipleOf" at / is not supported`},
		{"uniqueItems", `{"type":"array","uniqueItems":true}`, `"uniqueItems" at / is not supported`},
		{"contains", `{"type":"array","items":{"contains":{}}}`, `"contains" at /items is not supported`},
		{"propertyNames", `{"$defs":{"x":{"propertyNames":{}}},"$ref":"#/$defs/x"}`, `"propertyNames" at /$defs/x is not supported`},
		{"number bounds", `{"type":"number","minimum":0.5}`, `"minimum" at / with a non-integral value is not supported`},
		{"empty number range", `{"type":"number","minimum":3,"exclusiveMaximum":3}`, `number range is empty`},
		{"format", `{"type":"string","format":"email"}`, `"format": "email" at / is not supported`},
		{"pattern lookahead", `{"type":"string","pattern":"^(?=a)a$"}`, `"pattern" at /pattern is not supported`},
		{"pattern backref", `{"type":"string","pattern":"^(a)\\1$"}`, `"pattern" at /pattern is not supported`},
		{"pattern with length", `{"type":"string","pattern":"^a+$","maxLength":3}`, `"maxLength" with "pattern" at / is not supported`},
		{"minProperties", `{"type":"object","minProperties":2}`, `"minProperties" at / is not supported`},
		{"external ref", `{"$ref":"http://example.com/s.json"}`, `only local references`},
		{"dangling ref", `{"$ref":"#/$defs/nope"}`, `does not resolve`},
		{"malformed", `{"type":`, `malformed schema JSON`},
		{"malformed2", `{"type":"string"} x`, `malformed schema JSON`},
		{"not object", `[1,2]`, `must be a JSON object or a boolean`},
		{"false", `false`, `schema false allows no value`},
		{"bad type", `{"type":"text"}`, `unknown type "text"`},
		{"empty types", `{"type":[]}`, `empty type array`},
		{"min>max len", `{"type":"string","minLength":3,"maxLength":2}`, `allows no value`},
		{"min>max items", `{"type":"array","minItems":3,"maxItems":2}`, `allows no value`},
		{"empty int range", `{"type":"integer","minimum":5,"exclusiveMaximum":5}`, `is empty`},
		{"huge maxLength", `{"type":"string","maxLength":1000000000}`, `maxLength 1000000000 at / exceeds the supported limit`},
		{"huge minItems", `{"type":"array","minItems":1e9}`, `exceeds the supported limit`},
		{"negative maxLength", `{"type":"string","maxLength":-1}`, `must be a non-negative integer`},
		{"ref cycle", `{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, `$ref cycle without progress`},
		{"self ref", `{"$ref":"#"}`, `$ref cycle without progress`},
		{"left recursion", `{"$defs":{"e":{"anyOf":[{"$ref":"#/$defs/e"},{"type":"null"}]}},"$ref":"#/$defs/e"}`, `$ref cycle without progress`},
		{"allOf conflict", `{"allOf":[{"type":"string"},{"type":"integer"}]}`, `do not intersect`},
		{"allOf differs", `{"allOf":[{"type":"string","pattern":"a"},{"pattern":"b"}]}`, `cannot be merged: "pattern" differs`},
		{"allOf addl", `{"allOf":[{"properties":{"a":{}},"additionalProperties":false},{"properties":{"b":{}}}]}`, `excluded by additionalProperties`},
		{"ref sibling cycle", `{"$defs":{"a":{"$ref":"#/$defs/a","type":"object"}},"$ref":"#/$defs/a"}`, `merging too deep`},
		{"ref sibling self", `{"type":"object","$ref":"#"}`, `merging too deep`},
		{"bad prefix", ``, `rule prefix`},
		{"enum type mismatch", `{"type":"string","enum":[1,2]}`, `no value of the enum matches`},
		{"required false", `{"type":"object","properties":{"a":false},"required":["a"]}`, `schema false`},
		{"enum with minLength", `{"type":"string","enum":["a","bb"],"maxLength":1}`, `"maxLength" with "enum" at / is not supported`},
		{"const with enum", `{"const":1,"enum":[1]}`, `with "const"`},
		{"too many optional", `{"properties":{` + strings.Repeat(`"a":{},`, 0) + manyProps(600) + `}}`, `consecutive optional properties`},
		{"required not allowed", `{"properties":{"a":{}},"required":["b"],"additionalProperties":false}`, `required property "b" is excluded by additionalProperties`},
		{"anyOf all false", `{"anyOf":[false,false]}`, `no branch allows a value`},
		{"int bound too big", `{"type":"integer","minimum":1e30}`, `beyond`},
		{"prefixItems unsat", `{"type":"array","prefixItems":[{}],"items":false,"minItems":2}`, `needs more items`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.name == "bad prefix" {
				_, _, err = Rules([]byte(`{}`), "a_b")
			} else {
				_, err = Grammar([]byte(tc.schema))
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func manyProps(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{}`, i)
	}
	return b.String()
}

// TestHostile checks that adversarial schemas are refused or bounded
// quickly.
func TestHostile(t *testing.T) {
	var enum strings.Builder
	enum.WriteString(`{"enum":[`)
	for i := range 200000 {
		if i > 0 {
			enum.WriteByte(',')
		}
		fmt.Fprintf(&enum, `"value-%d"`, i)
	}
	enum.WriteString(`]}`)
	// allOf fan-out: each level refers twice to the next.
	var fan strings.Builder
	fan.WriteString(`{"$defs":{`)
	for i := range 40 {
		if i > 0 {
			fan.WriteByte(',')
		}
		fmt.Fprintf(&fan, `"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1)
	}
	fan.WriteString(`,"d40":{"type":"string"}},"$ref":"#/$defs/d0"}`)
	// property fan-out through $ref with siblings (inlined copies).
	blow := `{"$defs":{"a":{"type":"object","properties":{"x":{"$ref":"#/$defs/a","type":"object"},"y":{"$ref":"#/$defs/a","type":"object"}}}},"$ref":"#/$defs/a"}`
	cases := map[string]string{
		"deep arrays":      strings.Repeat("[", 100000) + strings.Repeat("]", 100000),
		"deep properties":  strings.Repeat(`{"type":"object","properties":{"a":`, 5000) + `{}` + strings.Repeat(`}}`, 5000),
		"deep items":       strings.Repeat(`{"items":`, 120) + `{}` + strings.Repeat(`}`, 120),
		"huge enum":        enum.String(),
		"allOf fan-out":    fan.String(),
		"sibling fan-out":  blow,
		"huge maxLength":   `{"type":"string","maxLength":1e9}`,
		"huge maxItems":    `{"type":"array","maxItems":1000000000}`,
		"huge pattern rep": `{"type":"string","pattern":"^a{1000000}$"}`,
		"ref chain cycle":  `{"$defs":{"a":{"allOf":[{"$ref":"#/$defs/b"}]},"b":{"allOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`,
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			g, err := Grammar([]byte(s))
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
			if err == nil && len(g) > maxGrammarBytes {
				t.Fatalf("grammar of %d bytes", len(g))
			}
			t.Logf("len %d, err %v", len(g), err)
		})
	}
}

func TestRulesPrefix(t *testing.T) {
	schema := `{"type":"object","properties":{"object":{"type":"array","items":{"$ref":"#/$defs/root"}},"s":{"type":"string","maxLength":3}},"$defs":{"root":{"type":"integer","minimum":-5,"maximum":5}}}`
	g, root, err := Rules([]byte(schema), "js-")
	if err != nil {
		t.Fatal(err)
	}
	if root != "js-root" {
		t.Fatalf("root %q", root)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(g), "\n") {
		name, _, ok := strings.Cut(line, " ::= ")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		if !strings.HasPrefix(name, "js-") {
			t.Errorf("rule %q lacks the prefix", name)
		}
		if names[name] {
			t.Errorf("rule %q defined twice", name)
		}
		names[name] = true
	}
	if !names["js-root"] {
		t.Error("no js-root rule")
	}
	// Every referenced name is defined.
	for _, line := range strings.Split(strings.TrimSpace(g), "\n") {
		_, body, _ := strings.Cut(line, " ::= ")
		for _, w := range strings.Fields(body) {
			w = strings.TrimRight(w, "*+?")
			if i := strings.IndexByte(w, '{'); i > 0 {
				w = w[:i]
			}
			if strings.HasPrefix(w, "js-") && !names[w] {
				t.Errorf("undefined rule %q", w)
			}
		}
	}
	g2, err := Grammar([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(g2, "root ::= ") {
		t.Errorf("Grammar does not start with root: %q", g2[:20])
	}
}

func TestTextShapes(t *testing.T) {
	cases := []struct{ schema, want string }{
		{`{"type":"integer","minimum":1,"maximum":12}`, `root ::= int`},
		{`{"type":"string","maxLength":5}`, `"\"" char{0,5} "\""`},
		{`{"type":"string","minLength":2}`, `"\"" char{2,} "\""`},
		{`{"const":"a\"b"}`, `"\"a\\\"b\""`},
		{`{"enum":[1,"x",null,true,{"k":[1]}]}`, `"1" | "\"x\"" | "null" | "true" | "{\"k\":[1]}"`},
		{`{"enum":["abc","abd","ab"]}`, `enum ::= "c\"" | "d\"" | "\""`},
		{`{"type":"array","items":{"type":"boolean"},"minItems":2,"maxItems":4}`, `"[" ws boolean ws ( "," ws boolean ws ){1,3} "]"`},
		{`{"type":"object","additionalProperties":false}`, `"{" ws "}"`},
		{`{"type":["string","null"]}`, `string | null`},
		{`{"anyOf":[false,{"type":"null"}]}`, `root ::= anyOf`},
	}
	for _, tc := range cases {
		g, err := Grammar([]byte(tc.schema))
		if err != nil {
			t.Fatalf("%s: %v", tc.schema, err)
		}
		if !strings.Contains(g, tc.want) {
			t.Errorf("%s:\n%s\nlacks %s", tc.schema, g, tc.want)
		}
	}
}

func FuzzGrammar(f *testing.F) {
	seeds := []string{
		`{}`, `true`, `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`,
		`{"$defs":{"n":{"type":"object","properties":{"c":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},"$ref":"#/$defs/n"}`,
		`{"type":"integer","minimum":-123,"maximum":4567}`,
		`{"anyOf":[{"type":"string","pattern":"^[a-z]+\\d?$"},{"enum":[1,2]}]}`,
		`{"allOf":[{"type":"object","properties":{"a":{}}},{"required":["a"]}]}`,
		`{"type":"array","prefixItems":[{"type":"null"}],"items":{"format":"uuid"},"maxItems":3}`,
		`{"type":"string","pattern":"[^\\s]{2,}(?:x|y)*"}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, schema []byte) {
		g, err := Grammar(schema)
		if err != nil {
			return
		}
		if !strings.HasPrefix(g, "root ::= ") {
			t.Fatalf("grammar without root first: %q", g)
		}
		if _, err := grammar.Parse(g); err != nil {
			t.Fatalf("schema %q: grammar does not parse: %v\n%s", schema, err, g)
		}
	})
}
