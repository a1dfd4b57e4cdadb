package openai

import (
	"errors"
	"sort"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// Filters and methods where gonja differs from Jinja in what chat
// templates use. Template dictionaries (the messages, the tools, the
// calls' arguments) are *exec.Dict, ordered as the request gave them;
// gonja's dict methods go through a Go map and come back sorted by key
// (nested dictionaries too), its items and dictsort filters see no
// entries at all. Python's dicts keep their order, so these keep it.

// dictMethods are gonja's dictionary methods with keys, values, items,
// get and copy in the dictionary's order.
func dictMethods() *exec.MethodSet[map[string]any] {
	m := map[string]exec.Method[map[string]any]{
		"keys":   eachPair(func(p *exec.Pair) any { return p.Key.Interface() }),
		"values": eachPair(func(p *exec.Pair) any { return p.Value.Interface() }),
		"items":  eachPair(func(p *exec.Pair) any { return []any{p.Key.Interface(), p.Value.Interface()} }),
		"get": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
			if len(args.Args) < 1 || len(args.Args) > 2 || len(args.KwArgs) > 0 {
				return nil, exec.ErrInvalidCall(errors.New("get() takes 1 or 2 positional arguments"))
			}
			key := args.Args[0].String()
			for _, p := range dictPairs(self) {
				if p.Key.String() == key {
					return p.Value.Interface(), nil
				}
			}
			if len(args.Args) == 2 {
				return args.Args[1].Interface(), nil
			}
			return nil, nil
		},
		"copy": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
			if err := args.Take(); err != nil {
				return nil, exec.ErrInvalidCall(err)
			}
			d := exec.NewDict()
			d.Pairs = append(d.Pairs, dictPairs(self)...)
			return d, nil
		},
	}
	for _, name := range []string{"clear", "pop", "setdefault", "update"} {
		if f, ok := builtins.Methods.Dict.Get(name); ok {
			m[name] = f
		}
	}
	return exec.NewMethodSet(m)
}

// eachPair is a method without arguments listing pick of each entry.
func eachPair(pick func(*exec.Pair) any) exec.Method[map[string]any] {
	return func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if err := args.Take(); err != nil {
			return nil, exec.ErrInvalidCall(err)
		}
		out := []any{}
		for _, p := range dictPairs(self) {
			out = append(out, pick(p))
		}
		return out, nil
	}
}

// pairItems is a dictionary's entries as (key, value) lists.
func pairItems(pairs []*exec.Pair) []any {
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key.Interface(), p.Value.Interface()}
	}
	return out
}

// filterItems is Jinja's items filter: a mapping's entries in order.
func filterItems(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if err := params.Take(); err != nil {
		return exec.AsValue(exec.ErrInvalidCall(err))
	}
	if in.IsNil() {
		return exec.AsValue([]any{})
	}
	if !in.IsDict() {
		return exec.AsValue(errors.New("items requires a mapping"))
	}
	return exec.AsValue(pairItems(dictPairs(in)))
}

// filterDictSort is Jinja's dictsort(case_sensitive=false, by='key',
// reverse=false): the entries sorted by key or by value.
func filterDictSort(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	caseSensitive, by, reverse := false, "key", false
	for i, a := range params.Args {
		switch i {
		case 0:
			caseSensitive = a.IsTrue()
		case 1:
			by = a.String()
		case 2:
			reverse = a.IsTrue()
		}
	}
	for k, v := range params.KwArgs {
		switch k {
		case "case_sensitive":
			caseSensitive = v.IsTrue()
		case "by":
			by = v.String()
		case "reverse":
			reverse = v.IsTrue()
		default:
			return exec.AsValue(exec.ErrInvalidCall(errors.New("dictsort: unexpected argument " + k)))
		}
	}
	if by != "key" && by != "value" {
		return exec.AsValue(errors.New("dictsort: by must be 'key' or 'value'"))
	}
	if !in.IsDict() {
		return exec.AsValue(errors.New("dictsort requires a mapping"))
	}
	pairs := append([]*exec.Pair(nil), dictPairs(in)...)
	sortKey := func(p *exec.Pair) *exec.Value {
		if by == "value" {
			return p.Value
		}
		return p.Key
	}
	sort.SliceStable(pairs, func(i, j int) bool {
		a, b := sortKey(pairs[i]), sortKey(pairs[j])
		if reverse {
			a, b = b, a
		}
		return lessValues(a, b, caseSensitive)
	})
	return exec.AsValue(pairItems(pairs))
}

// lessValues orders numbers by value and anything else by its text
// (folded to lower case unless caseSensitive), as sorting in Jinja does
// for the values templates sort.
func lessValues(a, b *exec.Value, caseSensitive bool) bool {
	if (a.IsInteger() || a.IsFloat()) && (b.IsInteger() || b.IsFloat()) {
		return a.Float() < b.Float()
	}
	x, y := a.String(), b.String()
	if !caseSensitive {
		x, y = strings.ToLower(x), strings.ToLower(y)
	}
	return x < y
}
