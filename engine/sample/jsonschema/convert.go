package jsonschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// Limits that keep the conversion and the grammar bounded.
const (
	maxNesting      = 128     // JSON nesting depth of the schema document
	maxRepeat       = 4096    // largest minLength/maxLength/minItems/maxItems accepted
	maxGrammarBytes = 1 << 20 // largest grammar text produced
	maxMergeDepth   = 32      // allOf / $ref resolution depth while merging
	maxMergeSteps   = 10000   // schema merges per conversion
	maxGenDepth     = 256     // nesting of subschemas being converted
	maxGenSteps     = 100000  // subschemas converted
	maxOptionalRun  = 512     // consecutive optional properties in an object
	maxIntDigits    = 16      // digits of an integer without bounds
	maxFracDigits   = 16      // digits of a number's fraction
	maxExpDigits    = 2       // digits of a number's exponent (keeps values within float64 range)
)

// intLimit is the largest magnitude accepted for integer bounds.
const intLimit = int64(1_000_000_000_000_000_000)

// Grammar returns a GBNF grammar (root rule "root") whose language is the
// JSON documents valid against schema.
func Grammar(schema []byte) (string, error) {
	g, _, err := Rules(schema, "")
	return g, err
}

// Rules is Grammar for embedding in a larger grammar: every rule name
// starts with prefix, and root names the rule that matches a document.
func Rules(schema []byte, prefix string) (gbnf string, root string, err error) {
	for i := 0; i < len(prefix); i++ {
		if !isNameByte(prefix[i]) {
			return "", "", fmt.Errorf("jsonschema: rule prefix %q: rule names are [a-zA-Z0-9-]+", prefix)
		}
	}
	doc, err := parseJSON(schema)
	if err != nil {
		return "", "", err
	}
	switch doc.(type) {
	case *object, bool:
	default:
		return "", "", errors.New("jsonschema: a schema must be a JSON object or a boolean")
	}
	c := newConv(doc, prefix)
	root = prefix + "root"
	c.reserve(root)
	expr, err := c.gen(doc, "", root)
	if err != nil {
		return "", "", err
	}
	c.define(root, expr)
	if err := c.checkLeftCycles(); err != nil {
		return "", "", err
	}
	out, err := c.render()
	if err != nil {
		return "", "", err
	}
	return out, root, nil
}

// AnyObject is the grammar of response_format json_object: any JSON object.
func AnyObject() string {
	c := newConv(nil, "")
	c.reserve("root")
	c.define("root", c.prim("object"))
	out, _ := c.render()
	return out
}

func isNameByte(b byte) bool {
	return b == '-' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

type conv struct {
	doc    any
	prefix string

	names  map[string]bool   // every rule name in use
	bodies map[string]string // rule name -> body
	order  []string          // rule names in creation order
	byBody map[string]string // body -> rule name, for sharing
	refs   map[string]string // $ref target pointer -> rule name
	size   int

	mergeSteps int
	steps      int
	depth      int

	// left-recursion check: rule -> rules it may begin with, without
	// consuming input.
	leftEdges map[string]map[string]bool
}

func newConv(doc any, prefix string) *conv {
	return &conv{
		doc:       doc,
		prefix:    prefix,
		names:     map[string]bool{},
		bodies:    map[string]string{},
		byBody:    map[string]string{},
		refs:      map[string]string{},
		leftEdges: map[string]map[string]bool{},
	}
}

func (c *conv) reserve(name string) { c.names[name] = true; c.order = append(c.order, name) }

func (c *conv) define(name, body string) {
	c.bodies[name] = body
	c.size += len(name) + len(body) + 6
}

// fresh returns an unused rule name built from hint.
func (c *conv) fresh(hint string) string {
	var b strings.Builder
	for i := 0; i < len(hint); i++ {
		if isNameByte(hint[i]) {
			b.WriteByte(hint[i])
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "-") {
			b.WriteByte('-')
		}
	}
	h := strings.Trim(b.String(), "-")
	if len(h) > 40 {
		h = h[:40]
	}
	if h == "" {
		h = "r"
	}
	name := c.prefix + h
	for i := 1; c.names[name] || primNames[h] && i == 1; i++ {
		name = c.prefix + h + "-" + strconv.Itoa(i)
	}
	c.reserve(name)
	return name
}

// rule returns the name of a rule with the given body, sharing identical
// bodies.
func (c *conv) rule(hint, body string) (string, error) {
	if n, ok := c.byBody[body]; ok {
		return n, nil
	}
	if c.size+len(body) > maxGrammarBytes {
		return "", fmt.Errorf("jsonschema: grammar exceeds %d bytes", maxGrammarBytes)
	}
	n := c.fresh(hint)
	c.define(n, body)
	c.byBody[body] = n
	return n, nil
}

// prim returns the name of a built-in rule, defining it (and the rules it
// uses) on first use.
func (c *conv) prim(name string) string {
	full := c.prefix + name
	if _, ok := c.bodies[full]; ok {
		return full
	}
	var body string
	switch name {
	case "ws":
		body = `( " " | "\n" [ \t]{0,20} )?`
	case "value":
		c.reserve(full)
		c.define(full, "")
		body = alt([]string{c.prim("object"), c.prim("array"), c.prim("string"), c.prim("number"), c.prim("boolean"), c.prim("null")})
		c.bodies[full] = body
		c.byBody[body] = full
		return full
	case "object":
		c.reserve(full)
		c.define(full, "")
		ws, v, s := c.prim("ws"), c.prim("value"), c.prim("string")
		kv := seq(s, ws, `":"`, ws, v, ws)
		body = seq(`"{"`, ws, "( "+kv, `( "," `+ws+" "+kv+" )* )?", `"}"`)
		c.bodies[full] = body
		c.byBody[body] = full
		return full
	case "array":
		c.reserve(full)
		c.define(full, "")
		ws, v := c.prim("ws"), c.prim("value")
		body = seq(`"["`, ws, "( "+v, ws, `( "," `+ws+" "+v+" "+ws+" )* )?", `"]"`)
		c.bodies[full] = body
		c.byBody[body] = full
		return full
	case "string":
		body = `"\"" ` + c.prim("char") + `* "\""`
	case "char":
		body = `[^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )`
	case "integer":
		body = `"-"? ( "0" | [1-9] [0-9]{0,` + strconv.Itoa(maxIntDigits-1) + `} )`
	case "number":
		body = c.prim("integer") + ` ( "." [0-9]{1,` + strconv.Itoa(maxFracDigits) + `} )? ( [eE] [-+]? [0-9]{1,` + strconv.Itoa(maxExpDigits) + `} )?`
	case "boolean":
		body = `"true" | "false"`
	case "null":
		body = `"null"`
	default:
		panic("jsonschema: unknown primitive " + name)
	}
	c.reserve(full)
	c.define(full, body)
	c.byBody[body] = full
	return full
}

// primNames are the built-in rule names (plus "root"), never used for
// generated rules.
var primNames = map[string]bool{
	"root": true, "ws": true, "value": true, "object": true, "array": true, "string": true,
	"char": true, "integer": true, "number": true, "boolean": true, "null": true,
}

// render writes the rules, root first.
func (c *conv) render() (string, error) {
	var b strings.Builder
	for _, n := range c.order {
		body, ok := c.bodies[n]
		if !ok {
			continue
		}
		b.WriteString(n)
		b.WriteString(" ::= ")
		b.WriteString(body)
		b.WriteByte('\n')
	}
	if b.Len() > maxGrammarBytes {
		return "", fmt.Errorf("jsonschema: grammar exceeds %d bytes", maxGrammarBytes)
	}
	return b.String(), nil
}

// quote is the GBNF literal for s.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '"':
			b.WriteString(`\"`)
		case ch == '\\':
			b.WriteString(`\\`)
		case ch == '\n':
			b.WriteString(`\n`)
		case ch == '\r':
			b.WriteString(`\r`)
		case ch == '\t':
			b.WriteString(`\t`)
		case ch < 0x20 || ch == 0x7f:
			fmt.Fprintf(&b, `\x%02X`, ch)
		default:
			b.WriteByte(ch)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// unsupported is the error for a keyword the converter cannot honour.
func unsupported(kw, ptr string) error {
	return fmt.Errorf("jsonschema: %q at %s is not supported", kw, ptrOrRoot(ptr))
}

func invalid(ptr, format string, args ...any) error {
	return fmt.Errorf("jsonschema: at %s: %s", ptrOrRoot(ptr), fmt.Sprintf(format, args...))
}

func ptrOrRoot(ptr string) string {
	if ptr == "" {
		return "/"
	}
	return ptr
}

// Keywords that constrain values but are not supported.
var unsupportedKeywords = []string{
	"patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
	"dependencies", "unevaluatedProperties", "unevaluatedItems", "contains",
	"minContains", "maxContains", "not", "if", "then", "else", "multipleOf",
	"$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor",
}

// known lists the keywords the converter understands.
var known = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "prefixItems": true, "additionalItems": true, "minItems": true, "maxItems": true,
	"uniqueItems": true, "enum": true, "const": true, "anyOf": true, "oneOf": true, "allOf": true,
	"$ref": true, "minLength": true, "maxLength": true, "minimum": true, "maximum": true,
	"exclusiveMinimum": true, "exclusiveMaximum": true, "format": true, "pattern": true,
	"minProperties": true, "maxProperties": true,
}

// constraining reports whether o has keywords other than annotations and
// unknown (ignored) ones, excluding the listed ones.
func constraining(o *object, except ...string) bool {
outer:
	for _, k := range o.keys {
		if !known[k] {
			continue
		}
		for _, e := range except {
			if k == e {
				continue outer
			}
		}
		return true
	}
	return false
}

func checkKeywords(o *object, ptr string) error {
	for _, k := range unsupportedKeywords {
		if _, ok := o.m[k]; ok {
			return unsupported(k, ptr)
		}
	}
	if v, ok := o.m["uniqueItems"]; ok && v != false {
		return unsupported("uniqueItems", ptr)
	}
	return nil
}

// gen returns a GBNF expression (a rule name or a single alternative-free
// term) for the values valid against s. from is the rule that would be
// entered without consuming input ("" when input has been consumed since
// the enclosing rule started).
func (c *conv) gen(s any, ptr, from string) (string, error) {
	c.steps++
	c.depth++
	defer func() { c.depth-- }()
	if c.depth > maxGenDepth || c.steps > maxGenSteps {
		return "", invalid(ptr, "schema too deep or too large to convert (more than %d levels or %d subschemas)", maxGenDepth, maxGenSteps)
	}
	switch t := s.(type) {
	case bool:
		if t {
			return c.prim("value"), nil
		}
		return "", invalid(ptr, "schema false allows no value")
	case *object:
		return c.genObject(t, ptr, from)
	}
	return "", invalid(ptr, "a schema must be an object or a boolean, not %s", jsonText(s))
}

func (c *conv) genObject(o *object, ptr, from string) (string, error) {
	if err := checkKeywords(o, ptr); err != nil {
		return "", err
	}
	if ref, ok := o.m["$ref"]; ok {
		rs, ok := ref.(string)
		if !ok {
			return "", invalid(ptr+"/$ref", "$ref must be a string")
		}
		if !constraining(o, "$ref") {
			return c.genRef(rs, ptr, from)
		}
		// Siblings of $ref also apply: merge the target into them. The
		// merged schema is one rule per (target, siblings), so recursive
		// references with siblings stay finite.
		rest := o.clone()
		rest.del("$ref")
		target, tptr, err := c.resolve(rs, ptr)
		if err != nil {
			return "", err
		}
		key := tptr + "\x00" + jsonText(rest)
		if n, ok := c.refs[key]; ok {
			c.addEdge(from, n)
			return n, nil
		}
		m, err := c.merge(rest, target, ptr, tptr, 0)
		if err != nil {
			return "", err
		}
		n := c.fresh(hintFor(tptr, ""))
		c.refs[key] = n
		c.addEdge(from, n)
		e, err := c.gen(m, ptr, n)
		if err != nil {
			return "", err
		}
		c.define(n, e)
		return n, nil
	}
	if all, ok := o.m["allOf"]; ok {
		arr, ok := all.([]any)
		if !ok || len(arr) == 0 {
			return "", invalid(ptr+"/allOf", "allOf must be a non-empty array")
		}
		m := o.clone()
		m.del("allOf")
		for i, sub := range arr {
			var err error
			m, err = c.merge(m, sub, ptr, ptr+"/allOf/"+strconv.Itoa(i), 0)
			if err != nil {
				return "", err
			}
		}
		return c.gen(m, ptr, from)
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		v, ok := o.m[kw]
		if !ok {
			continue
		}
		arr, ok := v.([]any)
		if !ok || len(arr) == 0 {
			return "", invalid(ptr+"/"+kw, "%s must be a non-empty array", kw)
		}
		rest := o.clone()
		rest.del(kw)
		restC := constraining(rest)
		var alts []string
		seen := map[string]bool{}
		for i, sub := range arr {
			sp := ptr + "/" + kw + "/" + strconv.Itoa(i)
			if sub == false {
				continue // a branch that allows nothing
			}
			if restC {
				m, err := c.merge(rest, sub, ptr, sp, 0)
				if err != nil {
					return "", err
				}
				sub = m
			}
			e, err := c.gen(sub, sp, from)
			if err != nil {
				return "", err
			}
			if !seen[e] {
				seen[e] = true
				alts = append(alts, e)
			}
		}
		if len(alts) == 0 {
			return "", invalid(ptr+"/"+kw, "no branch allows a value")
		}
		return c.rule(hintFor(ptr, kw), alt(alts))
	}
	_, hasConst := o.m["const"]
	_, hasEnum := o.m["enum"]
	if hasConst || hasEnum {
		kw := "enum"
		if hasConst {
			kw = "const"
		}
		for _, k := range o.keys {
			if known[k] && k != "type" && k != kw {
				return "", fmt.Errorf("jsonschema: %q with %q at %s is not supported", k, kw, ptrOrRoot(ptr))
			}
		}
	}
	if v, ok := o.m["const"]; ok {
		return c.genEnum(o, []any{v}, ptr+"/const")
	}
	if v, ok := o.m["enum"]; ok {
		arr, ok := v.([]any)
		if !ok {
			return "", invalid(ptr+"/enum", "enum must be an array")
		}
		return c.genEnum(o, arr, ptr+"/enum")
	}
	types, err := schemaTypes(o, ptr)
	if err != nil {
		return "", err
	}
	var alts []string
	for _, t := range types {
		e, err := c.genType(t, o, ptr, from)
		if err != nil {
			return "", err
		}
		alts = append(alts, e)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return c.rule(hintFor(ptr, "types"), alt(alts))
}

var allTypes = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

// schemaTypes lists the types to generate for o. Without "type", the
// types are inferred from type-specific keywords; with none, any value.
func schemaTypes(o *object, ptr string) ([]string, error) {
	v, ok := o.m["type"]
	if !ok {
		var ts []string
		has := func(kws ...string) bool {
			for _, k := range kws {
				if _, ok := o.m[k]; ok {
					return true
				}
			}
			return false
		}
		if has("properties", "required", "additionalProperties", "minProperties", "maxProperties") {
			ts = append(ts, "object")
		}
		if has("items", "prefixItems", "additionalItems", "minItems", "maxItems") {
			ts = append(ts, "array")
		}
		if has("minLength", "maxLength", "pattern", "format") {
			ts = append(ts, "string")
		}
		if has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") {
			ts = append(ts, "number")
		}
		if len(ts) == 0 {
			return []string{"any"}, nil
		}
		return ts, nil
	}
	var ts []string
	switch t := v.(type) {
	case string:
		ts = []string{t}
	case []any:
		for _, e := range t {
			s, ok := e.(string)
			if !ok {
				return nil, invalid(ptr+"/type", "type must be a string or an array of strings")
			}
			ts = append(ts, s)
		}
	default:
		return nil, invalid(ptr+"/type", "type must be a string or an array of strings")
	}
	if len(ts) == 0 {
		return nil, invalid(ptr+"/type", "empty type array allows no value")
	}
	seen := map[string]bool{}
	var out []string
	for _, t := range ts {
		okT := false
		for _, a := range allTypes {
			okT = okT || a == t
		}
		if !okT {
			return nil, invalid(ptr+"/type", "unknown type %q", t)
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	// "integer" is a subset of "number".
	if seen["number"] && seen["integer"] {
		var o2 []string
		for _, t := range out {
			if t != "integer" {
				o2 = append(o2, t)
			}
		}
		out = o2
	}
	return out, nil
}

func hintFor(ptr, kind string) string {
	i := strings.LastIndexByte(ptr, '/')
	last := ptr[i+1:]
	if last == "" || isAllDigits(last) {
		if kind != "" {
			return kind
		}
		return "r"
	}
	if kind == "" {
		return last
	}
	return last + "-" + kind
}

func isAllDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// typeOf is the JSON Schema type of a decoded value ("integer" for
// numbers with integral values).
func typeOf(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case *object:
		return "object"
	case json.Number:
		r, ok := new(big.Rat).SetString(t.String())
		if ok && r.IsInt() {
			return "integer"
		}
		return "number"
	}
	return ""
}

// genEnum emits the listed values literally, keeping those allowed by the
// schema's "type".
func (c *conv) genEnum(o *object, vals []any, ptr string) (string, error) {
	var allowed map[string]bool
	if _, ok := o.m["type"]; ok {
		ts, err := schemaTypes(o, ptr)
		if err != nil {
			return "", err
		}
		allowed = map[string]bool{}
		for _, t := range ts {
			allowed[t] = true
		}
		if allowed["number"] {
			allowed["integer"] = true
		}
	}
	root := &trieNode{}
	total, count := 0, 0
	for _, v := range vals {
		if allowed != nil && !allowed[typeOf(v)] {
			continue
		}
		text := jsonText(v)
		total += len(text)
		if total > maxGrammarBytes {
			return "", fmt.Errorf("jsonschema: enum at %s exceeds %d bytes", ptrOrRoot(ptr), maxGrammarBytes)
		}
		root.insert(text)
		count++
	}
	if count == 0 {
		return "", invalid(ptr, "no value of the enum matches the type")
	}
	hint := hintFor(strings.TrimSuffix(strings.TrimSuffix(ptr, "/enum"), "/const"), "enum")
	e, err := c.trieExpr(root, hint)
	if err != nil {
		return "", err
	}
	return c.rule(hint, e)
}

// trieNode is a trie over code points; enum values are emitted as a trie
// so that values sharing a prefix share grammar paths (a matcher then
// tracks one path per distinct prefix, not one per value).
type trieNode struct {
	end   bool
	keys  []rune
	child map[rune]*trieNode
}

func (n *trieNode) insert(s string) {
	for _, r := range s {
		if n.child == nil {
			n.child = map[rune]*trieNode{}
		}
		next, ok := n.child[r]
		if !ok {
			next = &trieNode{}
			n.child[r] = next
			n.keys = append(n.keys, r)
		}
		n = next
	}
	n.end = true
}

// trieExpr returns an expression for the strings below n (n.end means the
// empty string is one of them). Branching nodes become rules, so the
// expression nests no parentheses.
func (c *conv) trieExpr(n *trieNode, hint string) (string, error) {
	var alts []string
	for _, r := range n.keys {
		s := []rune{r}
		m := n.child[r]
		for !m.end && len(m.keys) == 1 {
			s = append(s, m.keys[0])
			m = m.child[m.keys[0]]
		}
		e := quote(string(s))
		if len(m.keys) > 0 {
			sub, err := c.trieExpr(m, hint)
			if err != nil {
				return "", err
			}
			e += " " + sub
		}
		alts = append(alts, e)
	}
	if len(alts) == 1 && !n.end {
		return alts[0], nil
	}
	name, err := c.rule(hint, alt(alts))
	if err != nil {
		return "", err
	}
	if n.end {
		name += "?"
	}
	return name, nil
}

// resolve finds the schema a local $ref points to.
func (c *conv) resolve(ref, ptr string) (any, string, error) {
	if ref == "#" {
		return c.doc, "", nil
	}
	if !strings.HasPrefix(ref, "#/") {
		return nil, "", invalid(ptr+"/$ref", "$ref %q: only local references (#/...) are supported", ref)
	}
	cur := c.doc
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch t := cur.(type) {
		case *object:
			v, ok := t.m[tok]
			if !ok {
				return nil, "", invalid(ptr+"/$ref", "$ref %q does not resolve", ref)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(t) {
				return nil, "", invalid(ptr+"/$ref", "$ref %q does not resolve", ref)
			}
			cur = t[i]
		default:
			return nil, "", invalid(ptr+"/$ref", "$ref %q does not resolve", ref)
		}
	}
	return cur, ref[1:], nil
}

// genRef returns the rule for a $ref target, generating it once; recursive
// references become recursive rules.
func (c *conv) genRef(ref, ptr, from string) (string, error) {
	target, tptr, err := c.resolve(ref, ptr)
	if err != nil {
		return "", err
	}
	if tptr == "" {
		// the root schema
		c.addEdge(from, c.prefix+"root")
		return c.prefix + "root", nil
	}
	if n, ok := c.refs[tptr]; ok {
		c.addEdge(from, n)
		return n, nil
	}
	n := c.fresh(hintFor(tptr, ""))
	c.refs[tptr] = n
	c.addEdge(from, n)
	e, err := c.gen(target, tptr, n)
	if err != nil {
		return "", err
	}
	if c.size+len(e) > maxGrammarBytes {
		return "", fmt.Errorf("jsonschema: grammar exceeds %d bytes", maxGrammarBytes)
	}
	c.define(n, e)
	return n, nil
}

func (c *conv) addEdge(from, to string) {
	if from == "" {
		return
	}
	m := c.leftEdges[from]
	if m == nil {
		m = map[string]bool{}
		c.leftEdges[from] = m
	}
	m[to] = true
}

// checkLeftCycles refuses $ref cycles that make no progress (a rule that
// can reach itself without consuming input).
func (c *conv) checkLeftCycles() error {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var visit func(n string) error
	visit = func(n string) error {
		color[n] = grey
		keys := make([]string, 0, len(c.leftEdges[n]))
		for k := range c.leftEdges[n] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, m := range keys {
			switch color[m] {
			case grey:
				return fmt.Errorf("jsonschema: $ref cycle without progress through rule %s", m)
			case white:
				if err := visit(m); err != nil {
					return err
				}
			}
		}
		color[n] = black
		return nil
	}
	names := make([]string, 0, len(c.leftEdges))
	for n := range c.leftEdges {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if color[n] == white {
			if err := visit(n); err != nil {
				return err
			}
		}
	}
	return nil
}
