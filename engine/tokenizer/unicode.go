package tokenizer

import (
	"unicode"
)

// cptFlags mirrors llama.cpp's unicode_cpt_flags: exactly one general
// category bit (0 for unassigned code points) plus a whitespace bit.
type cptFlags uint16

const (
	flagNumber cptFlags = 1 << iota
	flagLetter
	flagSeparator
	flagMark
	flagPunct
	flagSymbol
	flagControl
	flagWhitespace
)

func (f cptFlags) is(m cptFlags) bool { return f&m != 0 }

// categoryFlag is the category bit alone (no whitespace bit).
func (f cptFlags) category() cptFlags { return f &^ flagWhitespace }

// isWhitespaceCpt is llama.cpp's unicode_set_whitespace (the Unicode
// White_Space property).
func isWhitespaceCpt(r rune) bool {
	switch {
	case r >= 0x09 && r <= 0x0D, r == 0x20, r == 0x85, r == 0xA0, r == 0x1680,
		r >= 0x2000 && r <= 0x200A, r == 0x2028, r == 0x2029, r == 0x202F,
		r == 0x205F, r == 0x3000:
		return true
	}
	return false
}

var asciiFlags [128]cptFlags

func init() {
	for r := rune(0); r < 128; r++ {
		asciiFlags[r] = computeFlags(r)
	}
}

func computeFlags(r rune) cptFlags {
	var f cptFlags
	switch {
	case unicode.Is(unicode.L, r):
		f = flagLetter
	case unicode.Is(unicode.N, r):
		f = flagNumber
	case unicode.Is(unicode.P, r):
		f = flagPunct
	case unicode.Is(unicode.S, r):
		f = flagSymbol
	case unicode.Is(unicode.M, r):
		f = flagMark
	case unicode.Is(unicode.Z, r):
		f = flagSeparator
	case unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs):
		// Go's unicode.C also covers some unassigned code points; llama.cpp
		// leaves unassigned (Cn) code points without any category.
		f = flagControl
	}
	if isWhitespaceCpt(r) {
		f |= flagWhitespace
	}
	return f
}

// flagsOf returns the category flags of a code point.
func flagsOf(r rune) cptFlags {
	if r >= 0 && r < 128 {
		return asciiFlags[r]
	}
	if r < 0 || r > unicode.MaxRune {
		return 0
	}
	return computeFlags(r)
}

// utf8SeqLen is llama.cpp's unicode_len_utf8: the sequence length implied by
// a lead byte (1 for continuation bytes).
func utf8SeqLen(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// decodeCpts converts text to code points the way llama.cpp's
// unicode_cpts_from_utf8 does: lenient about overlong forms and surrogates,
// each invalid byte becomes U+FFFD.
func decodeCpts(s string) []rune {
	out := make([]rune, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c < 0x80:
			out = append(out, rune(c))
			i++
			continue
		case c&0x40 == 0:
			// stray continuation byte
		case c&0x20 == 0:
			if i+1 < len(s) && s[i+1]&0xC0 == 0x80 {
				out = append(out, rune(c&0x1F)<<6|rune(s[i+1]&0x3F))
				i += 2
				continue
			}
		case c&0x10 == 0:
			if i+2 < len(s) && s[i+1]&0xC0 == 0x80 && s[i+2]&0xC0 == 0x80 {
				out = append(out, rune(c&0x0F)<<12|rune(s[i+1]&0x3F)<<6|rune(s[i+2]&0x3F))
				i += 3
				continue
			}
		case c&0x08 == 0:
			if i+3 < len(s) && s[i+1]&0xC0 == 0x80 && s[i+2]&0xC0 == 0x80 && s[i+3]&0xC0 == 0x80 {
				r := rune(c&0x07)<<18 | rune(s[i+1]&0x3F)<<12 | rune(s[i+2]&0x3F)<<6 | rune(s[i+3]&0x3F)
				if r > unicode.MaxRune {
					// llama.cpp would fail to re-encode this; treat as invalid.
					break
				}
				out = append(out, r)
				i += 4
				continue
			}
		}
		out = append(out, 0xFFFD)
		i++
	}
	return out
}

// appendCpt appends the UTF-8 encoding of r without Go's surrogate
// substitution (llama.cpp's unicode_cpt_to_utf8 encodes surrogates as-is).
func appendCpt(b []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(b, byte(r))
	case r < 0x800:
		return append(b, 0xC0|byte(r>>6), 0x80|byte(r&0x3F))
	case r < 0x10000:
		return append(b, 0xE0|byte(r>>12), 0x80|byte((r>>6)&0x3F), 0x80|byte(r&0x3F))
	default:
		return append(b, 0xF0|byte(r>>18), 0x80|byte((r>>12)&0x3F), 0x80|byte((r>>6)&0x3F), 0x80|byte(r&0x3F))
	}
}

// GPT-2 byte-to-unicode mapping: printable Latin-1 bytes map to themselves,
// the rest to U+0100 onwards in byte order.
var (
	byteToRune   [256]rune
	byteToString [256]string
	runeToByte   map[rune]byte
)

func init() {
	runeToByte = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		byteToString[b] = string(byteToRune[b])
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteEncode maps each byte of s through the GPT-2 byte-to-unicode table.
func byteEncode(s []byte) string {
	out := make([]byte, 0, len(s)*2)
	for _, c := range s {
		out = append(out, byteToString[c]...)
	}
	return string(out)
}
