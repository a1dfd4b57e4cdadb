package kv

import (
	"errors"
	"testing"
)

// fill writes position-dependent rows for tokens [from, to) of seq.
func fill(c *Cache, seq SeqID, toks []int32, from int) {
	for p := from; p < len(toks); p++ {
		r := []float32{float32(toks[p]), float32(p), 1, 2}
		c.Put(0, c.Blocks(seq), p, r, r)
	}
}

func TestPrefixShare(t *testing.T) {
	c, err := New(Config{Layers: 1, KVDim: 4, BlockSize: 4, NumBlocks: 6})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	keys := c.PrefixKeys(prompt, nil)
	if len(keys) != 2 || keys[0] == keys[1] {
		t.Fatalf("keys %v: want 2 distinct (10 tokens, blocks of 4)", keys)
	}
	// Nothing cached yet.
	if n := c.Share(1, prompt, keys); n != 0 {
		t.Fatalf("share on an empty cache: %d", n)
	}
	if _, err := c.Reserve(1, len(prompt)); err != nil {
		t.Fatal(err)
	}
	fill(c, 1, prompt, 0)
	c.Publish(1, prompt, keys)
	if c.CachedBlocks() != 2 {
		t.Fatalf("cached %d blocks, want 2", c.CachedBlocks())
	}
	// A second sequence with the same first 9 tokens shares both blocks
	// while the first still holds them.
	other := append(append([]int32(nil), prompt[:9]...), 99, 100)
	ok := c.PrefixKeys(other, nil)
	if n := c.Share(2, other, ok); n != 8 {
		t.Fatalf("shared %d positions, want 8", n)
	}
	if got, want := c.Blocks(2), c.Blocks(1)[:2]; got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("blocks %v, want %v", got, want)
	}
	if p, err := c.Reserve(2, 3); err != nil || p != 8 {
		t.Fatalf("reserve after share: %d %v", p, err)
	}
	if c.K(0, c.Blocks(2), 5)[0] != c.K(0, c.Blocks(1), 5)[0] {
		t.Fatal("shared position 5 differs")
	}
	// A prompt differing inside the second block shares only the first.
	diff := []int32{1, 2, 3, 4, 5, 6, 0, 8, 9}
	if n := c.Share(3, diff, c.PrefixKeys(diff, nil)); n != 4 {
		t.Fatalf("shared %d, want 4", n)
	}
	c.Free(3)
	// Freed sequences leave their registered blocks readable but reusable.
	c.Free(1)
	c.Free(2)
	if c.FreeBlocks() != 6 || c.CachedBlocks() != 2 {
		t.Fatalf("free %d cached %d, want 6 and 2", c.FreeBlocks(), c.CachedBlocks())
	}
	if n := c.Share(4, prompt, keys); n != 8 {
		t.Fatalf("share after the holders ended: %d, want 8", n)
	}
	if c.FreeBlocks() != 4 {
		t.Fatalf("free %d, want 4 with two blocks held again", c.FreeBlocks())
	}
	c.Free(4)
	// Filling the whole pool evicts the idle cached blocks.
	if _, err := c.Reserve(5, 24); err != nil {
		t.Fatal(err)
	}
	if c.CachedBlocks() != 0 {
		t.Fatalf("cached %d after eviction", c.CachedBlocks())
	}
	if _, err := c.Reserve(6, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("reserve in a full pool: %v", err)
	}
	if n := c.Share(7, prompt, keys); n != 0 {
		t.Fatalf("shared %d evicted positions", n)
	}
}

// A key found with other tokens (a collision, or a stale entry) is not used.
func TestPrefixVerifiesTokens(t *testing.T) {
	c, _ := New(Config{Layers: 1, KVDim: 4, BlockSize: 4, NumBlocks: 4})
	a := []int32{1, 2, 3, 4, 5}
	ka := c.PrefixKeys(a, nil)
	c.Reserve(1, len(a))
	c.Publish(1, a, ka)
	b := []int32{9, 9, 9, 9, 9}
	if n := c.Share(2, b, ka); n != 0 {
		t.Fatalf("shared %d positions of other tokens under a's key", n)
	}
	// Publishing only covers filled blocks.
	c.Reserve(3, 3)
	c.Publish(3, []int32{1, 2, 3}, c.PrefixKeys([]int32{1, 2, 3, 4}, nil))
	if c.CachedBlocks() != 1 {
		t.Fatalf("cached %d, want 1 (sequence 3 has no full block)", c.CachedBlocks())
	}
	// Truncating into a registered block unregisters it.
	c.Truncate(1, 2)
	if c.CachedBlocks() != 0 {
		t.Fatalf("cached %d after truncating into the block", c.CachedBlocks())
	}
}

// Extending earlier keys gives the keys computed from scratch.
func TestPrefixKeysExtend(t *testing.T) {
	c, _ := New(Config{Layers: 1, KVDim: 4, BlockSize: 4, NumBlocks: 4})
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	full := c.PrefixKeys(toks, nil)
	part := c.PrefixKeys(toks[:6], nil)
	if len(full) != 3 || len(part) != 1 || part[0] != full[0] {
		t.Fatalf("full %v part %v", full, part)
	}
	if got := c.PrefixKeys(toks, part); len(got) != 3 || got[1] != full[1] || got[2] != full[2] {
		t.Fatalf("extended %v, want %v", got, full)
	}
	if got := c.PrefixKeys(toks[:9], full); len(got) != 2 || got[1] != full[1] {
		t.Fatalf("shortened %v", got)
	}
}
