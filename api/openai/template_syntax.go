package openai

import (
	"strings"

	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// gonja parses a conditional expression (A if B else C) only as the whole
// of a {{ }} or of a {% set %} value, and only one level deep. Jinja allows
// it wherever an expression goes: in parentheses, call arguments, list and
// dict items, chained (A if B else C if D else E). Chat templates use those
// forms (Gemma 3's first user prefix, gpt-oss's content type), so before
// compiling, the conditionals gonja would reject are rewritten into an
// equivalent expression it accepts:
//
//	A if B else C   →   ((B) and [A] or [C])[0]
//
// which is exact in Jinja's semantics: "and"/"or" return an operand and
// evaluate lazily, and the one-element list is true even when A is false.
// Without "else" the value is undefined, as in Jinja.

// undefinedName is a variable no template defines: a conditional without
// "else" whose condition is false is undefined.
const undefinedName = "__shoal_undefined__"

// lexed is one token of a tag with its source text.
type lexed struct {
	tok  *tokens.Token
	text string // the token and the whitespace after it
}

// rewriteConditionals returns src with the conditional expressions gonja
// cannot parse rewritten (src itself when there are none). Newlines are
// normalized as gonja's lexer does, keeping the final one for it to strip.
func rewriteConditionals(src string, cfg *config.Config) string {
	if !strings.Contains(src, "if") {
		return src
	}
	lexCfg := cfg.Inherit()
	lexCfg.KeepTrailingNewline = true
	l := tokens.NewLexer(src, lexCfg)
	go l.Run()
	var all []*tokens.Token
	for t := range l.Tokens {
		all = append(all, t)
	}
	in := l.Input
	var out strings.Builder
	changed := false
	last := 0 // the input up to here is in out
	for i := 0; i < len(all); i++ {
		begin := all[i]
		if begin.Type != tokens.VariableBegin && begin.Type != tokens.BlockBegin {
			continue
		}
		j := i + 1
		for j < len(all) && all[j].Type != tokens.VariableEnd && all[j].Type != tokens.BlockEnd && all[j].Type != tokens.EOF && all[j].Type != tokens.Error {
			j++
		}
		if j == len(all) || (all[j].Type != tokens.VariableEnd && all[j].Type != tokens.BlockEnd) {
			break // a lexing error: gonja reports it
		}
		body := make([]lexed, 0, j-i-1)
		for k := i + 1; k < j; k++ {
			if all[k].Type == tokens.Whitespace {
				if len(body) > 0 {
					body[len(body)-1].text += in[all[k].Pos:all[k+1].Pos]
				}
				continue
			}
			body = append(body, lexed{tok: all[k], text: in[all[k].Pos:all[k+1].Pos]})
		}
		start := all[i+1].Pos
		if i+1 < len(all) && all[i+1].Type == tokens.Whitespace && i+2 <= j {
			start = all[i+2].Pos // leading whitespace stays as it is
		}
		i = j
		if !hasName(body, "if") {
			continue
		}
		var text string
		if begin.Type == tokens.VariableBegin {
			text = rewriteExpr(body, true)
		} else {
			text = rewriteStatement(body)
		}
		if text == joinText(body) {
			continue
		}
		out.WriteString(in[last:start])
		out.WriteString(text)
		last = all[j].Pos
		changed = true
	}
	if !changed {
		return src
	}
	out.WriteString(in[last:])
	return out.String()
}

// rewriteStatement rewrites the expressions of a {% %} tag: the condition
// of if and elif, the value of set; elsewhere (for's filter, macro
// signatures) only what is inside brackets.
func rewriteStatement(body []lexed) string {
	if len(body) == 0 || body[0].tok.Type != tokens.Name {
		return joinText(body)
	}
	switch body[0].tok.Val {
	case "if", "elif":
		return body[0].text + rewriteExpr(body[1:], false)
	case "set":
		for k, t := range body {
			if t.tok.Type == tokens.Assign {
				return joinText(body[:k+1]) + rewriteExpr(body[k+1:], true)
			}
		}
	}
	return rewriteFlat(body)
}

// rewriteExpr rewrites one expression. native: gonja itself parses one
// unchained conditional at this level.
func rewriteExpr(e []lexed, native bool) string {
	ifAt, elseAt := -1, -1
	ifs := 0
	depth := 0
	for k, t := range e {
		depth += nesting(t)
		if depth == 0 && t.tok.Type == tokens.Name {
			switch t.tok.Val {
			case "if":
				ifs++
				if ifAt < 0 {
					ifAt = k
				}
			case "else":
				if ifAt >= 0 && elseAt < 0 {
					elseAt = k
				}
			}
		}
	}
	if ifAt < 0 || (native && ifs == 1) {
		return rewriteFlat(e)
	}
	a, b := e[:ifAt], e[ifAt+1:]
	alt := undefinedName
	if elseAt >= 0 {
		b = e[ifAt+1 : elseAt]
		alt = rewriteExpr(e[elseAt+1:], false)
	}
	// The text after the expression's last token (whitespace) is kept.
	trail := ""
	if last := e[len(e)-1].text; len(last) > 0 {
		trail = last[len(strings.TrimRight(last, " \t\r\n")):]
	}
	return "((" + strings.TrimSpace(rewriteFlat(b)) + ") and [" + strings.TrimSpace(rewriteFlat(a)) + "] or [" + strings.TrimSpace(alt) + "])[0]" + trail
}

// rewriteFlat copies an expression without a conditional at its own level,
// rewriting what is inside its brackets: each item of a call's arguments,
// a list, a dict or a subscript is an expression of its own.
func rewriteFlat(e []lexed) string {
	var b strings.Builder
	for k := 0; k < len(e); k++ {
		t := e[k]
		switch t.tok.Type {
		case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
			end := closing(e, k)
			if end < 0 {
				b.WriteString(joinText(e[k:]))
				return b.String()
			}
			b.WriteString(t.text)
			b.WriteString(rewriteItems(e[k+1 : end]))
			b.WriteString(e[end].text)
			k = end
		default:
			b.WriteString(t.text)
		}
	}
	return b.String()
}

// rewriteItems rewrites the items between brackets, separated by commas
// (and colons: dict pairs, slices); a keyword argument's name stays.
func rewriteItems(e []lexed) string {
	var b strings.Builder
	depth, from := 0, 0
	item := func(to int) {
		it := e[from:to]
		if len(it) >= 2 && it[0].tok.Type == tokens.Name && it[1].tok.Type == tokens.Assign {
			b.WriteString(it[0].text + it[1].text)
			it = it[2:]
		}
		if len(it) > 0 {
			b.WriteString(rewriteExpr(it, false))
		}
	}
	for k, t := range e {
		depth += nesting(t)
		if depth == 0 && (t.tok.Type == tokens.Comma || t.tok.Type == tokens.Colon) {
			item(k)
			b.WriteString(t.text)
			from = k + 1
		}
	}
	item(len(e))
	return b.String()
}

// closing is the index of the bracket closing the one at open, -1 if none.
func closing(e []lexed, open int) int {
	depth := 0
	for k := open; k < len(e); k++ {
		if depth += nesting(e[k]); depth == 0 {
			return k
		}
	}
	return -1
}

// nesting is 1 for an opening bracket, -1 for a closing one, else 0.
func nesting(t lexed) int {
	switch t.tok.Type {
	case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
		return 1
	case tokens.RightParenthesis, tokens.RightBracket, tokens.RightBrace:
		return -1
	}
	return 0
}

func hasName(e []lexed, name string) bool {
	for _, t := range e {
		if t.tok.Type == tokens.Name && t.tok.Val == name {
			return true
		}
	}
	return false
}

func joinText(e []lexed) string {
	var b strings.Builder
	for _, t := range e {
		b.WriteString(t.text)
	}
	return b.String()
}
