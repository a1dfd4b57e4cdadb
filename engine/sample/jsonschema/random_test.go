package jsonschema

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomSchema builds a random schema from the supported keywords.
func randomSchema(rng *rand.Rand, depth int) string {
	k := rng.IntN(14)
	if depth >= 3 && k >= 9 {
		k = rng.IntN(9)
	}
	switch k {
	case 0:
		lo := rng.IntN(4)
		return fmt.Sprintf(`{"type":"string","minLength":%d,"maxLength":%d}`, lo, lo+rng.IntN(6))
	case 1:
		return `{"type":"string"}`
	case 2:
		lo := rng.IntN(4000) - 2000
		if rng.IntN(2) == 0 {
			return fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, lo, lo+rng.IntN(3000))
		}
		return fmt.Sprintf(`{"type":"integer","exclusiveMinimum":%d}`, lo)
	case 3:
		lo := rng.IntN(20) - 10
		return []string{`{"type":"number"}`, fmt.Sprintf(`{"type":"number","minimum":%d,"maximum":%d}`, lo, lo+rng.IntN(5)),
			fmt.Sprintf(`{"type":"number","exclusiveMinimum":%d,"exclusiveMaximum":%d}`, lo, lo+1+rng.IntN(5)),
			fmt.Sprintf(`{"type":"number","exclusiveMaximum":%d}`, lo)}[rng.IntN(4)]
	case 4:
		return []string{`{"type":"boolean"}`, `{"type":"null"}`, `{"type":["string","null"],"maxLength":3}`}[rng.IntN(3)]
	case 5:
		return []string{`{"enum":["a","ab",1,null,{"x":[true]}]}`, `{"const":"k\"\\\n"}`, `{"type":"string","enum":["x","y",3]}`}[rng.IntN(3)]
	case 6:
		return []string{`{"type":"string","format":"date-time"}`, `{"type":"string","format":"uuid"}`, `{"type":"string","format":"date"}`, `{"type":"string","format":"time"}`}[rng.IntN(4)]
	case 7:
		return []string{`{"type":"string","pattern":"^[a-f0-9]{2,4}(-[A-Z]+)?$"}`, `{"type":"string","pattern":"^\\w+@\\w+\\.(com|org)$"}`, `{"type":"string","pattern":"x\\d"}`, `{"type":"string","pattern":"^[^\\s\"]*$"}`}[rng.IntN(4)]
	case 8:
		return `{}`
	case 9, 10:
		n := rng.IntN(5)
		var props, req []string
		for i := range n {
			name := fmt.Sprintf("p%d", i)
			props = append(props, fmt.Sprintf(`"%s":%s`, name, randomSchema(rng, depth+1)))
			if rng.IntN(2) == 0 {
				req = append(req, `"`+name+`"`)
			}
		}
		addl := []string{``, `,"additionalProperties":false`, `,"additionalProperties":true`}[rng.IntN(3)]
		return fmt.Sprintf(`{"type":"object","properties":{%s},"required":[%s]%s}`, strings.Join(props, ","), strings.Join(req, ","), addl)
	case 11:
		lo := rng.IntN(3)
		return fmt.Sprintf(`{"type":"array","items":%s,"minItems":%d,"maxItems":%d}`, randomSchema(rng, depth+1), lo, lo+rng.IntN(4))
	case 12:
		return fmt.Sprintf(`{"type":"array","prefixItems":[%s,%s],"items":%s}`, randomSchema(rng, depth+1), randomSchema(rng, depth+1), randomSchema(rng, depth+1))
	default:
		return fmt.Sprintf(`{"anyOf":[%s,%s]}`, randomSchema(rng, depth+1), randomSchema(rng, depth+1))
	}
}

// TestRandomSchemas generates random schemas and checks that every
// document the grammar produces is valid against the schema.
func TestRandomSchemas(t *testing.T) {
	schemas, docs := 150, 30
	if testing.Short() {
		schemas = 30
	}
	rng := rand.New(rand.NewPCG(randomSeed, 42))
	for i := range schemas {
		schema := randomSchema(rng, 0)
		g, sch := compileBoth(t, schema)
		for range docs {
			doc, ok := walk(g, rng)
			if !ok {
				continue
			}
			if err := validate(sch, string(doc)); err != nil {
				t.Errorf("schema %d %s\ndocument %s\n%v", i, schema, doc, err)
			}
		}
	}
}

var randomSeed uint64 = 42
