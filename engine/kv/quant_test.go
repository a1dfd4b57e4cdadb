package kv

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// TestQuantizedCache: a Q8_0 or Q4_0 cache stores each row as ggml's
// reference quantizer does; a head range exported from one cache and
// imported into another is the same words (nothing is re-quantized on the
// way); blocks carry the type, and a cache of another type refuses them;
// a head size that does not divide by 32 is refused with the reason.
func TestQuantizedCache(t *testing.T) {
	const layers, heads, hd = 2, 4, 64
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0} {
		cfg := Config{Layers: layers, KVDim: heads * hd, BlockSize: 4, NumBlocks: 8, Type: typ}
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		const n = 6
		for _, c := range []*Cache{a, b} {
			if _, err := c.Reserve(0, n); err != nil {
				t.Fatal(err)
			}
		}
		k, v := make([]float32, heads*hd), make([]float32, heads*hd)
		for l := 0; l < layers; l++ {
			for p := 0; p < n; p++ {
				for i := range k {
					k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
				}
				a.Put(l, a.Blocks(0), p, k, v)
				want := make([]byte, typ.RowSize(len(k)))
				quant.QuantizeRow(typ, k, want)
				if got := kernels.WordBytes(a.K(l, a.Blocks(0), p)); !slices.Equal(got, want) {
					t.Fatalf("%s: layer %d position %d: the stored key row is not the reference quantizer's", typ, l, p)
				}
			}
		}
		w := Words(typ, hd)
		if w*2 != typ.RowSize(hd) || cfg.RowWords() != heads*w {
			t.Fatalf("%s: %d words per head, %d per row", typ, w, cfg.RowWords())
		}
		ek, ev := make([]uint16, RangeLen(n, 1, 3, w)), make([]uint16, RangeLen(n, 1, 3, w))
		for l := 0; l < layers; l++ {
			if err := a.ExportRange(0, l, 0, n, 1, 3, w, ek, ev); err != nil {
				t.Fatal(err)
			}
			if err := b.ImportRange(0, l, 0, n, 1, 3, w, ek, ev); err != nil {
				t.Fatal(err)
			}
			for p := 0; p < n; p++ {
				if !slices.Equal(a.K(l, a.Blocks(0), p)[w:3*w], b.K(l, b.Blocks(0), p)[w:3*w]) ||
					!slices.Equal(a.V(l, a.Blocks(0), p)[w:3*w], b.V(l, b.Blocks(0), p)[w:3*w]) {
					t.Fatalf("%s: heads [1,3) of position %d differ after export and import", typ, p)
				}
			}
		}
		blk, err := a.ExportBlock(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.ImportBlock(1, blk); err != nil {
			t.Fatalf("%s: a block into a cache of its type: %v", typ, err)
		}
		f16, _ := New(Config{Layers: layers, KVDim: heads * hd, BlockSize: 4, NumBlocks: 8})
		if _, err := f16.ImportBlock(1, blk); err == nil {
			t.Errorf("%s: a block into an F16 cache: %v", typ, err)
		}
	}
	if _, err := New(Config{Layers: 1, KVDim: 48, NumBlocks: 4, Type: quant.Q8_0}); err == nil {
		t.Error("a Q8_0 cache of rows of 48 values")
	}
	if err := CheckType(quant.Q4_0, 48); err == nil || !strings.Contains(err.Error(), "divisible by 32") {
		t.Errorf("Q4_0 with heads of 48: %v", err)
	}
	if _, err := ParseType("q5_1"); err == nil {
		t.Error("q5_1 parsed as a cache type")
	}
}
