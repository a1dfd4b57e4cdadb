package grammar

import (
	"bytes"
	"container/list"
	"fmt"
	"slices"
	"sync"
)

// Vocab is a model's vocabulary as a byte trie. It is immutable and safe for
// concurrent use.
type Vocab struct {
	n      int
	pieces [][]byte
	isEOG  []bool
	eog    []int32

	nodes     []trieNode
	childByte []byte
	childNode []int32
	tokIDs    []int32
	maxDepth  int
}

type trieNode struct {
	childStart, childEnd int32
	tokStart, tokEnd     int32
}

// NewVocab builds the token trie once per model. pieces[i] is token i's bytes;
// nil or empty means the grammar can never produce it (control tokens). eog
// are the end-of-generation token ids: allowed exactly when the matcher
// CanEnd(). Ids in eog outside [0, len(pieces)) are ignored.
func NewVocab(pieces [][]byte, eog []int32) *Vocab {
	v := &Vocab{n: len(pieces), pieces: make([][]byte, len(pieces)), isEOG: make([]bool, len(pieces))}
	for _, id := range eog {
		if id >= 0 && int(id) < len(pieces) && !v.isEOG[id] {
			v.isEOG[id] = true
			v.eog = append(v.eog, id)
		}
	}
	var ids []int32
	for i, p := range pieces {
		if len(p) == 0 || v.isEOG[i] {
			continue
		}
		v.pieces[i] = bytes.Clone(p)
		ids = append(ids, int32(i))
		v.maxDepth = max(v.maxDepth, len(p))
	}
	slices.SortStableFunc(ids, func(a, b int32) int { return bytes.Compare(v.pieces[a], v.pieces[b]) })
	v.nodes = append(v.nodes, trieNode{})
	v.build(0, ids, 0)
	return v
}

// build fills node for the tokens ids (sorted, sharing a prefix of length
// depth). Children of a node are contiguous in childByte/childNode.
func (v *Vocab) build(node int32, ids []int32, depth int) {
	i := 0
	start := int32(len(v.tokIDs))
	for i < len(ids) && len(v.pieces[ids[i]]) == depth {
		v.tokIDs = append(v.tokIDs, ids[i])
		i++
	}
	v.nodes[node].tokStart, v.nodes[node].tokEnd = start, int32(len(v.tokIDs))
	type group struct{ lo, hi int }
	var groups []group
	for i < len(ids) {
		b := v.pieces[ids[i]][depth]
		j := i + 1
		for j < len(ids) && v.pieces[ids[j]][depth] == b {
			j++
		}
		groups = append(groups, group{i, j})
		i = j
	}
	cs := int32(len(v.childByte))
	for _, gr := range groups {
		v.childByte = append(v.childByte, v.pieces[ids[gr.lo]][depth])
		v.childNode = append(v.childNode, int32(len(v.nodes)))
		v.nodes = append(v.nodes, trieNode{})
	}
	v.nodes[node].childStart, v.nodes[node].childEnd = cs, cs+int32(len(groups))
	for k, gr := range groups {
		v.build(v.childNode[int(cs)+k], ids[gr.lo:gr.hi], depth+1)
	}
}

// Len returns the vocabulary size.
func (v *Vocab) Len() int { return v.n }

// maxCacheBytes bounds a Constraint's mask cache in bytes, in addition to the
// entry cap below.
const (
	maxCacheEntries = 4096
	maxCacheBytes   = 64 << 20
)

// Constraint is a grammar bound to a vocabulary, with a mask cache shared by
// all sequences using it. It is safe for concurrent use. The cache is an LRU
// of at most 4096 masks (fewer for very large vocabularies: at most 64 MiB).
type Constraint struct {
	g     *Grammar
	v     *Vocab
	words int

	mu    sync.Mutex
	cache map[string]*list.Element
	lru   list.List
	limit int

	walkers sync.Pool
	zero    []uint64
}

type cacheEntry struct {
	key  string
	mask []uint64
}

// NewConstraint binds g to v.
func NewConstraint(g *Grammar, v *Vocab) *Constraint {
	c := &Constraint{g: g, v: v, words: (v.n + 63) / 64, cache: map[string]*list.Element{}}
	c.limit = maxCacheEntries
	if bytesPer := c.words * 8; bytesPer > 0 && maxCacheBytes/bytesPer < c.limit {
		c.limit = max(16, maxCacheBytes/bytesPer)
	}
	c.zero = make([]uint64, c.words)
	return c
}

// Start returns the state of a new sequence, at the start of root.
func (c *Constraint) Start() *State {
	return &State{c: c, m: c.g.NewMatcher()}
}

func (c *Constraint) lookup(key string) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.cache[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*cacheEntry).mask
	}
	return nil
}

func (c *Constraint) store(key string, mask []uint64) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.cache[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*cacheEntry).mask
	}
	c.cache[key] = c.lru.PushFront(&cacheEntry{key, mask})
	for c.lru.Len() > c.limit {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.cache, old.Value.(*cacheEntry).key)
	}
	return mask
}

// CacheLen returns the number of cached masks.
func (c *Constraint) CacheLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// walker computes masks; it keeps one stack set per trie depth so a walk does
// not allocate in steady state.
type walker struct {
	levels []stackSet
	x      expander
	work   int
	// Within one walk, distinct states are interned with a lazily filled
	// transition table: in most contexts (inside a string, a number, ...)
	// many trie nodes share a state, so most steps are a table lookup
	// instead of an expansion.
	ids    map[uint64]int32 // fingerprint -> state
	states []*walkState     // the first n are in use; the rest are kept for reuse
	n      int32
}

type walkState struct {
	set  stackSet
	nb   [4]uint64
	next [256]int32 // 0 unknown, -1 refused, k+1 state k
}

var maxWalkStates int32 = 1024 // a variable for tests

// fingerprint is an order-independent hash of a stack set.
func fingerprint(s *stackSet) uint64 {
	fp := uint64(len(s.ends)) * 0x9E3779B97F4A7C15
	for _, h := range s.hashes {
		fp += h*0xBF58476D1CE4E5B9 ^ h>>29
	}
	return fp
}

func sameSet(a, b *stackSet) bool {
	return slices.Equal(a.ends, b.ends) && slices.Equal(a.data, b.data)
}

// intern returns the id of s's interned copy, or -1 (table full or a
// fingerprint collision).
func (c *Constraint) intern(w *walker, s *stackSet) int32 {
	fp := fingerprint(s)
	if id, ok := w.ids[fp]; ok {
		if sameSet(&w.states[id].set, s) {
			return id
		}
		return -1
	}
	if w.n >= maxWalkStates {
		return -1
	}
	id := w.n
	w.n++
	if int(id) == len(w.states) {
		w.states = append(w.states, new(walkState))
	}
	st := w.states[id]
	st.set.copyFrom(s)
	st.nb = c.g.nextBytes(s)
	clear(st.next[:])
	w.ids[fp] = id
	return id
}

// maxMaskWork bounds the expansion work of one mask computation (about a
// third of a second). Ordinary grammars need a few percent of it even on
// large vocabularies; a pathological grammar that exceeds it gets the
// partial mask computed so far.
var maxMaskWork = 1 << 25 // a variable for tests

// computeMask returns the mask of cur and whether it is complete (false: the
// work budget ran out; the mask is then a subset of the allowed tokens).
func (c *Constraint) computeMask(cur *stackSet) ([]uint64, bool) {
	mask := make([]uint64, c.words)
	if canEnd(cur) {
		for _, id := range c.v.eog {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	w, _ := c.walkers.Get().(*walker)
	if w == nil {
		w = &walker{levels: make([]stackSet, c.v.maxDepth+1)}
	}
	w.work = 0
	if w.ids == nil {
		w.ids = make(map[uint64]int32)
	}
	clear(w.ids)
	w.n = 0
	if id := c.intern(w, cur); id >= 0 {
		c.walk(w, 0, 0, &w.states[id].set, id, mask)
	} else {
		c.walk(w, 0, 0, cur, -1, mask)
	}
	complete := w.work <= maxMaskWork
	c.walkers.Put(w)
	return mask, complete
}

// walk visits node in state s (interned as id, or -1) and its subtree.
func (c *Constraint) walk(w *walker, node int32, depth int, s *stackSet, id int32, mask []uint64) {
	v, g := c.v, c.g
	n := v.nodes[node]
	for _, t := range v.tokIDs[n.tokStart:n.tokEnd] {
		mask[t>>6] |= 1 << (t & 63)
	}
	if n.childStart == n.childEnd {
		return
	}
	var nb [4]uint64
	if id >= 0 {
		nb = w.states[id].nb
	} else {
		nb = g.nextBytes(s)
	}
	if nb == [4]uint64{} {
		return
	}
	level := &w.levels[depth+1]
	for ci := n.childStart; ci < n.childEnd; ci++ {
		b := v.childByte[ci]
		if nb[b>>6]&(1<<(b&63)) == 0 {
			continue
		}
		w.work++
		if w.work > maxMaskWork {
			return
		}
		if id >= 0 {
			switch t := w.states[id].next[b]; {
			case t > 0:
				c.walk(w, v.childNode[ci], depth+1, &w.states[t-1].set, t-1, mask)
				continue
			case t < 0:
				continue
			}
		}
		ok := w.x.advance(g, s, b, level)
		w.work += w.x.steps
		if w.work > maxMaskWork {
			return
		}
		if !ok {
			if id >= 0 {
				w.states[id].next[b] = -1
			}
			continue
		}
		nid := c.intern(w, level)
		if nid < 0 {
			c.walk(w, v.childNode[ci], depth+1, level, -1, mask)
			continue
		}
		if id >= 0 {
			w.states[id].next[b] = nid + 1
		}
		c.walk(w, v.childNode[ci], depth+1, &w.states[nid].set, nid, mask)
	}
}

// State is one sequence's position under a Constraint. It is not safe for
// concurrent use; Clone it to branch.
type State struct {
	c     *Constraint
	m     *Matcher
	ended bool
	mask  []uint64 // mask of the current state, once computed
	key   []byte
}

// Mask returns the bitset of allowed tokens (bit i of word i/64), of length
// (Len()+63)/64. It is read-only and may be shared with other states through
// the cache. End-of-generation tokens are set exactly when CanEnd. If no
// token at all is allowed (the vocabulary cannot continue the grammar and it
// cannot end here) the mask is all zero: callers must treat that as an
// error. After an end-of-generation token has been accepted the mask is all
// zero. The work of one mask computation is bounded: for a pathological
// grammar that exhausts the budget the mask holds only the allowed tokens
// found so far (it is not cached).
func (s *State) Mask() []uint64 {
	if s.mask != nil {
		return s.mask
	}
	if s.ended {
		s.mask = s.c.zero
		return s.mask
	}
	s.key = s.m.cur.key(s.key[:0])
	if m := s.c.lookup(string(s.key)); m != nil {
		s.mask = m
		return m
	}
	mask, complete := s.c.computeMask(&s.m.cur)
	if !complete {
		s.mask = mask
		return mask
	}
	s.mask = s.c.store(string(s.key), mask)
	return s.mask
}

// Allowed reports whether tok may come next, without building a mask (a
// computed mask is used if present).
func (s *State) Allowed(tok int32) bool {
	v := s.c.v
	if s.ended || tok < 0 || int(tok) >= v.n {
		return false
	}
	if s.mask != nil {
		return s.mask[tok>>6]&(1<<(tok&63)) != 0
	}
	if v.isEOG[tok] {
		return s.m.CanEnd()
	}
	p := v.pieces[tok]
	return len(p) > 0 && s.m.canAccept(p)
}

// Accept advances by tok's bytes. An end-of-generation token ends the
// sequence (it must be allowed: CanEnd); later Accepts fail. On error the
// state is unchanged.
func (s *State) Accept(tok int32) error {
	v := s.c.v
	switch {
	case s.ended:
		return fmt.Errorf("grammar: token %d after end of generation", tok)
	case tok < 0 || int(tok) >= v.n:
		return fmt.Errorf("grammar: token %d out of range [0, %d)", tok, v.n)
	case v.isEOG[tok]:
		if !s.m.CanEnd() {
			return fmt.Errorf("grammar: end-of-generation token %d not allowed: the grammar is not complete", tok)
		}
		s.ended = true
	case len(v.pieces[tok]) == 0:
		return fmt.Errorf("grammar: token %d has no text (control token) and is never allowed", tok)
	default:
		if !s.m.AcceptBytes(v.pieces[tok]) {
			return fmt.Errorf("grammar: token %d (%q) not allowed by the grammar here", tok, v.pieces[tok])
		}
	}
	s.mask = nil
	return nil
}

// CanEnd reports whether the grammar may be complete here (end-of-generation
// tokens are allowed).
func (s *State) CanEnd() bool { return !s.ended && s.m.CanEnd() }

// Done reports that no byte can follow: the caller should stop (only
// end-of-generation tokens are allowed). It is also true once an
// end-of-generation token has been accepted.
func (s *State) Done() bool { return s.ended || s.m.Done() }

// Ended reports whether an end-of-generation token has been accepted.
func (s *State) Ended() bool { return s.ended }

// Clone returns an independent copy of s.
func (s *State) Clone() *State {
	return &State{c: s.c, m: s.m.Clone(), ended: s.ended, mask: s.mask}
}

// Matcher returns the state's byte-level matcher (read it, do not advance it).
func (s *State) Matcher() *Matcher { return s.m }
