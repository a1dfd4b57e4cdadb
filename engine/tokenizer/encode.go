package tokenizer

import (
	"strings"
)

// fragment is either a special token (tok >= 0) or raw text.
type fragment struct {
	tok  int32
	text string
}

func isCSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
}

// partition splits special-token texts out of text, longest first, like
// llama.cpp's tokenizer_st_partition. Control and unknown tokens are only
// split when parseSpecial; user-defined tokens always are.
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	frags := []fragment{{tok: -1, text: text}}
	var next []fragment
	for _, id := range t.special {
		a := t.attrs[id]
		if !parseSpecial && a&(attrControl|attrUnknown) != 0 {
			continue
		}
		st := t.tokens[id]
		changed := false
		next = next[:0]
		for _, f := range frags {
			if f.tok >= 0 || !strings.Contains(f.text, st) {
				next = append(next, f)
				continue
			}
			changed = true
			rest := f.text
			for {
				i := strings.Index(rest, st)
				if i < 0 {
					if rest != "" {
						next = append(next, fragment{tok: -1, text: rest})
					}
					break
				}
				left := rest[:i]
				if a&attrLStrip != 0 {
					for left != "" && isCSpace(left[len(left)-1]) {
						left = left[:len(left)-1]
					}
				}
				if left != "" {
					next = append(next, fragment{tok: -1, text: left})
				}
				next = append(next, fragment{tok: id})
				rest = rest[i+len(st):]
				if a&attrRStrip != 0 {
					for rest != "" && isCSpace(rest[0]) {
						rest = rest[1:]
					}
				}
			}
		}
		if changed {
			frags, next = next, frags
		}
	}
	return frags
}

// Encode tokenizes text like llama.cpp's llama_tokenize. addSpecial adds BOS
// (and EOS) as the vocabulary asks; parseSpecial turns the texts of control
// tokens (e.g. "<s>", "<|endoftext|>") into their ids instead of tokenizing
// them as plain text.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) []int32 {
	var frags []fragment
	if text != "" {
		frags = t.partition(text, parseSpecial)
	}
	out := make([]int32, 0, len(text)/3+2)
	if addSpecial && t.addBOS && t.bos != NoToken {
		out = append(out, t.bos)
	}
	if t.spm {
		prevSpecial := true // a space prefix goes before the first text and after special tokens
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				prevSpecial = true
				continue
			}
			s := f.text
			if t.addSpacePrefix && prevSpecial {
				s = " " + s
			}
			out = t.spmEncode(strings.ReplaceAll(s, " ", "\u2581"), out)
			prevSpecial = false
		}
	} else if t.wpm {
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				continue
			}
			out = t.wpmEncode(f.text, out)
		}
	} else {
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				continue
			}
			out = t.bpeEncode(f.text, out)
		}
	}
	if addSpecial && t.wpm && t.addSEP && t.sep != NoToken {
		out = append(out, t.sep)
	}
	if addSpecial && t.addEOS && t.eos != NoToken {
		out = append(out, t.eos)
	}
	return out
}

// heap is a small binary heap ordered by less.
type heap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func (h *heap[T]) push(x T) {
	h.items = append(h.items, x)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *heap[T]) pop() T {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items = h.items[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= last {
			break
		}
		m := l
		if r := l + 1; r < last && h.less(h.items[r], h.items[l]) {
			m = r
		}
		if !h.less(h.items[m], h.items[i]) {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}

type symbol struct {
	prev, next int
	start, n   int // byte range in the text
}

type spmBigram struct {
	left, right int
	score       float32
	size        int
}

// spmEncode is llama.cpp's llm_tokenizer_spm: greedy merging of the
// adjacent pair whose concatenation is the highest-scoring token, with
// byte fallback for leftovers.
func (t *Tokenizer) spmEncode(text string, out []int32) []int32 {
	if text == "" {
		return out
	}
	syms := make([]symbol, 0, len(text))
	for off := 0; off < len(text); {
		n := min(utf8SeqLen(text[off]), len(text)-off)
		idx := len(syms)
		next := idx + 1
		if off+n == len(text) {
			next = -1
		}
		syms = append(syms, symbol{prev: idx - 1, next: next, start: off, n: n})
		off += n
	}
	q := heap[spmBigram]{less: func(a, b spmBigram) bool {
		return a.score > b.score || (a.score == b.score && a.left < b.left)
	}}
	tryAdd := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		s := text[syms[l].start : syms[l].start+syms[l].n+syms[r].n]
		id, ok := t.toID[s]
		if !ok {
			return
		}
		q.push(spmBigram{left: l, right: r, score: t.scores[id], size: len(s)})
	}
	for i := 1; i < len(syms); i++ {
		tryAdd(i-1, i)
	}
	for len(q.items) > 0 {
		b := q.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		tryAdd(l.prev, b.left)
		tryAdd(b.left, l.next)
	}
	for i := 0; i != -1; i = syms[i].next {
		s := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := t.toID[s]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(s); j++ {
			if id := t.spmByteToken(s[j]); id != NoToken {
				out = append(out, id)
			}
		}
	}
	return out
}

const hexDigits = "0123456789ABCDEF"

// spmByteToken is llama.cpp's byte_to_token for SentencePiece vocabularies.
func (t *Tokenizer) spmByteToken(c byte) int32 {
	if id, ok := t.toID[string([]byte{'<', '0', 'x', hexDigits[c>>4], hexDigits[c&15], '>'})]; ok {
		return id
	}
	if id, ok := t.toID[string([]byte{c})]; ok {
		return id
	}
	return t.unk
}

type bpeBigram struct {
	left, right int
	rank        int32
	size        int
}

const maxCacheEntries = 1 << 16

// bpeEncode is llama.cpp's llm_tokenizer_bpe_session::tokenize for one
// raw-text fragment.
func (t *Tokenizer) bpeEncode(text string, out []int32) []int32 {
	if text == "" {
		return out
	}
	words := t.split.split(decodeCpts(text))
	var buf []byte
	for _, w := range words {
		buf = buf[:0]
		for _, r := range w {
			buf = appendCpt(buf, r)
		}
		word := byteEncode(buf)
		t.cacheMu.Lock()
		ids, ok := t.cache[word]
		t.cacheMu.Unlock()
		if !ok {
			ids = t.bpeWord(word, nil)
			t.cacheMu.Lock()
			if len(t.cache) >= maxCacheEntries {
				clear(t.cache)
			}
			t.cache[word] = ids
			t.cacheMu.Unlock()
		}
		out = append(out, ids...)
	}
	return out
}

// bpeWord merges one byte-encoded pre-token by merge rank.
func (t *Tokenizer) bpeWord(word string, out []int32) []int32 {
	if t.pre.ignoreMerges {
		if id, ok := t.toID[word]; ok {
			return append(out, id)
		}
	}
	syms := make([]symbol, 0, len(word))
	for off := 0; off < len(word); {
		n := min(utf8SeqLen(word[off]), len(word)-off)
		idx := len(syms)
		next := idx + 1
		if off+n == len(word) {
			next = -1
		}
		syms = append(syms, symbol{prev: idx - 1, next: next, start: off, n: n})
		off += n
	}
	q := heap[bpeBigram]{less: func(a, b bpeBigram) bool {
		return a.rank < b.rank || (a.rank == b.rank && a.left < b.left)
	}}
	tryAdd := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		sl, sr := syms[l], syms[r]
		rank, ok := t.ranks[mergeKey{word[sl.start : sl.start+sl.n], word[sr.start : sr.start+sr.n]}]
		if !ok {
			return
		}
		q.push(bpeBigram{left: l, right: r, rank: rank, size: sl.n + sr.n})
	}
	for i := 1; i < len(syms); i++ {
		tryAdd(i-1, i)
	}
	for len(q.items) > 0 {
		b := q.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size || l.next != b.right {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		tryAdd(l.prev, b.left)
		tryAdd(b.left, l.next)
	}
	for i := 0; i != -1 && len(syms) > 0; i = syms[i].next {
		s := word[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := t.toID[s]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(s); j++ {
			if id, ok := t.toID[s[j:j+1]]; ok {
				out = append(out, id)
			}
		}
	}
	return out
}
