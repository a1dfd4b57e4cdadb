package jsonschema

import (
	"strconv"
	"strings"
)

// intRange returns a GBNF expression matching exactly the decimal
// integers n with lo <= n <= hi, written without leading zeros (and
// without "-0"). It requires lo <= hi.
func intRange(lo, hi int64) string {
	var alts []string
	if lo < 0 {
		// Negative part: "-" followed by magnitudes in [a, b].
		b := uint64(-(lo + 1)) + 1 // -lo without overflow
		a := uint64(1)
		if hi < 0 {
			a = uint64(-(hi + 1)) + 1
		}
		alts = append(alts, `"-" `+group(posRange(a, b)))
	}
	if hi >= 0 {
		a := uint64(0)
		if lo > 0 {
			a = uint64(lo)
		}
		alts = append(alts, posRange(a, uint64(hi))...)
	}
	return alt(alts)
}

// posRange returns alternatives matching the integers in [a, b] (a <= b),
// split by number of digits.
func posRange(a, b uint64) []string {
	var alts []string
	la, lb := len(strconv.FormatUint(a, 10)), len(strconv.FormatUint(b, 10))
	for l := la; l <= lb; l++ {
		lower, upper := pow10(l-1), pow10(l)-1
		if l == 1 {
			lower = 0
		}
		if a > lower {
			lower = a
		}
		if b < upper {
			upper = b
		}
		alts = append(alts, sameLen(strconv.FormatUint(lower, 10), strconv.FormatUint(upper, 10))...)
	}
	return alts
}

func pow10(n int) uint64 {
	p := uint64(1)
	for range n {
		p *= 10
	}
	return p
}

// sameLen returns alternatives matching the digit strings s with
// x <= s <= y, where x and y have the same length and x <= y.
func sameLen(x, y string) []string {
	if x == y {
		return []string{quote(x)}
	}
	i := 0
	for x[i] == y[i] {
		i++
	}
	pre, x, y := x[:i], x[i:], y[i:]
	n := len(x) - 1
	xr, yr := x[1:], y[1:]
	var alts []string
	lowStart, highEnd := x[0], y[0]
	if !allByte(xr, '0') {
		alts = append(alts, seq(quote(x[:1]), group(sameLen(xr, strings.Repeat("9", n)))))
		lowStart++
	}
	if !allByte(yr, '9') {
		highEnd--
	}
	if lowStart <= highEnd {
		alts = append(alts, seq(digitClass(lowStart, highEnd), digits(n)))
	}
	if !allByte(yr, '9') {
		alts = append(alts, seq(quote(y[:1]), group(sameLen(strings.Repeat("0", n), yr))))
	}
	if pre == "" {
		return alts
	}
	return []string{seq(quote(pre), group(alts))}
}

func allByte(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != c {
			return false
		}
	}
	return true
}

func digitClass(a, b byte) string {
	if a == b {
		return quote(string(a))
	}
	return "[" + string(a) + "-" + string(b) + "]"
}

func digits(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "[0-9]"
	}
	return "[0-9]{" + strconv.Itoa(n) + "}"
}

// seq joins non-empty expressions into a sequence.
func seq(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, " ")
}

// alt joins alternatives; a single alternative is returned as is.
func alt(alts []string) string {
	return strings.Join(alts, " | ")
}

// group wraps alternatives in parentheses when there is more than one.
func group(alts []string) string {
	if len(alts) == 1 {
		return alts[0]
	}
	return "( " + alt(alts) + " )"
}
