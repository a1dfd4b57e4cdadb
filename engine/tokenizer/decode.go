package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// tokenToPiece is llama.cpp's token_to_piece without lstrip.
func (t *Tokenizer) tokenToPiece(id int32, special bool) []byte {
	a := t.attrs[id]
	if !special && a&(attrUnknown|attrControl) != 0 {
		return nil
	}
	text := t.tokens[id]
	switch {
	case a&(attrUnknown|attrControl|attrUserDefined) != 0:
		return []byte(text)
	case a&attrNormal != 0:
		if t.spm || t.wpm {
			return []byte(strings.ReplaceAll(text, "\u2581", " "))
		}
		return decodeByteLevel(text)
	case a&attrByte != 0:
		if len(text) >= 5 {
			if v, err := strconv.ParseUint(text[3:5], 16, 8); err == nil {
				return []byte{byte(v)}
			}
		}
		return nil
	}
	return nil
}

// decodeByteLevel maps GPT-2 byte-level text back to bytes (llama.cpp's
// llama_decode_text).
func decodeByteLevel(text string) []byte {
	out := make([]byte, 0, len(text))
	for _, r := range decodeCpts(text) {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
			continue
		}
		enc := appendCpt(nil, r)
		out = append(out, "[UNK_BYTE_0x"...)
		for _, c := range enc {
			out = append(out, hexDigits[c>>4]|0x20, hexDigits[c&15]|0x20)
		}
		out = append(out, text...)
		out = append(out, ']')
	}
	return out
}

// Piece returns the raw bytes token id stands for: "▁" becomes a space and
// <0xXX> that byte for SentencePiece, byte-level text is mapped back to
// bytes for BPE. Control and unknown tokens give nothing (see PieceSpecial).
// The result must not be modified.
func (t *Tokenizer) Piece(id int32) []byte {
	if id < 0 || int(id) >= len(t.piece) {
		return nil
	}
	return t.piece[id]
}

// PieceSpecial is Piece, but control and unknown tokens render as their text.
func (t *Tokenizer) PieceSpecial(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieceSpecial) {
		return nil
	}
	return t.pieceSpecial[id]
}

// Decode concatenates the pieces of ids. Like llama.cpp's detokenizer it
// drops one leading space from the first token when the vocabulary adds a
// space prefix, so Decode(Encode(s, false, false)) == s. Control tokens are
// dropped. Unlike llama_detokenize it applies no clean-up of spaces, so
// byte-level BPE round-trips exactly.
func (t *Tokenizer) Decode(ids []int32) string {
	var b []byte
	strip := t.addSpacePrefix || t.wpm // WordPiece words all start with "▁"
	for _, id := range ids {
		p := t.Piece(id)
		if strip && len(p) > 0 && p[0] == ' ' {
			p = p[1:]
		}
		strip = t.wpm && strip && len(p) == 0 // WordPiece: past [CLS] too
		b = append(b, p...)
	}
	return string(b)
}

// Detokenize is llama.cpp's llama_detokenize: removeSpecial drops a leading
// BOS / trailing EOS the vocabulary adds, unparseSpecial renders control
// tokens as text, and vocabularies that ask for it get
// clean_up_tokenization_spaces applied.
func (t *Tokenizer) Detokenize(ids []int32, removeSpecial, unparseSpecial bool) string {
	strip := t.addSpacePrefix
	if removeSpecial && t.addBOS && len(ids) > 0 && ids[0] == t.bos {
		strip = false
		ids = ids[1:]
	}
	if removeSpecial && t.addEOS && len(ids) > 0 && ids[len(ids)-1] == t.eos {
		ids = ids[:len(ids)-1]
	}
	var text []byte
	for _, id := range ids {
		var p []byte
		if unparseSpecial {
			p = t.PieceSpecial(id)
		} else {
			p = t.Piece(id)
		}
		if strip && len(p) > 0 && p[0] == ' ' {
			p = p[1:]
		}
		strip = false
		text = append(text, p...)
	}
	if !t.spm && !t.pre.keepSpaces {
		text = cleanSpaces(text)
	}
	return string(text)
}

// cleanSpaces is llama.cpp's clean_spaces pass of detokenize.
func cleanSpaces(text []byte) []byte {
	if len(text) == 0 {
		return text
	}
	// " ?", " !", " .", " ,"
	total := 1
	for i := 1; i < len(text); i++ {
		x := text[i]
		if text[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') {
			total--
		}
		text[total] = x
		total++
	}
	text = text[:total]
	// " ' " -> "'"
	total = 1
	for i := 1; i < len(text); i++ {
		x := text[i]
		if x == '\'' && i+1 < len(text) && text[i-1] == ' ' && text[i+1] == ' ' {
			total--
			text[i+1] = 0 // removed below by skipping
			text[total] = x
			total++
			i++
			continue
		}
		text[total] = x
		total++
	}
	text = text[:total]
	// " 's", " 'm", " 're", " 've"
	total = 1
	for i := 1; i < len(text); i++ {
		x := text[i]
		if text[i-1] == ' ' && x == '\'' && i+1 < len(text) {
			x1 := text[i+1]
			switch {
			case x1 == 's' || x1 == 'm':
				total--
			case i+2 < len(text) && ((x1 == 'r' && text[i+2] == 'e') || (x1 == 'v' && text[i+2] == 'e')):
				total--
			}
		}
		text[total] = x
		total++
	}
	return text[:total]
}

// Decoder turns a stream of token ids into text, emitting only complete,
// valid UTF-8: bytes of a multi-byte character split across tokens are held
// back until the character is complete. Its output concatenated equals
// Decode of the same ids whenever that is valid UTF-8; bytes that can never
// form a valid character come out as U+FFFD.
type Decoder struct {
	t       *Tokenizer
	pending []byte
	strip   bool
	// Special renders control tokens as their text.
	Special bool
}

// NewDecoder starts a stream. Like Decode, it drops the leading space of the
// first token when the vocabulary adds a space prefix (SentencePiece); use
// NewContinuationDecoder for tokens that continue earlier text.
func (t *Tokenizer) NewDecoder() *Decoder {
	return &Decoder{t: t, strip: t.addSpacePrefix}
}

// NewContinuationDecoder starts a stream that keeps every space, for tokens
// generated after a prompt.
func (t *Tokenizer) NewContinuationDecoder() *Decoder {
	return &Decoder{t: t}
}

// Add appends one token and returns the text that became complete.
func (d *Decoder) Add(id int32) string {
	var p []byte
	if d.Special {
		p = d.t.PieceSpecial(id)
	} else {
		p = d.t.Piece(id)
	}
	if d.strip && len(p) > 0 && p[0] == ' ' {
		p = p[1:]
	}
	d.strip = false
	d.pending = append(d.pending, p...)
	return d.drain(false)
}

// Flush returns whatever is held back, with incomplete sequences as U+FFFD.
func (d *Decoder) Flush() string { return d.drain(true) }

func (d *Decoder) drain(final bool) string {
	b := d.pending
	var out strings.Builder
	i := 0
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			out.WriteByte(b[i])
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			out.Write(b[i : i+size])
			i += size
			continue
		}
		if !final && !utf8.FullRune(b[i:]) {
			break // wait for the rest of the character
		}
		out.WriteRune(utf8.RuneError)
		i++
	}
	d.pending = append(d.pending[:0], b[i:]...)
	return out.String()
}
