package jsonschema

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

func (c *conv) genType(t string, o *object, ptr, from string) (string, error) {
	switch t {
	case "any":
		return c.prim("value"), nil
	case "null", "boolean":
		return c.prim(t), nil
	case "string":
		return c.genString(o, ptr)
	case "integer":
		return c.genInteger(o, ptr)
	case "number":
		return c.genNumber(o, ptr)
	case "array":
		return c.genArray(o, ptr)
	case "object":
		return c.genObj(o, ptr)
	}
	return "", invalid(ptr, "unknown type %q", t)
}

// count reads a non-negative integer keyword; present is false when absent.
func count(o *object, kw, ptr string) (n int, present bool, err error) {
	v, ok := o.m[kw]
	if !ok {
		return 0, false, nil
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, false, invalid(ptr+"/"+kw, "%s must be a non-negative integer", kw)
	}
	r, ok := new(big.Rat).SetString(num.String())
	if !ok || !r.IsInt() || r.Sign() < 0 {
		return 0, false, invalid(ptr+"/"+kw, "%s must be a non-negative integer", kw)
	}
	if r.Num().Cmp(big.NewInt(maxRepeat)) > 0 {
		return 0, false, fmt.Errorf("jsonschema: %s %s at %s exceeds the supported limit %d", kw, num, ptrOrRoot(ptr), maxRepeat)
	}
	return int(r.Num().Int64()), true, nil
}

// rep renders expr (an atom or group) repeated between a and b times
// (b < 0: unbounded).
func rep(expr string, a, b int) string {
	switch {
	case b == 0:
		return ""
	case a == 0 && b < 0:
		return expr + "*"
	case a == 1 && b < 0:
		return expr + "+"
	case b < 0:
		return expr + "{" + strconv.Itoa(a) + ",}"
	case a == 0 && b == 1:
		return expr + "?"
	case a == 1 && b == 1:
		return expr
	case a == b:
		return expr + "{" + strconv.Itoa(a) + "}"
	}
	return expr + "{" + strconv.Itoa(a) + "," + strconv.Itoa(b) + "}"
}

func (c *conv) genString(o *object, ptr string) (string, error) {
	if f, ok := o.m["format"]; ok {
		fs, _ := f.(string)
		for _, k := range []string{"pattern", "minLength", "maxLength"} {
			if _, ok := o.m[k]; ok {
				return "", fmt.Errorf("jsonschema: %q with \"format\" at %s is not supported", k, ptrOrRoot(ptr))
			}
		}
		return c.genFormat(fs, ptr)
	}
	if p, ok := o.m["pattern"]; ok {
		ps, ok := p.(string)
		if !ok {
			return "", invalid(ptr+"/pattern", "pattern must be a string")
		}
		for _, k := range []string{"minLength", "maxLength"} {
			if _, ok := o.m[k]; ok {
				return "", fmt.Errorf("jsonschema: %q with \"pattern\" at %s is not supported", k, ptrOrRoot(ptr))
			}
		}
		return c.genPattern(ps, ptr)
	}
	lo, _, err := count(o, "minLength", ptr)
	if err != nil {
		return "", err
	}
	hi, hasHi, err := count(o, "maxLength", ptr)
	if err != nil {
		return "", err
	}
	if !hasHi {
		hi = -1
		if lo == 0 {
			return c.prim("string"), nil
		}
	} else if hi < lo {
		return "", invalid(ptr, "maxLength %d < minLength %d allows no value", hi, lo)
	}
	body := seq(`"\""`, rep(c.prim("char"), lo, hi), `"\""`)
	return c.rule(hintFor(ptr, "string"), body)
}

func (c *conv) genFormat(f, ptr string) (string, error) {
	hex := "[0-9a-fA-F]"
	var body string
	switch f {
	case "uuid":
		body = `"\"" ` + hex + `{8} "-" ` + hex + `{4} "-" ` + hex + `{4} "-" ` + hex + `{4} "-" ` + hex + `{12} "\""`
	case "date":
		body = `"\"" ` + c.datePart() + ` "\""`
	case "time":
		body = `"\"" ` + c.timePart() + ` "\""`
	case "date-time":
		body = `"\"" ` + c.datePart() + ` "T" ` + c.timePart() + ` "\""`
	default:
		return "", fmt.Errorf("jsonschema: \"format\": %q at %s is not supported", f, ptrOrRoot(ptr))
	}
	return c.rule(hintFor(ptr, f), body)
}

// datePart is a full-date (RFC 3339) rule; February 29 is left out so that
// every generated date exists.
func (c *conv) datePart() string {
	n, _ := c.rule("date", `[0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) )`)
	return n
}

// timePart is a full-time (RFC 3339) rule, without leap seconds.
func (c *conv) timePart() string {
	n, _ := c.rule("time", `( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )`)
	return n
}

// bound reads a numeric keyword as a rational; present is false when
// absent or a boolean (draft-04 exclusive flags).
func bound(o *object, kw, ptr string) (*big.Rat, bool, error) {
	v, ok := o.m[kw]
	if !ok {
		return nil, false, nil
	}
	if _, isBool := v.(bool); isBool {
		return nil, false, nil
	}
	num, ok := v.(json.Number)
	if !ok {
		return nil, false, invalid(ptr+"/"+kw, "%s must be a number", kw)
	}
	r, ok := new(big.Rat).SetString(num.String())
	if !ok {
		return nil, false, invalid(ptr+"/"+kw, "%s must be a number", kw)
	}
	return r, true, nil
}

func floorRat(r *big.Rat) *big.Int {
	q := new(big.Int)
	m := new(big.Int)
	q.DivMod(r.Num(), r.Denom(), m) // Euclidean: floor for positive denominators
	return q
}

func ceilRat(r *big.Rat) *big.Int {
	f := floorRat(r)
	if !r.IsInt() {
		f.Add(f, big.NewInt(1))
	}
	return f
}

func (c *conv) genInteger(o *object, ptr string) (string, error) {
	var lo, hi *big.Int
	one := big.NewInt(1)
	tighterLo := func(v *big.Int) {
		if lo == nil || v.Cmp(lo) > 0 {
			lo = v
		}
	}
	tighterHi := func(v *big.Int) {
		if hi == nil || v.Cmp(hi) < 0 {
			hi = v
		}
	}
	exMin, _ := o.m["exclusiveMinimum"].(bool)
	exMax, _ := o.m["exclusiveMaximum"].(bool)
	if r, ok, err := bound(o, "minimum", ptr); err != nil {
		return "", err
	} else if ok {
		if exMin {
			tighterLo(new(big.Int).Add(floorRat(r), one))
		} else {
			tighterLo(ceilRat(r))
		}
	}
	if r, ok, err := bound(o, "exclusiveMinimum", ptr); err != nil {
		return "", err
	} else if ok {
		tighterLo(new(big.Int).Add(floorRat(r), one))
	}
	if r, ok, err := bound(o, "maximum", ptr); err != nil {
		return "", err
	} else if ok {
		if exMax {
			tighterHi(new(big.Int).Sub(ceilRat(r), one))
		} else {
			tighterHi(floorRat(r))
		}
	}
	if r, ok, err := bound(o, "exclusiveMaximum", ptr); err != nil {
		return "", err
	} else if ok {
		tighterHi(new(big.Int).Sub(ceilRat(r), one))
	}
	if lo == nil && hi == nil {
		return c.prim("integer"), nil
	}
	limit := big.NewInt(intLimit)
	negLimit := new(big.Int).Neg(limit)
	if lo != nil && lo.Cmp(limit) > 0 || hi != nil && hi.Cmp(negLimit) < 0 {
		return "", fmt.Errorf("jsonschema: integer bounds at %s beyond ±%d are not supported", ptrOrRoot(ptr), intLimit)
	}
	// Bounds beyond the limit are clamped (a subset of the valid values).
	if lo != nil && lo.Cmp(negLimit) < 0 {
		lo = negLimit
	}
	if hi != nil && hi.Cmp(limit) > 0 {
		hi = limit
	}
	dflt := int64(1)
	for range maxIntDigits {
		dflt *= 10
	}
	dflt-- // largest unbounded magnitude: 16 nines
	var l, h int64
	switch {
	case lo == nil:
		h = hi.Int64()
		l = min(-dflt, h)
	case hi == nil:
		l = lo.Int64()
		h = max(dflt, l)
	default:
		l, h = lo.Int64(), hi.Int64()
	}
	if l > h {
		return "", invalid(ptr, "integer range [%d, %d] is empty", l, h)
	}
	return c.rule(hintFor(ptr, "int"), intRange(l, h))
}

func (c *conv) genArray(o *object, ptr string) (string, error) {
	var prefix []any
	prefixKw := "prefixItems"
	var extra any
	extraSet := false
	if v, ok := o.m["prefixItems"]; ok {
		arr, ok := v.([]any)
		if !ok {
			return "", invalid(ptr+"/prefixItems", "prefixItems must be an array")
		}
		prefix = arr
		if it, ok := o.m["items"]; ok {
			extra, extraSet = it, true
		}
	} else if v, ok := o.m["items"]; ok {
		if arr, ok := v.([]any); ok { // draft-07 tuple form
			prefix, prefixKw = arr, "items"
			if it, ok := o.m["additionalItems"]; ok {
				extra, extraSet = it, true
			}
		} else {
			extra, extraSet = v, true
		}
	}
	m, _, err := count(o, "minItems", ptr)
	if err != nil {
		return "", err
	}
	M, hasMax, err := count(o, "maxItems", ptr)
	if err != nil {
		return "", err
	}
	if !hasMax {
		M = -1
	} else if M < m {
		return "", invalid(ptr, "maxItems %d < minItems %d allows no value", M, m)
	}
	k := len(prefix)
	if M >= 0 && M < k {
		k = M
	}
	extraOK := true
	switch {
	case extraSet && extra == false:
		extraOK = false
	case !extraSet && len(prefix) > 0:
		// Extra items are allowed but only emitted when minItems needs them.
		extraOK = m > k
		extra = true
	case !extraSet:
		extra = true
	}
	minE, maxE := max(0, m-k), -1
	if M >= 0 {
		maxE = M - k
	}
	if !extraOK {
		maxE = 0
	}
	if maxE >= 0 && minE > maxE {
		return "", invalid(ptr, "minItems %d needs more items than the schema allows", m)
	}
	ws := c.prim("ws")
	var items []string
	for i := 0; i < k; i++ {
		e, err := c.gen(prefix[i], ptr+"/"+prefixKw+"/"+strconv.Itoa(i), "")
		if err != nil {
			return "", err
		}
		items = append(items, e)
	}
	var ex string
	if maxE != 0 {
		ep := ptr + "/items"
		if prefixKw == "items" {
			ep = ptr + "/additionalItems"
		}
		ex, err = c.gen(extra, ep, "")
		if err != nil {
			return "", err
		}
	}
	var body string
	if k > 0 {
		parts := []string{`"["`, ws, items[0], ws}
		for _, it := range items[1:] {
			parts = append(parts, `","`, ws, it, ws)
		}
		if maxE != 0 {
			parts = append(parts, rep(`( "," `+ws+" "+ex+" "+ws+" )", minE, maxE))
		}
		parts = append(parts, `"]"`)
		body = seq(parts...)
	} else if maxE == 0 {
		body = seq(`"["`, ws, `"]"`)
	} else {
		restMax := -1
		if maxE > 0 {
			restMax = maxE - 1
		}
		elems := seq(ex, ws, rep(`( "," `+ws+" "+ex+" "+ws+" )", max(minE-1, 0), restMax))
		if minE == 0 {
			elems = "( " + elems + " )?"
		}
		body = seq(`"["`, ws, elems, `"]"`)
	}
	return c.rule(hintFor(ptr, "array"), body)
}

type prop struct {
	name     string
	schema   any
	required bool
}

func (c *conv) genObj(o *object, ptr string) (string, error) {
	var props []prop
	index := map[string]int{}
	if v, ok := o.m["properties"]; ok {
		po, ok := v.(*object)
		if !ok {
			return "", invalid(ptr+"/properties", "properties must be an object")
		}
		for _, k := range po.keys {
			index[k] = len(props)
			props = append(props, prop{name: k, schema: po.m[k]})
		}
	}
	addl, hasAddl := o.m["additionalProperties"]
	if v, ok := o.m["required"]; ok {
		arr, ok := v.([]any)
		if !ok {
			return "", invalid(ptr+"/required", "required must be an array of strings")
		}
		for _, r := range arr {
			s, ok := r.(string)
			if !ok {
				return "", invalid(ptr+"/required", "required must be an array of strings")
			}
			i, ok := index[s]
			if !ok {
				// A required property without a schema of its own is
				// governed by additionalProperties.
				var ps any = true
				if hasAddl {
					ps = addl
				}
				if ps == false {
					return "", invalid(ptr+"/required", "required property %q is excluded by additionalProperties", s)
				}
				i = len(props)
				index[s] = i
				props = append(props, prop{name: s, schema: ps})
			}
			props[i].required = true
		}
	}
	minP, hasMinP, err := count(o, "minProperties", ptr)
	if err != nil {
		return "", err
	}
	maxP, hasMaxP, err := count(o, "maxProperties", ptr)
	if err != nil {
		return "", err
	}
	ws := c.prim("ws")
	if len(props) == 0 {
		if hasAddl && addl == false {
			if minP > 0 {
				return "", invalid(ptr, "minProperties %d with no allowed property", minP)
			}
			return c.rule(hintFor(ptr, "object"), seq(`"{"`, ws, `"}"`))
		}
		if hasMinP && minP > 0 || hasMaxP {
			kw := "minProperties"
			if hasMaxP {
				kw = "maxProperties"
			}
			return "", unsupported(kw, ptr)
		}
		if !hasAddl {
			addl = true
		}
		v, err := c.gen(addl, ptr+"/additionalProperties", "")
		if err != nil {
			return "", err
		}
		kv := seq(c.prim("string"), ws, `":"`, ws, v, ws)
		body := seq(`"{"`, ws, "( "+kv, `( "," `+ws+" "+kv+" )* )?", `"}"`)
		return c.rule(hintFor(ptr, "object"), body)
	}
	// Declared properties only, in declared order.
	var kvs []string
	var req []bool
	nreq := 0
	for _, p := range props {
		pp := ptr + "/properties/" + pointerToken(p.name)
		if p.schema == false {
			if p.required {
				return "", invalid(pp, "required property %q has schema false", p.name)
			}
			continue
		}
		v, err := c.gen(p.schema, pp, "")
		if err != nil {
			return "", err
		}
		kvs = append(kvs, seq(quote(jsonString(p.name)), ws, `":"`, ws, v, ws))
		req = append(req, p.required)
		if p.required {
			nreq++
		}
	}
	if hasMinP && minP > nreq {
		return "", unsupported("minProperties", ptr)
	}
	if hasMaxP && maxP < len(kvs) {
		return "", unsupported("maxProperties", ptr)
	}
	n := len(kvs)
	run := 0
	for _, r := range req {
		if r {
			run = 0
		} else if run++; run > maxOptionalRun {
			return "", fmt.Errorf("jsonschema: more than %d consecutive optional properties at %s are not supported", maxOptionalRun, ptrOrRoot(ptr))
		}
	}
	// after[i]: the next property written is one of i.. (skipping only
	// optional ones); it is followed by the tail ( "," ws after[j+1] ),
	// optional when no required property remains. The comma and the
	// whitespace come before the choice of property, so the choice is
	// made on the key's bytes (few parse stacks even with many optional
	// properties).
	reqFrom := make([]bool, n+1)
	for i := n - 1; i >= 0; i-- {
		reqFrom[i] = req[i] || reqFrom[i+1]
	}
	tail := func(i int, after string) string {
		if i == n {
			return ""
		}
		t := seq(`","`, ws, after)
		if !reqFrom[i] {
			t = "( " + t + " )?"
		}
		return t
	}
	after := make([]string, n+1)
	for i := n - 1; i >= 0; i-- {
		body := seq(kvs[i], tail(i+1, after[i+1]))
		if !req[i] && i+1 < n {
			body += " | " + after[i+1]
		}
		r, err := c.rule(hintFor(ptr, "after"), body)
		if err != nil {
			return "", err
		}
		after[i] = r
	}
	start := after[0]
	if !reqFrom[0] {
		start += "?"
	}
	return c.rule(hintFor(ptr, "object"), seq(`"{"`, ws, start, `"}"`))
}

// typeSet returns the set named by a "type" value.
func typeSet(v any) map[string]bool {
	s := map[string]bool{}
	switch t := v.(type) {
	case string:
		s[t] = true
	case []any:
		for _, e := range t {
			if str, ok := e.(string); ok {
				s[str] = true
			}
		}
	}
	return s
}

// merge combines two schemas that must both hold (allOf, $ref siblings,
// anyOf siblings) when that is possible keyword by keyword.
func (c *conv) merge(a, b any, aptr, bptr string, depth int) (*object, error) {
	c.mergeSteps++
	if depth > maxMergeDepth || c.mergeSteps > maxMergeSteps {
		return nil, invalid(bptr, "allOf/$ref merging too deep or too large")
	}
	ao, err := c.flatten(a, aptr, depth)
	if err != nil {
		return nil, err
	}
	bo, err := c.flatten(b, bptr, depth)
	if err != nil {
		return nil, err
	}
	// additionalProperties other than true restricts the other side's
	// properties.
	for _, pair := range [][2]*object{{ao, bo}, {bo, ao}} {
		x, y := pair[0], pair[1]
		if ap, ok := x.m["additionalProperties"]; ok && ap != true {
			xp, _ := x.m["properties"].(*object)
			if yp, ok := y.m["properties"].(*object); ok {
				for _, k := range yp.keys {
					if xp == nil || xp.m[k] == nil {
						return nil, fmt.Errorf("jsonschema: allOf at %s cannot be merged: property %q is excluded by additionalProperties", ptrOrRoot(bptr), k)
					}
				}
			}
		}
	}
	out := ao.clone()
	for _, k := range bo.keys {
		bv := bo.m[k]
		av, ok := out.m[k]
		if !ok {
			out.set(k, bv)
			continue
		}
		switch k {
		case "title", "description", "examples", "default", "$comment", "$schema", "$id", "$defs", "definitions":
			continue
		case "properties":
			ap, ok1 := av.(*object)
			bp, ok2 := bv.(*object)
			if !ok1 || !ok2 {
				return nil, invalid(bptr+"/properties", "properties must be an object")
			}
			mp := ap.clone()
			for _, pk := range bp.keys {
				if x, ok := mp.m[pk]; ok {
					m, err := c.merge(x, bp.m[pk], aptr+"/properties/"+pointerToken(pk), bptr+"/properties/"+pointerToken(pk), depth+1)
					if err != nil {
						return nil, err
					}
					mp.set(pk, m)
				} else {
					mp.set(pk, bp.m[pk])
				}
			}
			out.set(k, mp)
		case "required":
			ar, _ := av.([]any)
			br, _ := bv.([]any)
			seen := map[string]bool{}
			var u []any
			for _, r := range append(append([]any{}, ar...), br...) {
				if s, ok := r.(string); ok && !seen[s] {
					seen[s] = true
					u = append(u, s)
				}
			}
			out.set(k, u)
		case "type":
			as, bs := typeSet(av), typeSet(bv)
			var inter []any
			for _, t := range allTypes {
				inA := as[t] || t == "integer" && as["number"]
				inB := bs[t] || t == "integer" && bs["number"]
				if inA && inB {
					inter = append(inter, t)
				}
			}
			if len(inter) == 0 {
				return nil, invalid(bptr, "allOf types %s and %s do not intersect", jsonText(av), jsonText(bv))
			}
			out.set(k, inter)
		case "minimum", "minLength", "minItems", "minProperties", "maximum", "maxLength", "maxItems", "maxProperties":
			an, ok1 := av.(json.Number)
			bn, ok2 := bv.(json.Number)
			ar, okA := new(big.Rat).SetString(string(an))
			br, okB := new(big.Rat).SetString(string(bn))
			if !ok1 || !ok2 || !okA || !okB {
				return nil, invalid(bptr+"/"+k, "%s must be a number", k)
			}
			takeB := ar.Cmp(br) < 0 // b larger
			if strings.HasPrefix(k, "max") {
				takeB = !takeB
			}
			if takeB {
				out.set(k, bv)
			}
		case "items", "additionalProperties":
			if jsonEqual(av, bv) {
				continue
			}
			if _, isArr := av.([]any); isArr {
				return nil, fmt.Errorf("jsonschema: allOf at %s cannot be merged: %q differs", ptrOrRoot(bptr), k)
			}
			if _, isArr := bv.([]any); isArr {
				return nil, fmt.Errorf("jsonschema: allOf at %s cannot be merged: %q differs", ptrOrRoot(bptr), k)
			}
			m, err := c.merge(av, bv, aptr+"/"+k, bptr+"/"+k, depth+1)
			if err != nil {
				return nil, err
			}
			out.set(k, m)
		default:
			if !jsonEqual(av, bv) {
				return nil, fmt.Errorf("jsonschema: allOf at %s cannot be merged: %q differs", ptrOrRoot(bptr), k)
			}
		}
	}
	return out, nil
}

// flatten turns a schema into an object without $ref and allOf, resolving
// and merging them.
func (c *conv) flatten(s any, ptr string, depth int) (*object, error) {
	switch t := s.(type) {
	case bool:
		if t {
			return newObject(), nil
		}
		return nil, invalid(ptr, "schema false allows no value")
	case *object:
		if err := checkKeywords(t, ptr); err != nil {
			return nil, err
		}
		o := t
		if ref, ok := o.m["$ref"]; ok {
			rs, ok := ref.(string)
			if !ok {
				return nil, invalid(ptr+"/$ref", "$ref must be a string")
			}
			target, tptr, err := c.resolve(rs, ptr)
			if err != nil {
				return nil, err
			}
			rest := o.clone()
			rest.del("$ref")
			o, err = c.merge(rest, target, ptr, tptr, depth+1)
			if err != nil {
				return nil, err
			}
		}
		if all, ok := o.m["allOf"]; ok {
			arr, ok := all.([]any)
			if !ok || len(arr) == 0 {
				return nil, invalid(ptr+"/allOf", "allOf must be a non-empty array")
			}
			m := o.clone()
			m.del("allOf")
			for i, sub := range arr {
				var err error
				m, err = c.merge(m, sub, ptr, ptr+"/allOf/"+strconv.Itoa(i), depth+1)
				if err != nil {
					return nil, err
				}
			}
			o = m
		}
		return o, nil
	}
	return nil, invalid(ptr, "a schema must be an object or a boolean")
}

// genNumber handles numbers; bounds must have integral values. A bounded
// number is written without exponent: an integer part in range and a
// fraction of at most 16 digits, zero at an inclusive integer bound and
// non-zero at an exclusive one.
func (c *conv) genNumber(o *object, ptr string) (string, error) {
	type bnd struct {
		v   *big.Int
		ex  bool
		set bool
	}
	var lo, hi bnd
	exMin, _ := o.m["exclusiveMinimum"].(bool)
	exMax, _ := o.m["exclusiveMaximum"].(bool)
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		r, ok, err := bound(o, k, ptr)
		if err != nil {
			return "", err
		}
		if !ok {
			continue
		}
		if !r.IsInt() {
			return "", fmt.Errorf("jsonschema: %q at %s with a non-integral value is not supported for type number", k, ptrOrRoot(ptr))
		}
		v := new(big.Int).Set(r.Num())
		isMin := strings.HasSuffix(k, "inimum")
		ex := strings.HasPrefix(k, "exclusive") || isMin && exMin || !isMin && exMax
		b := &hi
		if isMin {
			b = &lo
		}
		cmp := 0
		if b.set {
			cmp = v.Cmp(b.v)
			if !isMin {
				cmp = -cmp
			}
		}
		// Keep the tighter bound (exclusive wins on equal values).
		if !b.set || cmp > 0 || cmp == 0 && ex {
			*b = bnd{v: v, ex: ex, set: true}
		}
	}
	if !lo.set && !hi.set {
		return c.prim("number"), nil
	}
	limit := big.NewInt(intLimit)
	negLimit := new(big.Int).Neg(limit)
	if lo.set && lo.v.Cmp(limit) > 0 || hi.set && hi.v.Cmp(negLimit) < 0 {
		return "", fmt.Errorf("jsonschema: number bounds at %s beyond ±%d are not supported", ptrOrRoot(ptr), intLimit)
	}
	if lo.set && lo.v.Cmp(negLimit) < 0 {
		lo = bnd{v: negLimit, set: true}
	}
	if hi.set && hi.v.Cmp(limit) > 0 {
		hi = bnd{v: limit, set: true}
	}
	dflt := int64(1)
	for range maxIntDigits {
		dflt *= 10
	}
	dflt--
	var l, h int64
	switch {
	case !lo.set:
		h = hi.v.Int64()
		l = min(-dflt, h-1)
	case !hi.set:
		l = lo.v.Int64()
		h = max(dflt, l+1)
	default:
		l, h = lo.v.Int64(), hi.v.Int64()
	}
	if l > h || l == h && (lo.ex || hi.ex) {
		return "", invalid(ptr, "number range is empty")
	}
	var alts []string
	if h >= 0 { // non-negative values
		a, aEx := int64(0), false
		if l >= 0 {
			a, aEx = l, lo.ex
		}
		if !(h == 0 && hi.ex) {
			alts = append(alts, magnitudes(a, h, aEx, hi.ex)...)
		}
	}
	if l < 0 { // negative values: magnitudes in [max(-h, 0), -l]
		a, aEx := int64(0), false
		if h < 0 {
			a, aEx = -h, hi.ex
		} else if h == 0 && hi.ex {
			aEx = true
		}
		if m := magnitudes(a, -l, aEx, lo.ex); len(m) > 0 {
			alts = append(alts, `"-" `+group(m))
		}
	}
	if len(alts) == 0 {
		return "", invalid(ptr, "number range is empty")
	}
	return c.rule(hintFor(ptr, "num"), alt(alts))
}

// magnitudes returns alternatives for the non-negative decimals m with
// a <= m <= b (a < m when aEx, m < b when bEx), a <= b integers.
func magnitudes(a, b int64, aEx, bEx bool) []string {
	frac := `( "." [0-9]{1,` + strconv.Itoa(maxFracDigits) + `} )?`
	zeroFrac := `( "." "0"{1,` + strconv.Itoa(maxFracDigits) + `} )?`
	nzFrac := `"." [0-9]{0,` + strconv.Itoa(maxFracDigits-1) + `} [1-9]`
	lit := func(n int64) string { return quote(strconv.FormatInt(n, 10)) }
	if a == b {
		if aEx || bEx {
			return nil
		}
		return []string{seq(lit(a), zeroFrac)}
	}
	var alts []string
	if aEx {
		alts = append(alts, seq(lit(a), nzFrac))
	} else {
		alts = append(alts, seq(lit(a), frac))
	}
	if a+1 <= b-1 {
		alts = append(alts, seq("( "+intRange(a+1, b-1)+" )", frac))
	}
	if !bEx {
		alts = append(alts, seq(lit(b), zeroFrac))
	}
	return alts
}
