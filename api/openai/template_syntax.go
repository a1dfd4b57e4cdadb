package openai

import (
	"strings"

	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Before a chat template is compiled, the places where gonja's parser or
// lexer differ from Jinja are rewritten into text gonja reads as Jinja
// reads the original:
//
//   - A conditional expression (A if B else C) gonja parses only as the
//     whole of a {{ }} or of a {% set %} value, one level deep; Jinja
//     allows it wherever an expression goes: in parentheses, call
//     arguments, list and dict items, chained. Such a conditional becomes
//     ((B) and [A] or [C])[0], exact in Jinja's semantics: "and" and "or"
//     return an operand and evaluate lazily, and a one-element list is
//     true even when A is false. Without "else" the value is undefined.
//   - A method called right after parentheses, (x | trim).split(), is not
//     a method call to gonja; [(x | trim)][0].split() is.
//   - gonja finds no item at x[-n] when n is the length of x (x[-1] of a
//     list of one); [x[-n:]|first][0] is the item.
//   - With lstrip_blocks gonja strips the spaces before a block or
//     comment tag that follows another tag on the same line; Jinja strips
//     them only from the start of a line. Such a tag gets Jinja's "+",
//     which keeps them.

// undefinedName is a variable no template defines: a conditional without
// "else" whose condition is false is undefined.
const undefinedName = "__shoal_undefined__"

// lexed is one token of a tag with its source text.
type lexed struct {
	tok  *tokens.Token
	text string // the token and the whitespace after it
}

// adaptSource returns src rewritten where gonja would read it otherwise
// than Jinja (src itself when nothing is). Newlines are normalized as
// gonja's lexer does, keeping the final one for it to strip.
func adaptSource(src string, cfg *config.Config) string {
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
	edit := func(from, to int, text string) {
		out.WriteString(in[last:from])
		out.WriteString(text)
		last = to
		changed = true
	}
	for i := 0; i < len(all); i++ {
		begin := all[i]
		if begin.Type != tokens.VariableBegin && begin.Type != tokens.BlockBegin && begin.Type != tokens.CommentBegin {
			continue
		}
		if begin.Type != tokens.VariableBegin && cfg.LeftStripBlocks && strippedMidLine(all, i, in) {
			at := begin.Pos + 2 // after "{%" or "{#"
			edit(at, at, "+")
		}
		if begin.Type == tokens.CommentBegin {
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
		i = j
		if len(body) == 0 {
			continue
		}
		var text string
		if begin.Type == tokens.VariableBegin {
			text = rewriteExpr(body, true)
		} else {
			text = rewriteStatement(body)
		}
		if text != joinText(body) {
			edit(body[0].tok.Pos, all[j].Pos, text)
		}
	}
	if !changed {
		return src
	}
	out.WriteString(in[last:])
	return out.String()
}

// strippedMidLine reports whether gonja would strip, and Jinja keep, the
// spaces before the tag at all[i] that has no whitespace control of its
// own: spaces and tabs right after the end of another tag (gonja drops
// them, emitting no text in between).
func strippedMidLine(all []*tokens.Token, i int, in string) bool {
	begin := all[i]
	if c := in[begin.Pos+2:]; c != "" && (c[0] == '-' || c[0] == '+') {
		return false
	}
	if i == 0 {
		return false
	}
	switch prev := all[i-1]; prev.Type {
	case tokens.VariableEnd, tokens.BlockEnd, tokens.CommentEnd:
		gap := in[prev.Pos+len(prev.Val) : begin.Pos]
		return gap != "" && strings.Trim(gap, " \t") == ""
	}
	return false
}

// rewriteStatement rewrites the expressions of a {% %} tag: the condition
// of if and elif, the value of set; elsewhere (for's filter, macro
// signatures) only what is inside brackets.
func rewriteStatement(body []lexed) string {
	if body[0].tok.Type != tokens.Name {
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
	if len(e) == 0 {
		return ""
	}
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
	last := e[len(e)-1].text
	trail := last[len(strings.TrimRight(last, " \t\r\n")):]
	return "((" + strings.TrimSpace(rewriteFlat(b)) + ") and [" + strings.TrimSpace(rewriteFlat(a)) + "] or [" + strings.TrimSpace(alt) + "])[0]" + trail
}

// rewriteFlat copies an expression without a conditional at its own level,
// rewriting what is inside its brackets: each item of a call's arguments,
// a list, a dict or a subscript is an expression of its own.
func rewriteFlat(e []lexed) string {
	var out []byte
	chain := -1 // where in out the current operand (name, literal, group and what follows it) starts
	for k := 0; k < len(e); k++ {
		t := e[k]
		follows := k > 0 && postfixable(e[k-1])
		switch {
		case t.tok.Type == tokens.Dot, t.tok.Type == tokens.Name && k > 0 && e[k-1].tok.Type == tokens.Dot:
		case nesting(t) > 0 && follows && chain >= 0:
		case nesting(t) > 0, t.tok.Type == tokens.Name, t.tok.Type == tokens.String, t.tok.Type == tokens.Integer, t.tok.Type == tokens.Float:
			chain = len(out)
		default:
			chain = -1
		}
		if nesting(t) <= 0 {
			out = append(out, t.text...)
			continue
		}
		end := closing(e, k)
		if end < 0 {
			out = append(out, joinText(e[k:])...)
			break
		}
		inner := e[k+1 : end]
		closeText := e[end].text
		trail := closeText[len(strings.TrimRight(closeText, " \t\r\n")):]
		switch {
		case t.tok.Type == tokens.LeftBracket && follows && chain >= 0 && negativeIndex(inner):
			// gonja finds no item at x[-n] when n is x's length (x[-1]
			// of one item); the slice from there, first, is that item.
			operand := string(out[chain:])
			out = append(out[:chain], "["+operand+"["+strings.TrimSpace(joinText(inner))+":]|first][0]"+trail...)
		case t.tok.Type == tokens.LeftParenthesis && !follows && end+3 < len(e) && e[end+1].tok.Type == tokens.Dot && e[end+2].tok.Type == tokens.Name && e[end+3].tok.Type == tokens.LeftParenthesis:
			// Parentheses that group followed by a method call: gonja
			// calls a method only on a getter chain.
			out = append(out, "["+t.text+rewriteItems(inner)+strings.TrimRight(closeText, " \t\r\n")+"][0]"+trail...)
		default:
			out = append(out, t.text+rewriteItems(inner)+closeText...)
		}
		k = end
	}
	return string(out)
}

// postfixable reports whether a "(" or "[" after t calls or subscripts
// what t ends: a name (not a keyword), a string, a call or subscript.
func postfixable(t lexed) bool {
	switch t.tok.Type {
	case tokens.Name:
		switch t.tok.Val {
		case "if", "else", "elif", "for", "set", "recursive":
			return false
		}
		return true
	case tokens.String, tokens.RightParenthesis, tokens.RightBracket:
		return true
	}
	return false
}

// negativeIndex reports whether a subscript is a negative integer.
func negativeIndex(e []lexed) bool {
	return len(e) == 2 && e[0].tok.Type == tokens.Subtraction && e[1].tok.Type == tokens.Integer
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
		b.WriteString(rewriteExpr(it, false))
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

func joinText(e []lexed) string {
	var b strings.Builder
	for _, t := range e {
		b.WriteString(t.text)
	}
	return b.String()
}
