package kv

import (
	"strings"
	"testing"
)

// stamp is a distinct F16 bit pattern for one element of the source cache.
func stamp(isV bool, layer, pos, head, d int) uint16 {
	x := uint16(layer*1000 + pos*37 + head*7 + d)
	if isV {
		x ^= 0x8000
	}
	return x
}

// TestRangeAcrossSplits moves a prompt's KV from a cache holding layers
// [0,4) and all 4 heads into decode caches that split layers and heads
// differently and use another block size, in chunks that cross block
// boundaries, and compares every element with the source.
func TestRangeAcrossSplits(t *testing.T) {
	const (
		heads   = 4
		headDim = 3
		prompt  = 23
	)
	src, err := New(Config{FirstLayer: 0, Layers: 4, KVDim: heads * headDim, BlockSize: 4, NumBlocks: 16})
	if err != nil {
		t.Fatal(err)
	}
	// Interleave another sequence so that seq 1's blocks are not contiguous.
	for p := 0; p < prompt; p += 4 {
		if _, err := src.Reserve(1, min(4, prompt-p)); err != nil {
			t.Fatal(err)
		}
		if _, err := src.Reserve(2, 1); err != nil {
			t.Fatal(err)
		}
	}
	for l := 0; l < 4; l++ {
		for p := 0; p < prompt; p++ {
			k, v := src.K(l, src.Blocks(1), p), src.V(l, src.Blocks(1), p)
			for h := 0; h < heads; h++ {
				for d := 0; d < headDim; d++ {
					k[h*headDim+d] = stamp(false, l, p, h, d)
					v[h*headDim+d] = stamp(true, l, p, h, d)
				}
			}
		}
	}

	// A decode member: the global layers and heads it holds.
	type member struct {
		first, layers int
		headLo, hi    int
		blockSize     int
		c             *Cache
	}
	members := []*member{
		{first: 1, layers: 2, headLo: 0, hi: 2, blockSize: 3}, // stage [1,3), TP rank 0
		{first: 1, layers: 2, headLo: 2, hi: 4, blockSize: 3}, // stage [1,3), TP rank 1
		{first: 3, layers: 1, headLo: 0, hi: 4, blockSize: 5}, // stage [3,4), one node
		{first: 0, layers: 1, headLo: 1, hi: 3, blockSize: 16},
	}
	for _, m := range members {
		m.c, err = New(Config{FirstLayer: m.first, Layers: m.layers, KVDim: (m.hi - m.headLo) * headDim, BlockSize: m.blockSize, NumBlocks: 16})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.c.Reserve(5, 2); err != nil { // another sequence first
			t.Fatal(err)
		}
		if _, err := m.c.Reserve(9, prompt); err != nil {
			t.Fatal(err)
		}
	}

	// The sender exports all 4 heads in chunks of 5 positions (crossing its
	// blocks of 4 and the members' blocks of 3 and 5); each member takes its
	// layers and its heads of every chunk.
	const chunk = 5
	for l := 0; l < 4; l++ {
		for p := 0; p < prompt; p += chunk {
			n := min(chunk, prompt-p)
			k, v := make([]uint16, RangeLen(n, 0, heads, headDim)), make([]uint16, RangeLen(n, 0, heads, headDim))
			if err := src.ExportRange(1, l, p, n, 0, heads, headDim, k, v); err != nil {
				t.Fatal(err)
			}
			for _, m := range members {
				if l < m.first || l >= m.first+m.layers {
					continue
				}
				mk, mv := sliceHeads(k, n, heads, headDim, m.headLo, m.hi), sliceHeads(v, n, heads, headDim, m.headLo, m.hi)
				if err := m.c.ImportRange(9, l, p, n, 0, m.hi-m.headLo, headDim, mk, mv); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	for mi, m := range members {
		for l := m.first; l < m.first+m.layers; l++ {
			for p := 0; p < prompt; p++ {
				k, v := m.c.K(l-m.first, m.c.Blocks(9), p), m.c.V(l-m.first, m.c.Blocks(9), p)
				sk, sv := src.K(l, src.Blocks(1), p), src.V(l, src.Blocks(1), p)
				for h := m.headLo; h < m.hi; h++ {
					for d := 0; d < headDim; d++ {
						i := (h-m.headLo)*headDim + d
						if k[i] != sk[h*headDim+d] || v[i] != sv[h*headDim+d] {
							t.Fatalf("member %d layer %d pos %d head %d dim %d: k %#x v %#x, source k %#x v %#x",
								mi, l, p, h, d, k[i], v[i], sk[h*headDim+d], sv[h*headDim+d])
						}
					}
				}
			}
		}
		// The other sequence's positions are untouched.
		for l := 0; l < m.layers; l++ {
			for p := 0; p < 2; p++ {
				for _, x := range m.c.K(l, m.c.Blocks(5), p) {
					if x != 0 {
						t.Fatalf("member %d: import wrote into sequence 5", mi)
					}
				}
			}
		}
	}

	// Exporting a head sub-range directly gives the same as slicing.
	k, v := make([]uint16, RangeLen(7, 1, 3, headDim)), make([]uint16, RangeLen(7, 1, 3, headDim))
	if err := src.ExportRange(1, 2, 10, 7, 1, 3, headDim, k, v); err != nil {
		t.Fatal(err)
	}
	for tt := 0; tt < 7; tt++ {
		for h := 1; h < 3; h++ {
			for d := 0; d < headDim; d++ {
				i := (tt*2+h-1)*headDim + d
				if k[i] != stamp(false, 2, 10+tt, h, d) || v[i] != stamp(true, 2, 10+tt, h, d) {
					t.Fatalf("sub-range export pos %d head %d dim %d: k %#x v %#x", 10+tt, h, d, k[i], v[i])
				}
			}
		}
	}
}

// sliceHeads takes heads [lo,hi) of a [position][head][dim] run.
func sliceHeads(x []uint16, n, heads, headDim, lo, hi int) []uint16 {
	out := make([]uint16, 0, n*(hi-lo)*headDim)
	for t := 0; t < n; t++ {
		out = append(out, x[(t*heads+lo)*headDim:(t*heads+hi)*headDim]...)
	}
	return out
}

func TestRangeErrors(t *testing.T) {
	c, err := New(Config{FirstLayer: 2, Layers: 2, KVDim: 8, BlockSize: 4, NumBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(1, 6); err != nil {
		t.Fatal(err)
	}
	buf := func(n int) []uint16 { return make([]uint16, n) }
	cases := []struct {
		name                                string
		seq                                 SeqID
		layer, pos, n, headLo, headHi, hdim int
		lenK, lenV                          int
		want                                string
	}{
		{"layer below", 1, 1, 0, 1, 0, 2, 4, 8, 8, "layer 1: this cache holds layers [2,4)"},
		{"layer above", 1, 4, 0, 1, 0, 2, 4, 8, 8, "layer 4: this cache holds layers [2,4)"},
		{"head dim zero", 1, 2, 0, 1, 0, 2, 0, 0, 0, "head width 0"},
		{"head dim not dividing", 1, 2, 0, 1, 0, 1, 3, 3, 3, "head width 3: it must be positive and divide this cache's row of 8 words"},
		{"heads above", 1, 2, 0, 1, 1, 3, 4, 8, 8, "heads [1,3): this cache holds heads [0,2) of dim 4"},
		{"heads negative", 1, 2, 0, 1, -1, 1, 4, 8, 8, "heads [-1,1)"},
		{"heads inverted", 1, 2, 0, 1, 2, 1, 4, 0, 0, "heads [2,1)"},
		{"negative count", 1, 2, 0, -1, 0, 2, 4, 0, 0, "of -1 positions"},
		{"short k", 1, 2, 0, 2, 0, 2, 4, 15, 16, "takes 16 values each for k and v, got 15 and 16"},
		{"long v", 1, 2, 0, 2, 0, 2, 4, 16, 17, "got 16 and 17"},
		{"past the end", 1, 2, 4, 3, 0, 2, 4, 24, 24, "positions [4,7) of sequence 1, which has 6 reserved"},
		{"negative pos", 1, 2, -1, 1, 0, 2, 4, 8, 8, "positions [-1,0)"},
		{"unknown sequence", 3, 2, 0, 1, 0, 2, 4, 8, 8, "sequence 3 is not in the cache"},
	}
	for _, tc := range cases {
		for _, op := range []string{"export", "import"} {
			k, v := buf(tc.lenK), buf(tc.lenV)
			for i := range k {
				k[i] = 0x1234
			}
			var err error
			if op == "export" {
				err = c.ExportRange(tc.seq, tc.layer, tc.pos, tc.n, tc.headLo, tc.headHi, tc.hdim, k, v)
			} else {
				err = c.ImportRange(tc.seq, tc.layer, tc.pos, tc.n, tc.headLo, tc.headHi, tc.hdim, k, v)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "kv: "+op) {
				t.Errorf("%s %s: error %v, want one containing %q", op, tc.name, err, tc.want)
			}
			for i := range k {
				if k[i] != 0x1234 {
					t.Fatalf("%s %s: failed export wrote into k", op, tc.name)
				}
			}
		}
	}
	// Nothing was imported by the failed calls.
	for l := 0; l < 2; l++ {
		for p := 0; p < 6; p++ {
			for _, x := range c.K(l, c.Blocks(1), p) {
				if x != 0 {
					t.Fatalf("a failed import wrote layer %d pos %d", l+2, p)
				}
			}
		}
	}
	// An empty range is valid and does nothing.
	if err := c.ImportRange(1, 3, 6, 0, 1, 1, 4, nil, nil); err != nil {
		t.Fatalf("empty range: %v", err)
	}
}

// TestImportRefusesPrefixBlocks: a block another prompt may read (published
// or shared) is never written by an import.
func TestImportRefusesPrefixBlocks(t *testing.T) {
	c, err := New(Config{Layers: 1, KVDim: 2, BlockSize: 4, NumBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6}
	keys := c.PrefixKeys(toks, nil)
	if _, err := c.Reserve(1, len(toks)); err != nil {
		t.Fatal(err)
	}
	c.Publish(1, toks, keys)
	one := make([]uint16, 2)
	if err := c.ImportRange(1, 0, 3, 1, 0, 1, 2, one, one); err == nil || !strings.Contains(err.Error(), "prefix cache") {
		t.Fatalf("import into a published block: %v", err)
	}
	// The block after the published one is the sequence's own.
	if err := c.ImportRange(1, 0, 4, 1, 0, 1, 2, one, one); err != nil {
		t.Fatalf("import after the published block: %v", err)
	}
	if got := c.Share(2, toks, keys); got != 4 {
		t.Fatalf("share: %d positions, want 4", got)
	}
	if err := c.ImportRange(2, 0, 0, 1, 0, 1, 2, one, one); err == nil || !strings.Contains(err.Error(), "prefix cache") {
		t.Fatalf("import into a shared block: %v", err)
	}
	// Export from a shared block is fine.
	if err := c.ExportRange(2, 0, 0, 1, 0, 1, 2, one, one); err != nil {
		t.Fatalf("export from a shared block: %v", err)
	}
}

// TestRangeNoHeads: a tensor-parallel member holding no heads (KVDim 0)
// accepts the empty head range and refuses any other.
func TestRangeNoHeads(t *testing.T) {
	c, err := New(Config{Layers: 1, KVDim: 0, BlockSize: 4, NumBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(1, 5); err != nil {
		t.Fatal(err)
	}
	if err := c.ImportRange(1, 0, 0, 5, 0, 0, 64, nil, nil); err != nil {
		t.Fatalf("empty head range: %v", err)
	}
	if err := c.ExportRange(1, 0, 0, 5, 0, 1, 64, make([]uint16, 320), make([]uint16, 320)); err == nil {
		t.Fatal("a cache without heads exported one")
	}
}

func TestRangeLen(t *testing.T) {
	for _, tc := range []struct{ n, lo, hi, dim, want int }{
		{3, 0, 4, 2, 24}, {3, 2, 4, 2, 12}, {0, 0, 4, 2, 0}, {3, 4, 2, 2, 0}, {3, 0, 4, 0, 0}, {-1, 0, 1, 1, 0},
	} {
		if got := RangeLen(tc.n, tc.lo, tc.hi, tc.dim); got != tc.want {
			t.Errorf("RangeLen(%d, %d, %d, %d) = %d, want %d", tc.n, tc.lo, tc.hi, tc.dim, got, tc.want)
		}
	}
}
