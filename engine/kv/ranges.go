package kv

import "fmt"

// Range export and import move one layer's K and V for a run of positions
// and a run of KV heads of one sequence, whatever blocks hold them. They
// serve disaggregated prefill/decode, where the two sides may split layers
// (pipeline stages) and KV heads (tensor-parallel members) differently, so a
// transfer is cut into (layer, positions, heads) pieces rather than blocks.
//
// The layout of k and v is [position][head][word]: word
// (t*(headHi-headLo) + h)*headDim + d is word d of head headLo+h at
// position pos+t. headDim counts words: a head's size for an F16 cache (a
// word is a value's F16 bits), Words(type, size) for a quantized one (its
// blocks' bytes). Heads are numbered within this cache's rows (head 0 is
// the first head this cache holds, whatever its global number).

// ExportRange copies K and V of positions [pos, pos+n) of sequence seq, for
// the global layer index layer and the heads [headLo, headHi) of width
// headDim, into k and v, which must each hold exactly
// n*(headHi-headLo)*headDim elements (RangeLen); v may be empty when V is a
// view of K (Config.VInK). The positions must be
// reserved (below Len(seq)). Nothing is written to k or v on error.
func (c *Cache) ExportRange(seq SeqID, layer, pos, n, headLo, headHi, headDim int, k, v []uint16) error {
	r, err := c.rangeOf("export", seq, layer, pos, n, headLo, headHi, headDim, len(k), len(v), false)
	if err != nil {
		return err
	}
	c.eachRun(r, pos, n, headLo, headHi, headDim, k, v, c.store.ReadRows)
	return nil
}

// ImportRange writes k and v, laid out as ExportRange gives them, into
// positions [pos, pos+n) of sequence seq for the global layer index layer
// and the heads [headLo, headHi) of width headDim. The positions must have
// been reserved for seq (Reserve) and must not lie in a block the prefix
// cache holds (registered by Publish, or shared with another sequence by
// Share): writing there would change what other prompts read. A receiver
// reserves a prompt's positions first, then imports every layer and head
// range as it arrives. Nothing is written to the cache on error.
func (c *Cache) ImportRange(seq SeqID, layer, pos, n, headLo, headHi, headDim int, k, v []uint16) error {
	r, err := c.rangeOf("import", seq, layer, pos, n, headLo, headHi, headDim, len(k), len(v), true)
	if err != nil {
		return err
	}
	c.eachRun(r, pos, n, headLo, headHi, headDim, k, v, c.store.WriteRows)
	return nil
}

// eachRun applies a Store row copy to the positions [pos, pos+n) of r, one
// call per block they touch.
func (c *Cache) eachRun(r checkedRange, pos, n, headLo, headHi, headDim int, k, v []uint16, rows func(layer int, block int32, slot, n, lo, hi int, k, v []uint16)) {
	bs, w := c.cfg.BlockSize, (headHi-headLo)*headDim
	if len(v) == 0 {
		v = k // V is a view of K (Config.VInK): the store does not read or write it
	}
	for t := 0; t < n; {
		p := pos + t
		run := min(n-t, bs-p%bs)
		rows(r.local, r.blocks[p/bs], p%bs, run, headLo*headDim, headHi*headDim, k[t*w:(t+run)*w], v[t*w:(t+run)*w])
		t += run
	}
}

// RangeLen is the number of elements each of k and v holds for n positions
// of the heads [headLo, headHi) of width headDim (0 for an empty or
// inverted range).
func RangeLen(n, headLo, headHi, headDim int) int {
	if n <= 0 || headHi <= headLo || headDim <= 0 {
		return 0
	}
	return n * (headHi - headLo) * headDim
}

// checkedRange is a validated range: the local layer index and the
// sequence's block table.
type checkedRange struct {
	local  int
	blocks []int32
}

// rangeOf validates a range request and returns the local layer and the
// sequence's block table. With writing set, positions in blocks the prefix
// cache holds are refused.
func (c *Cache) rangeOf(op string, seq SeqID, layer, pos, n, headLo, headHi, headDim, lenK, lenV int, writing bool) (checkedRange, error) {
	cfg := c.cfg
	if layer < cfg.FirstLayer || layer >= cfg.FirstLayer+cfg.Layers {
		return checkedRange{}, fmt.Errorf("kv: %s layer %d: this cache holds layers [%d,%d)", op, layer, cfg.FirstLayer, cfg.FirstLayer+cfg.Layers)
	}
	row := cfg.RowWords()
	if headDim <= 0 || row%headDim != 0 {
		return checkedRange{}, fmt.Errorf("kv: %s with head width %d: it must be positive and divide this cache's row of %d words", op, headDim, row)
	}
	if heads := row / headDim; headLo < 0 || headLo > headHi || headHi > heads {
		return checkedRange{}, fmt.Errorf("kv: %s heads [%d,%d): this cache holds heads [0,%d) of dim %d", op, headLo, headHi, heads, headDim)
	}
	if n < 0 {
		return checkedRange{}, fmt.Errorf("kv: %s of %d positions", op, n)
	}
	want := n * (headHi - headLo) * headDim
	if lenK != want || lenV != want && !(cfg.VInK && lenV == 0) {
		return checkedRange{}, fmt.Errorf("kv: %s of %d positions × heads [%d,%d) × dim %d takes %d values each for k and v, got %d and %d",
			op, n, headLo, headHi, headDim, want, lenK, lenV)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seqs[seq]
	if s == nil {
		return checkedRange{}, fmt.Errorf("kv: %s: sequence %d is not in the cache", op, seq)
	}
	if pos < 0 || pos > s.n-n {
		return checkedRange{}, fmt.Errorf("kv: %s positions [%d,%d) of sequence %d, which has %d reserved", op, pos, pos+n, seq, s.n)
	}
	if writing && n > 0 {
		bs := cfg.BlockSize
		for i := pos / bs; i <= (pos+n-1)/bs; i++ {
			if b := s.blocks[i]; c.ref[b] > 1 || c.reg[b] != nil {
				return checkedRange{}, fmt.Errorf("kv: import positions [%d,%d) of sequence %d: block %d of its table (positions [%d,%d)) is in the prefix cache and must not be written",
					pos, pos+n, seq, i, i*bs, (i+1)*bs)
			}
		}
	}
	return checkedRange{local: layer - cfg.FirstLayer, blocks: s.blocks}, nil
}
