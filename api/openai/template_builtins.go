package openai

import (
	"errors"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

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

// strMethods are gonja's string methods with split, rsplit, strip,
// lstrip, rstrip, replace, startswith, endswith and join as Python has
// them (gonja's need arguments Python's take as optional, refuse a tuple
// of prefixes, and join only lists).
func strMethods() *exec.MethodSet[string] {
	m := map[string]exec.Method[string]{
		"split":  func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pySplit(s, a, false) },
		"rsplit": func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pySplit(s, a, true) },
		"strip":  pyStrip(strings.Trim, strings.TrimFunc),
		"lstrip": pyStrip(strings.TrimLeft, strings.TrimLeftFunc),
		"rstrip": pyStrip(strings.TrimRight, strings.TrimRightFunc),
		"replace": func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
			p, err := pyArgs(a, "old", "new", "count")
			if err != nil {
				return nil, err
			}
			if p[0] == nil || p[1] == nil || !p[0].IsString() || !p[1].IsString() {
				return nil, exec.ErrInvalidCall(errors.New("replace() takes two strings"))
			}
			count := -1
			if p[2] != nil {
				count = p[2].Integer()
			}
			return strings.Replace(s, p[0].String(), p[1].String(), count), nil
		},
		"count": func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
			p, err := pyArgs(a, "sub", "start", "end")
			if err != nil {
				return nil, err
			}
			if p[0] == nil || !p[0].IsString() {
				return nil, exec.ErrInvalidCall(errors.New("count() takes a string"))
			}
			return strings.Count(pySlice(s, p[1], p[2]), p[0].String()), nil
		},
		"center":     pyPad(func(marg, width int) int { return marg/2 + (marg & width & 1) }),
		"ljust":      pyPad(func(int, int) int { return 0 }),
		"rjust":      pyPad(func(marg, _ int) int { return marg }),
		"startswith": func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyAffix(s, a, strings.HasPrefix) },
		"endswith":   func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) { return pyAffix(s, a, strings.HasSuffix) },
		"join": func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
			p, err := pyArgs(a, "iterable")
			if err != nil {
				return nil, err
			}
			if p[0] == nil {
				return nil, exec.ErrInvalidCall(errors.New("join() takes an iterable"))
			}
			var items []string
			if p[0].IsString() {
				for _, r := range p[0].String() {
					items = append(items, string(r))
				}
				return strings.Join(items, s), nil
			}
			if !p[0].IsList() {
				return nil, exec.ErrInvalidCall(errors.New("join() takes an iterable"))
			}
			for i := 0; i < p[0].Len(); i++ {
				it := p[0].Index(i)
				if !it.IsString() {
					return nil, exec.ErrInvalidCall(errors.New("join(): sequence item is not a string"))
				}
				items = append(items, it.String())
			}
			return strings.Join(items, s), nil
		},
	}
	for _, name := range []string{"capitalize", "capwords", "casefold", "encode", "expandtabs", "find", "format", "format_map",
		"isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
		"lower", "partition", "removeprefix", "removesuffix", "rfind", "rpartition", "splitlines", "swapcase", "title", "upper", "zfill"} {
		if f, ok := builtins.Methods.Str.Get(name); ok {
			m[name] = f
		}
	}
	return exec.NewMethodSet(m)
}

// pyArgs takes a method's arguments, given by position or by name; an
// absent one (or none) is nil.
func pyArgs(a *exec.VarArgs, names ...string) ([]*exec.Value, error) {
	if len(a.Args) > len(names) {
		return nil, exec.ErrInvalidCall(errors.New("too many arguments"))
	}
	out := make([]*exec.Value, len(names))
	copy(out, a.Args)
	for k, v := range a.KwArgs {
		i := 0
		for i < len(names) && names[i] != k {
			i++
		}
		if i == len(names) || out[i] != nil {
			return nil, exec.ErrInvalidCall(errors.New("unexpected argument " + k))
		}
		out[i] = v
	}
	for i, v := range out {
		if v != nil && v.IsNil() {
			out[i] = nil
		}
	}
	return out, nil
}

// isPySpace is Python's str.isspace for one character.
func isPySpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// pySplit is str.split (or str.rsplit): by runs of whitespace when sep is
// none, at most maxsplit times when that is not negative.
func pySplit(s string, a *exec.VarArgs, fromRight bool) (any, error) {
	p, err := pyArgs(a, "sep", "maxsplit")
	if err != nil {
		return nil, err
	}
	maxsplit := -1
	if p[1] != nil {
		maxsplit = p[1].Integer()
	}
	out := []string{}
	if p[0] == nil {
		rs := []rune(s)
		if fromRight {
			for j := len(rs); ; {
				for j > 0 && isPySpace(rs[j-1]) {
					j--
				}
				if j == 0 {
					break
				}
				if len(out) == maxsplit {
					out = append(out, string(rs[:j]))
					break
				}
				i := j
				for i > 0 && !isPySpace(rs[i-1]) {
					i--
				}
				out = append(out, string(rs[i:j]))
				j = i
			}
			slices.Reverse(out)
			return out, nil
		}
		for i := 0; ; {
			for i < len(rs) && isPySpace(rs[i]) {
				i++
			}
			if i == len(rs) {
				break
			}
			if len(out) == maxsplit {
				out = append(out, string(rs[i:]))
				break
			}
			j := i
			for j < len(rs) && !isPySpace(rs[j]) {
				j++
			}
			out = append(out, string(rs[i:j]))
			i = j
		}
		return out, nil
	}
	sep := p[0].String()
	if !p[0].IsString() || sep == "" {
		return nil, exec.ErrInvalidCall(errors.New("split(): the separator must be a non-empty string"))
	}
	if !fromRight {
		if maxsplit < 0 {
			return strings.Split(s, sep), nil
		}
		return strings.SplitN(s, sep, maxsplit+1), nil
	}
	for maxsplit != 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append(out, s[i+len(sep):])
		s = s[:i]
		maxsplit--
	}
	out = append(out, s)
	slices.Reverse(out)
	return out, nil
}

// pyStrip is str.strip, lstrip or rstrip: whitespace when chars is none,
// else any of chars.
func pyStrip(cut func(string, string) string, cutSpace func(string, func(rune) bool) string) exec.Method[string] {
	return func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		p, err := pyArgs(a, "chars")
		if err != nil {
			return nil, err
		}
		if p[0] == nil {
			return cutSpace(s, isPySpace), nil
		}
		if !p[0].IsString() {
			return nil, exec.ErrInvalidCall(errors.New("strip(): chars must be a string"))
		}
		return cut(s, p[0].String()), nil
	}
}

// pyAffix is str.startswith or str.endswith: the affix a string or a
// tuple of them, start and end code point positions as in a slice.
func pyAffix(s string, a *exec.VarArgs, has func(string, string) bool) (any, error) {
	p, err := pyArgs(a, "affix", "start", "end")
	if err != nil {
		return nil, err
	}
	s = pySlice(s, p[1], p[2])
	var affixes []string
	switch {
	case p[0] != nil && p[0].IsString():
		affixes = []string{p[0].String()}
	case p[0] != nil && p[0].IsList():
		for i := 0; i < p[0].Len(); i++ {
			affixes = append(affixes, p[0].Index(i).String())
		}
	default:
		return nil, exec.ErrInvalidCall(errors.New("startswith()/endswith() take a string or a tuple of strings"))
	}
	for _, x := range affixes {
		if has(s, x) {
			return true, nil
		}
	}
	return false, nil
}

// pySlice is s[start:end] in code points, a nil bound being the end.
func pySlice(s string, start, end *exec.Value) string {
	if start == nil && end == nil {
		return s
	}
	rs := []rune(s)
	from, to := 0, len(rs)
	if start != nil {
		from = sliceBound(start.Integer(), len(rs))
	}
	if end != nil {
		to = sliceBound(end.Integer(), len(rs))
	}
	if from > to {
		return ""
	}
	return string(rs[from:to])
}

// pyPad is str.center, ljust or rjust: s padded with fillchar (a space by
// default) to width, left of it the padding's share that left gives.
func pyPad(left func(marg, width int) int) exec.Method[string] {
	return func(s string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		p, err := pyArgs(a, "width", "fillchar")
		if err != nil {
			return nil, err
		}
		fill := " "
		if p[1] != nil {
			fill = p[1].String()
		}
		if p[0] == nil || !p[0].IsInteger() || utf8.RuneCountInString(fill) != 1 {
			return nil, exec.ErrInvalidCall(errors.New("padding takes a width and one fill character"))
		}
		width := p[0].Integer()
		marg := width - utf8.RuneCountInString(s)
		if marg <= 0 {
			return s, nil
		}
		l := left(marg, width)
		return strings.Repeat(fill, l) + s + strings.Repeat(fill, marg-l), nil
	}
}

// sliceBound is a slice index of a sequence of n: negative counts from
// the end, and it is clamped to [0, n].
func sliceBound(i, n int) int {
	if i < 0 {
		i += n
	}
	return min(max(i, 0), n)
}
