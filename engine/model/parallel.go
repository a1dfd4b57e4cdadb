package model

import (
	"fmt"
	"slices"

	"shoal/engine/device"
	"shoal/engine/quant"
)

// Collective is the group communication a tensor-parallel member needs
// (see device.Collective). The transport implements it over QUIC; tests
// use an in-memory one.
type Collective = device.Collective

// Slice is the part of each layer a tensor-parallel member holds and runs.
//
// Query heads [HeadLo,HeadHi) may be any range; the member holds the KV
// heads they use (KVHeads) and caches only those. A range that ends inside
// a GQA group shares that group's KV head with the next member: both
// compute and cache it (with one KV head, multi-query attention, every
// member does), as vLLM replicates KV heads across more ranks than there
// are KV heads. FFN columns [FFNLo,FFNHi) are
// rows of ffn_gate/ffn_up and columns of ffn_down (of the dense FFN, or of
// the shared expert in a MoE model; ignored for MoE models without one).
// Experts are the routed experts held, ascending (nil = all). Rank and Size
// place the member in its group (Size 0 or 1: a single member).
//
// A group's head and FFN ranges partition the model's, in rank order, and
// its expert sets partition the experts. The members of a group may differ
// in how many heads, columns and experts they hold, zero included.
//
// # Column splits
//
// attn_output and ffn_down are split by input columns. When the member's
// column range starts and ends on quantization block boundaries of the
// matrix's type (ColumnSplitAligned), the member holds those columns of
// every row, multiplies its part of the input and the group all-reduces the
// partial products (one AllReduceSum per matrix). When it does not (a Q4_K
// attn_output of 256 columns split between two members, say), a column
// slice cannot be stored: the member instead holds whole rows
// OutputRows(Rank, Size, rows) of the matrix, the group all-gathers the
// input (every member then has the full attention output or FFN
// intermediate), each member computes its output rows from it and the group
// all-gathers those. This costs two all-gathers instead of one all-reduce
// (about the same bytes) and keeps weights and work split; its products are
// those of a single node. Both sides decide per matrix from the type and the
// range alone, so shard.Slices loads what the runner expects; every member
// of a group must reach the same decision for each matrix (the runner checks
// this the first time it runs).
type Slice struct {
	Rank, Size     int
	HeadLo, HeadHi int
	FFNLo, FFNHi   int
	Experts        []int
}

// ColumnSplitAligned reports whether a member holding columns [lo,hi) of a
// matrix of type t keeps a column slice (both ends on block boundaries of
// t and of its activation format) rather than whole output rows.
func ColumnSplitAligned(t quant.Type, lo, hi int) bool {
	bl := max(t.BlockLen(), quant.VecDotType(t).BlockLen(), 1)
	return lo%bl == 0 && hi%bl == 0
}

// OutputRows is the range of output rows [lo,hi) of a matrix with rows rows
// that member rank of size computes when its column split is not block
// aligned: an even split, the first rows%size members one row more.
func OutputRows(rank, size, rows int) (lo, hi int) {
	if size <= 1 {
		return 0, rows
	}
	per, extra := rows/size, rows%size
	lo = rank*per + min(rank, extra)
	hi = lo + per
	if rank < extra {
		hi++
	}
	return lo, hi
}

// FFNDim is the size of the splittable FFN: the dense FFN, the shared expert
// of a MoE model, or 0 when there is none (routed experts are split by
// expert, not by column).
func (c *Config) FFNDim() int {
	switch {
	case !c.IsMoE():
		return c.NFF
	case c.Arch.SharedFFN:
		return c.NFFShared
	}
	return 0
}

// LayerFFN is the FFN width of layer l and the columns [lo,hi) of it that
// the member of a tensor-parallel group with slice s holds. That is s's FFN
// range, except in a MoE model's leading dense layers, whose FFN is NFF
// wide while the range is of the shared expert: there the range is scaled
// to NFF with its ends on multiples of 32 (whole blocks of the 32-wide
// formats), so the group's ranges still partition the layer; without a
// shared expert, rank 0 holds those layers' whole FFN.
func (c *Config) LayerFFN(l int, s *Slice) (dim, lo, hi int) {
	if !c.IsMoE() || c.MoELayer(l) {
		return c.FFNDim(), s.FFNLo, s.FFNHi
	}
	d := c.FFNDim()
	if d == 0 {
		if s.Rank == 0 {
			return c.NFF, 0, c.NFF
		}
		return c.NFF, 0, 0
	}
	scale := func(x int) int {
		if x >= d {
			return c.NFF
		}
		return x * c.NFF / d / 32 * 32
	}
	return c.NFF, scale(s.FFNLo), scale(s.FFNHi)
}

// whole is the slice of a single member holding everything.
func (c *Config) whole() Slice {
	return Slice{Size: 1, HeadHi: c.NHead, FFNHi: c.FFNDim()}
}

// check validates s against the model.
func (s *Slice) check(c *Config) error {
	switch {
	case s.Size < 1 || s.Rank < 0 || s.Rank >= s.Size:
		return fmt.Errorf("tensor-parallel rank %d of %d is invalid", s.Rank, s.Size)
	case s.HeadLo < 0 || s.HeadHi > c.NHead || s.HeadLo > s.HeadHi:
		return fmt.Errorf("head range [%d,%d) is not within [0,%d)", s.HeadLo, s.HeadHi, c.NHead)
	case c.FFNDim() > 0 && (s.FFNLo < 0 || s.FFNHi > c.FFNDim() || s.FFNLo > s.FFNHi):
		return fmt.Errorf("FFN range [%d,%d) is not within [0,%d)", s.FFNLo, s.FFNHi, c.FFNDim())
	}
	for i, x := range s.Experts {
		if x < 0 || x >= c.NExpert || (i > 0 && x <= s.Experts[i-1]) {
			return fmt.Errorf("experts %v are not ascending ids in [0,%d)", s.Experts, c.NExpert)
		}
	}
	if s.Size == 1 && (s.HeadLo != 0 || s.HeadHi != c.NHead || (c.FFNDim() > 0 && (s.FFNLo != 0 || s.FFNHi != c.FFNDim())) ||
		(s.Experts != nil && len(s.Experts) != c.NExpert)) {
		return fmt.Errorf("a single member must hold every head, FFN column and expert")
	}
	return nil
}

// KVHeads is the range of the model's KV heads the slice's query heads
// use: [HeadLo/g, ceil(HeadHi/g)) for GQA groups of g query heads, empty
// when the slice holds no query head.
func (s *Slice) KVHeads(c *Config) (lo, hi int) {
	if s.HeadHi <= s.HeadLo {
		return 0, 0
	}
	g := c.NHead / c.NHeadKV
	return s.HeadLo / g, (s.HeadHi + g - 1) / g
}

// OwnedKVHeads is the part of KVHeads whose first query head the slice
// holds: among the members of a group, each KV head is owned by exactly
// one (the one a KV transfer takes it from).
func (s *Slice) OwnedKVHeads(c *Config) (lo, hi int) {
	if s.HeadHi <= s.HeadLo {
		return 0, 0
	}
	g := c.NHead / c.NHeadKV
	return (s.HeadLo + g - 1) / g, (s.HeadHi + g - 1) / g
}

// normalize fills in what the zero values of s leave open.
func (s Slice) normalize(c *Config) Slice {
	if s.Size == 0 {
		s.Size = 1
	}
	if c.FFNDim() == 0 {
		s.FFNLo, s.FFNHi = 0, 0
	}
	if !c.IsMoE() {
		s.Experts = nil
	}
	return s
}

func (s *Slice) equal(o *Slice) bool {
	return s.Rank == o.Rank && s.Size == o.Size && s.HeadLo == o.HeadLo && s.HeadHi == o.HeadHi &&
		s.FFNLo == o.FFNLo && s.FFNHi == o.FFNHi && slices.Equal(s.Experts, o.Experts)
}

// holds reports whether the slice holds routed expert x.
func (s *Slice) holds(x int) bool {
	if s.Experts == nil {
		return true
	}
	_, ok := slices.BinarySearch(s.Experts, x)
	return ok
}

// tpState is a runner's view of its tensor-parallel group.
type tpState struct {
	coll    Collective
	ordered *orderedColl // coll, with background all-reduces (coll is this)
	// Per rank, set by the handshake: the query columns (heads × head size)
	// and FFN columns held, and the output rows computed of a gathered
	// attn_output or ffn_down.
	attnCols, ffnCols, outRows []int
	denseCols                  []int // FFN columns of a MoE model's leading dense layers
	agreed                     bool
}

// handshake runs once, on the first Forward of a tensor-parallel runner: the
// members exchange their slices and per-layer split decisions and check that
// they describe one consistent group.
func (r *Runner) handshake() error {
	t, m, sl := r.tp, r.m, &r.sl
	n := t.coll.Size()
	const hdrLen = 6
	mine := []float32{float32(sl.HeadLo), float32(sl.HeadHi), float32(sl.FFNLo), float32(sl.FFNHi), float32(r.lo), float32(r.hi)}
	all := make([]float32, hdrLen*n)
	if err := t.coll.AllGather(mine, all); err != nil {
		return fmt.Errorf("tensor-parallel handshake: %w", err)
	}
	peer := func(p, i int) int { return int(all[p*hdrLen+i]) }
	t.attnCols, t.ffnCols, t.denseCols = make([]int, n), make([]int, n), make([]int, n)
	headAt, ffnAt := 0, 0
	for p := range n {
		if peer(p, 4) != r.lo || peer(p, 5) != r.hi {
			return fmt.Errorf("tensor-parallel member %d runs layers [%d,%d), member %d [%d,%d)", p, peer(p, 4), peer(p, 5), sl.Rank, r.lo, r.hi)
		}
		if peer(p, 0) != headAt {
			return fmt.Errorf("tensor-parallel member %d holds heads from %d, want %d (ranges must partition the heads in rank order)", p, peer(p, 0), headAt)
		}
		if m.FFNDim() > 0 && peer(p, 2) != ffnAt {
			return fmt.Errorf("tensor-parallel member %d holds FFN columns from %d, want %d (ranges must partition them in rank order)", p, peer(p, 2), ffnAt)
		}
		headAt, ffnAt = peer(p, 1), peer(p, 3)
		t.attnCols[p] = (peer(p, 1) - peer(p, 0)) * m.OutHeadDim()
		t.ffnCols[p] = peer(p, 3) - peer(p, 2)
		if m.DenseLead > 0 && m.IsMoE() {
			_, lo, hi := m.LayerFFN(0, &Slice{Rank: p, FFNLo: peer(p, 2), FFNHi: peer(p, 3)})
			t.denseCols[p] = hi - lo
		}
	}
	if headAt != m.NHead || ffnAt != m.FFNDim() {
		return fmt.Errorf("tensor-parallel group holds heads [0,%d) of %d and FFN columns [0,%d) of %d", headAt, m.NHead, ffnAt, m.FFNDim())
	}

	// Per layer: whether attn_output, ffn_down and the shared ffn_down are
	// gathered; then which experts this member holds.
	L := r.hi - r.lo
	per := 3*L + m.NExpert
	mine = make([]float32, per)
	for l := r.lo; l < r.hi; l++ {
		ly := &m.W.Layers[l]
		for k, g := range []bool{ly.WoGather, ly.DownGather, ly.ShDownGather} {
			if g {
				mine[3*(l-r.lo)+k] = 1
			}
		}
	}
	for x := range m.NExpert {
		if sl.holds(x) {
			mine[3*L+x] = 1
		}
	}
	all = make([]float32, per*n)
	if err := t.coll.AllGather(mine, all); err != nil {
		return fmt.Errorf("tensor-parallel handshake: %w", err)
	}
	for i := range per {
		sum := float32(0)
		for p := range n {
			sum += all[p*per+i]
		}
		switch {
		case i < 3*L && sum != 0 && int(sum) != n:
			return fmt.Errorf("layer %d: tensor-parallel members disagree on whether %s is column split or gathered (a block-aligned column range on some members, not on others)",
				r.lo+i/3, [...]string{"attn_output", "ffn_down", "ffn_down_shexp"}[i%3])
		case i >= 3*L && sum != 1:
			return fmt.Errorf("routed expert %d is held by %d tensor-parallel members, want 1", i-3*L, int(sum))
		}
	}
	t.outRows = make([]int, n)
	for p := range n {
		lo, hi := OutputRows(p, n, m.NEmbd)
		t.outRows[p] = hi - lo
	}
	r.dev.SetGroup(device.Group{AttnCols: t.attnCols, FFNCols: t.ffnCols, DenseCols: t.denseCols, OutRows: t.outRows})
	t.agreed = true
	return nil
}
