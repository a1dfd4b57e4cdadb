package grammar

import (
	"slices"
)

// Runtime limits of the pushdown automaton.
const (
	// maxStacks caps the number of distinct stacks in one state. A byte whose
	// successor state would exceed it is refused.
	maxStacks = 1024
	// maxDepth caps the stack depth (nesting of non-tail rule references).
	// Paths that would go deeper are dropped, i.e. deeper nesting is refused.
	maxDepth = 2048
	// maxExpandSteps bounds the work of one byte transition. A transition
	// needing more (only possible with pathologically ambiguous grammars) is
	// refused.
	maxExpandSteps = 1 << 15
)

const (
	kSet uint8 = iota // match one byte in sets[arg]
	kRef              // descend into rule arg
	kEnd              // end of an alternative
	kDFA              // a character class automaton state dfa[arg]
)

type elem struct {
	kind uint8
	arg  int32
	set  int32 // kSet, kDFA: the bytes allowed (index into sets)
}

type rule struct {
	name string
	alts []int32 // start positions in elems
}

// Grammar is a compiled grammar. It is immutable and safe for concurrent use.
type Grammar struct {
	elems []elem
	sets  [][4]uint64
	rules []rule
	root  int32
	// dfa are the class automaton states; dfaPos[i] is an element position
	// holding state i (followed by kEnd).
	dfa    []dfaState
	dfaPos []int32
	init   stackSet
}

// link flattens the parsed rules into one element array and computes the
// initial state.
func (p *parser) link(root int32) *Grammar {
	g := &Grammar{sets: p.sets, root: root, rules: make([]rule, len(p.rules))}
	n := 0
	for _, r := range p.rules {
		for _, a := range r.alts {
			n += len(a) + 1
		}
	}
	g.elems = make([]elem, 0, n)
	for i, r := range p.rules {
		g.rules[i].name = r.name
		g.rules[i].alts = make([]int32, len(r.alts))
		for j, a := range r.alts {
			g.rules[i].alts[j] = int32(len(g.elems))
			for _, e := range a {
				switch {
				case e.ref:
					g.elems = append(g.elems, elem{kind: kRef, arg: e.index})
				case e.dfa:
					g.elems = append(g.elems, elem{kind: kDFA, arg: e.index, set: p.dfa[e.index].set})
				default:
					g.elems = append(g.elems, elem{kind: kSet, arg: e.index, set: e.index})
				}
			}
			g.elems = append(g.elems, elem{kind: kEnd})
		}
	}
	g.dfa = p.dfa
	g.dfaPos = make([]int32, len(p.dfa))
	for i, d := range p.dfa {
		g.dfaPos[i] = int32(len(g.elems))
		g.elems = append(g.elems, elem{kind: kDFA, arg: int32(i), set: d.set}, elem{kind: kEnd})
	}
	var x expander
	x.reset(g, &g.init)
	x.expandRule(nil, root)
	if x.bad {
		p.errAt(p.rules[root].off, "grammar too ambiguous: the start state exceeds the matcher's limits")
	}
	return g
}

// stackSet is a set of stacks stored flat. Each stack is a list of positions
// into Grammar.elems, bottom first; the top always points at a kSet element.
// An empty stack means root has been fully matched.
type stackSet struct {
	data   []int32
	ends   []int32
	hashes []uint64
	table  []int32 // open-addressing index (stack index + 1) for large sets
}

func (s *stackSet) reset() {
	s.data = s.data[:0]
	s.ends = s.ends[:0]
	s.hashes = s.hashes[:0]
	if s.table != nil {
		clear(s.table)
		s.table = s.table[:0]
	}
}

// linearDedupe is the set size up to which duplicates are found by scanning
// the hashes; larger sets use an open-addressing table.
const linearDedupe = 32

// find returns the index of the stack base+[pos] with hash h, or -1.
func (s *stackSet) find(h uint64, base []int32, pos int32) int {
	n := len(base)
	if pos >= 0 {
		n++
	}
	same := func(i int) bool {
		st := s.stack(i)
		return len(st) == n && slices.Equal(st[:len(base)], base) && (pos < 0 || st[n-1] == pos)
	}
	if len(s.table) == 0 {
		for i, hh := range s.hashes {
			if hh == h && same(i) {
				return i
			}
		}
		return -1
	}
	mask := uint64(len(s.table) - 1)
	for j := h & mask; ; j = (j + 1) & mask {
		k := s.table[j]
		if k == 0 {
			return -1
		}
		if s.hashes[k-1] == h && same(int(k-1)) {
			return int(k - 1)
		}
	}
}

// indexLast records the last stack in the table, building or growing the
// table when the set becomes large.
func (s *stackSet) indexLast() {
	n := len(s.ends)
	if n <= linearDedupe {
		return
	}
	if 2*n > len(s.table) {
		size := 64
		for size < 4*n {
			size *= 2
		}
		if cap(s.table) >= size {
			s.table = s.table[:size]
			clear(s.table)
		} else {
			s.table = make([]int32, size)
		}
		for i := 0; i < n; i++ {
			s.insert(i)
		}
		return
	}
	s.insert(n - 1)
}

func (s *stackSet) insert(i int) {
	mask := uint64(len(s.table) - 1)
	j := s.hashes[i] & mask
	for s.table[j] != 0 {
		j = (j + 1) & mask
	}
	s.table[j] = int32(i + 1)
}

func (s *stackSet) len() int { return len(s.ends) }

func (s *stackSet) stack(i int) []int32 {
	lo := int32(0)
	if i > 0 {
		lo = s.ends[i-1]
	}
	return s.data[lo:s.ends[i]]
}

func (s *stackSet) copyFrom(o *stackSet) {
	s.reset()
	s.data = append(s.data, o.data...)
	s.ends = append(s.ends, o.ends...)
	s.hashes = append(s.hashes, o.hashes...)
	if len(o.table) > 0 {
		s.table = append(s.table, o.table...)
	}
}

func hashStack(base []int32, pos int32) uint64 {
	h := uint64(14695981039346656037)
	for _, v := range base {
		h = (h ^ uint64(uint32(v))) * 1099511628211
	}
	if pos >= 0 {
		h = (h ^ uint64(uint32(pos))) * 1099511628211
	}
	return h ^ uint64(len(base))<<56
}

// expander builds successor stacks into dst, deduplicating them.
type expander struct {
	g       *Grammar
	dst     *stackSet
	scratch []int32
	steps   int
	bad     bool
}

func (x *expander) reset(g *Grammar, dst *stackSet) {
	x.g = g
	x.dst = dst
	x.scratch = x.scratch[:0]
	x.steps = 0
	x.bad = false
	dst.reset()
}

func (x *expander) add(base []int32, pos int32) {
	d := x.dst
	h := hashStack(base, pos)
	if d.find(h, base, pos) >= 0 {
		return
	}
	if len(d.ends) >= maxStacks {
		x.bad = true
		return
	}
	d.data = append(d.data, base...)
	if pos >= 0 {
		d.data = append(d.data, pos)
	}
	d.ends = append(d.ends, int32(len(d.data)))
	d.hashes = append(d.hashes, h)
	d.indexLast()
}

func (x *expander) expandRule(base []int32, r int32) {
	for _, a := range x.g.rules[r].alts {
		x.expand(base, a)
	}
}

// expand adds every stack reachable from base+[pos] without consuming input
// whose top is a byte-set element (or the empty stack).
func (x *expander) expand(base []int32, pos int32) {
	elems := x.g.elems
	for !x.bad {
		x.steps++
		if x.steps > maxExpandSteps {
			x.bad = true
			return
		}
		e := elems[pos]
		switch e.kind {
		case kSet, kDFA:
			x.add(base, pos)
			return
		case kEnd:
			if len(base) == 0 {
				x.add(nil, -1)
				return
			}
			pos = base[len(base)-1]
			base = base[:len(base)-1]
		case kRef:
			if elems[pos+1].kind != kEnd {
				// push the return address; a reference in tail position
				// replaces the frame instead, keeping right recursion flat.
				if len(base) >= maxDepth {
					return
				}
				start := len(x.scratch)
				x.scratch = append(x.scratch, base...)
				x.scratch = append(x.scratch, pos+1)
				base = x.scratch[start:len(x.scratch):len(x.scratch)]
			}
			alts := x.g.rules[e.arg].alts
			for _, a := range alts[:len(alts)-1] {
				x.expand(base, a)
			}
			pos = alts[len(alts)-1]
		}
	}
}

// advance computes the successor of src on byte b into dst (which is reset).
// It reports whether the successor is non-empty and within limits.
func (x *expander) advance(g *Grammar, src *stackSet, b byte, dst *stackSet) bool {
	x.reset(g, dst)
	for i := range src.ends {
		st := src.stack(i)
		if len(st) == 0 {
			continue
		}
		top := st[len(st)-1]
		e := g.elems[top]
		s := &g.sets[e.set]
		if s[b>>6]&(1<<(b&63)) == 0 {
			continue
		}
		if e.kind == kDFA {
			if nx := g.dfa[e.arg].next[b]; nx >= 0 {
				x.add(st[:len(st)-1], g.dfaPos[nx])
				continue
			}
		}
		x.expand(st[:len(st)-1], top+1)
		if x.bad {
			return false
		}
	}
	return !x.bad && dst.len() > 0
}

func (g *Grammar) nextBytes(s *stackSet) (out [4]uint64) {
	for i := range s.ends {
		st := s.stack(i)
		if len(st) == 0 {
			continue
		}
		set := &g.sets[g.elems[st[len(st)-1]].set]
		out[0] |= set[0]
		out[1] |= set[1]
		out[2] |= set[2]
		out[3] |= set[3]
	}
	return out
}

func canEnd(s *stackSet) bool {
	prev := int32(0)
	for _, e := range s.ends {
		if e == prev {
			return true
		}
		prev = e
	}
	return false
}

// key returns a canonical encoding of the set (stacks sorted), usable as a
// map key: equal sets give equal keys whatever the order they were built in.
func (s *stackSet) key(buf []byte) []byte {
	idx := make([]int, s.len())
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return slices.Compare(s.stack(a), s.stack(b)) })
	for _, i := range idx {
		st := s.stack(i)
		buf = appendUvarint(buf, uint64(len(st)))
		for _, v := range st {
			buf = appendUvarint(buf, uint64(uint32(v)))
		}
	}
	return buf
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// Matcher is one sequence's position in a grammar: the set of parse stacks
// reachable after the bytes accepted so far. It is not safe for concurrent
// use; Clone it to branch.
type Matcher struct {
	g    *Grammar
	cur  stackSet
	bufA stackSet
	bufB stackSet
	x    expander
}

// NewMatcher returns a matcher at the start of root.
func (g *Grammar) NewMatcher() *Matcher {
	m := &Matcher{g: g}
	m.cur.copyFrom(&g.init)
	return m
}

// AcceptByte advances by one byte. It returns false, leaving m unchanged, if
// the grammar does not allow b here.
func (m *Matcher) AcceptByte(b byte) bool {
	if !m.x.advance(m.g, &m.cur, b, &m.bufA) {
		return false
	}
	m.cur, m.bufA = m.bufA, m.cur
	return true
}

// AcceptBytes advances by all of p, or returns false and leaves m unchanged.
func (m *Matcher) AcceptBytes(p []byte) bool {
	if len(p) == 0 {
		return true
	}
	if !m.try(p) {
		return false
	}
	m.cur, m.bufA = m.bufA, m.cur
	return true
}

// try runs p from cur; on success the resulting state is in bufA.
func (m *Matcher) try(p []byte) bool {
	src := &m.cur
	dst, other := &m.bufA, &m.bufB
	if len(p)%2 == 0 {
		dst, other = other, dst // so that the last step lands in bufA
	}
	for _, b := range p {
		if !m.x.advance(m.g, src, b, dst) {
			return false
		}
		src = dst
		dst, other = other, dst
	}
	return true
}

// canAccept reports whether p would be accepted, without changing m.
func (m *Matcher) canAccept(p []byte) bool {
	return len(p) == 0 || m.try(p)
}

// NextBytes returns the bitset of the bytes allowed next (bit b of word b/64).
func (m *Matcher) NextBytes() [4]uint64 { return m.g.nextBytes(&m.cur) }

// CanEnd reports whether root may be complete here.
func (m *Matcher) CanEnd() bool { return canEnd(&m.cur) }

// Done reports CanEnd and that no byte can follow.
func (m *Matcher) Done() bool {
	return m.CanEnd() && m.NextBytes() == [4]uint64{}
}

// Clone returns an independent copy of m.
func (m *Matcher) Clone() *Matcher {
	c := &Matcher{g: m.g}
	c.cur.copyFrom(&m.cur)
	return c
}

// AcceptString is AcceptBytes for a string.
func (m *Matcher) AcceptString(s string) bool { return m.AcceptBytes([]byte(s)) }

// Grammar returns the grammar m runs.
func (m *Matcher) Grammar() *Grammar { return m.g }
