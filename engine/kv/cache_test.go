package kv

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"shoal/engine/quant"
)

func TestReservePutGet(t *testing.T) {
	c, err := New(Config{Layers: 2, KVDim: 4, BlockSize: 4, NumBlocks: 5})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.Reserve(1, 6); err != nil || p != 0 {
		t.Fatalf("reserve: %d %v", p, err)
	}
	if p, err := c.Reserve(2, 3); err != nil || p != 0 {
		t.Fatalf("reserve 2: %d %v", p, err)
	}
	if p, err := c.Reserve(1, 3); err != nil || p != 6 {
		t.Fatalf("reserve again: %d %v", p, err)
	}
	if c.Len(1) != 9 || len(c.Blocks(1)) != 3 || c.FreeBlocks() != 1 {
		t.Fatalf("len %d blocks %d free %d", c.Len(1), len(c.Blocks(1)), c.FreeBlocks())
	}
	for pos := 0; pos < 9; pos++ {
		k := []float32{float32(pos), 1, 2, 3}
		v := []float32{-float32(pos), 0.1, 0, 0}
		c.Put(1, c.Blocks(1), pos, k, v)
	}
	c.Put(1, c.Blocks(2), 0, []float32{100, 0, 0, 0}, []float32{0, 0, 0, 0})
	for pos := 0; pos < 9; pos++ {
		if got := quant.FP16ToFP32(c.K(1, c.Blocks(1), pos)[0]); got != float32(pos) {
			t.Fatalf("K pos %d = %v", pos, got)
		}
		if got := quant.FP16ToFP32(c.V(1, c.Blocks(1), pos)[1]); got != quant.FP16ToFP32(quant.FP32ToFP16(0.1)) {
			t.Fatalf("V pos %d = %v (F16 rounding of 0.1 expected)", pos, got)
		}
	}
	if _, err := c.Reserve(3, 8); !errors.Is(err, ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
	if c.Len(3) != 0 || c.FreeBlocks() != 1 {
		t.Fatal("failed reserve changed the cache")
	}
	c.Truncate(1, 4)
	if c.Len(1) != 4 || c.FreeBlocks() != 3 {
		t.Fatalf("after truncate: len %d free %d", c.Len(1), c.FreeBlocks())
	}
	c.Free(1)
	c.Free(2)
	if c.FreeBlocks() != 5 {
		t.Fatalf("free %d", c.FreeBlocks())
	}
}

func TestExportImport(t *testing.T) {
	cfg := Config{FirstLayer: 2, Layers: 2, KVDim: 8, BlockSize: 4, NumBlocks: 4}
	src, _ := New(cfg)
	dst, _ := New(cfg)
	src.Reserve(7, 6)
	for l := 0; l < 2; l++ {
		for pos := 0; pos < 6; pos++ {
			k, v := make([]float32, 8), make([]float32, 8)
			for i := range k {
				k[i], v[i] = float32(l*100+pos*10+i), float32(-i)
			}
			src.Put(l, src.Blocks(7), pos, k, v)
		}
	}
	for i := 0; i < 2; i++ {
		b, err := src.ExportBlock(7, i)
		if err != nil {
			t.Fatal(err)
		}
		n, err := dst.ImportBlock(9, b)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int{4, 2}[i]; n != want {
			t.Fatalf("block %d: %d positions, want %d", i, n, want)
		}
	}
	if dst.Len(9) != 6 {
		t.Fatalf("len %d", dst.Len(9))
	}
	for l := 0; l < 2; l++ {
		for pos := 0; pos < 6; pos++ {
			a, b := src.K(l, src.Blocks(7), pos), dst.K(l, dst.Blocks(9), pos)
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("layer %d pos %d differs", l, pos)
				}
			}
		}
	}
	good, _ := src.ExportBlock(7, 0)
	bad := append([]byte(nil), good...)
	bad[40] ^= 1
	if _, err := dst.ImportBlock(10, bad); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("corrupt block: %v", err)
	}
	if _, err := dst.ImportBlock(10, good[:10]); err == nil {
		t.Fatal("short block accepted")
	}
	other, _ := New(Config{FirstLayer: 0, Layers: 2, KVDim: 8, BlockSize: 4, NumBlocks: 4})
	if _, err := other.ImportBlock(1, good); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("mismatched cache: %v", err)
	}
}

// A cache whose V is a view of K (multi-head latent attention) stores,
// exports and imports the K rows alone: a block takes half the bytes of a
// K-and-V cache's, V reads the K row, and a K-and-V cache of the same
// shape refuses its blocks.
func TestVInK(t *testing.T) {
	cfg := Config{Layers: 2, KVDim: 8, BlockSize: 4, NumBlocks: 4, VInK: true}
	src, _ := New(cfg)
	dst, _ := New(cfg)
	src.Reserve(1, 4)
	for l := 0; l < 2; l++ {
		for pos := 0; pos < 4; pos++ {
			k := make([]float32, 8)
			for i := range k {
				k[i] = float32(l*100 + pos*10 + i)
			}
			src.Put(l, src.Blocks(1), pos, k, nil)
		}
	}
	b, err := src.ExportBlock(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	full, _ := New(Config{Layers: 2, KVDim: 8, BlockSize: 4, NumBlocks: 4})
	full.Reserve(1, 4)
	fb, _ := full.ExportBlock(1, 0)
	if got, want := len(b)-blockHeader-4, (len(fb)-blockHeader-4)/2; got != want {
		t.Fatalf("a V-in-K block holds %d row bytes, want %d (half a K-and-V block's)", got, want)
	}
	if _, err := dst.ImportBlock(2, b); err != nil {
		t.Fatal(err)
	}
	for l := 0; l < 2; l++ {
		for pos := 0; pos < 4; pos++ {
			k, v := dst.K(l, dst.Blocks(2), pos), dst.V(l, dst.Blocks(2), pos)
			if !slices.Equal(k, src.K(l, src.Blocks(1), pos)) || !slices.Equal(k, v) {
				t.Fatalf("layer %d pos %d: K %v V %v after import", l, pos, k, v)
			}
		}
	}
	if _, err := full.ImportBlock(3, b); err == nil {
		t.Fatal("a K-and-V cache took a V-in-K block")
	}
	if _, err := dst.ImportBlock(3, fb); err == nil {
		t.Fatal("a V-in-K cache took a K-and-V block")
	}
}
