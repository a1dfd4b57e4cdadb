package jsonschema

import (
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"shoal/engine/sample/grammar"
)

func randomPattern(rng *rand.Rand, depth int) string {
	var b strings.Builder
	n := 1 + rng.IntN(4)
	for range n {
		var atom string
		switch k := rng.IntN(12); {
		case k < 3:
			atom = string("abc"[rng.IntN(3)])
		case k == 3:
			atom = "."
		case k == 4:
			atom = []string{`\d`, `\w`, `\s`, `\D`, `\W`, `\S`}[rng.IntN(6)]
		case k == 5:
			atom = []string{`[a-c]`, `[^a]`, `[\d_]`, `[^\s"]`, `[-x]`, `[\\"]`}[rng.IntN(6)]
		case k == 6:
			atom = []string{`\.`, `\\`, `"`, `\t`, `\n`, `é`, `\u00e9`, `x{`, `\x41`}[rng.IntN(9)]
		case k < 9 && depth < 2:
			atom = "(" + randomPattern(rng, depth+1) + "|" + randomPattern(rng, depth+1) + ")"
		case depth < 2:
			atom = "(?:" + randomPattern(rng, depth+1) + ")"
		default:
			atom = "z"
		}
		b.WriteString(atom)
		if rng.IntN(3) == 0 {
			b.WriteString([]string{"?", "*", "+", "{1,3}", "{2}", "{0,2}", "*?"}[rng.IntN(7)])
		}
	}
	return b.String()
}

func TestPatternDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []rune("abcz0_ -\t\n\".\\é")
	tested, generated := 0, 0
	for range 300 {
		pat := randomPattern(rng, 0)
		anchored := rng.IntN(3) > 0
		if anchored {
			pat = "^" + pat + "$"
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			continue
		}
		schema, _ := json.Marshal(map[string]any{"type": "string", "pattern": pat})
		src, err := Grammar(schema)
		if err != nil {
			if strings.Contains(err.Error(), "empty string") {
				continue // (x*)* style, refused by design
			}
			t.Fatalf("pattern %q: %v", pat, err)
		}
		g, err := grammar.Parse(src)
		if err != nil {
			t.Fatalf("pattern %q: %v\n%s", pat, err, src)
		}
		tested++
		for range 10 {
			doc, ok := walkN(g, rng, 1000)
			if !ok {
				continue
			}
			generated++
			var s string
			if err := json.Unmarshal(doc, &s); err != nil {
				t.Fatalf("pattern %q: %q is not a JSON string: %v", pat, doc, err)
			}
			if !re.MatchString(s) {
				t.Errorf("pattern %q: generated %q does not match", pat, s)
			}
		}
		if !anchored {
			continue
		}
		for range 100 {
			r := make([]rune, rng.IntN(7))
			for i := range r {
				r[i] = alphabet[rng.IntN(len(alphabet))]
			}
			s := string(r)
			if re.MatchString(s) && !accepts(g, jsonString(s)) {
				t.Errorf("pattern %q: refuses matching %q", pat, jsonString(s))
			}
		}
	}
	if tested < 150 || generated < tested*5 {
		t.Errorf("only %d patterns tested, %d strings generated", tested, generated)
	}
	t.Logf("%d patterns, %d generated strings", tested, generated)
}
