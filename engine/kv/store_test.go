package kv

import (
	"slices"
	"testing"
)

// rowStore is a Store that is not host memory to the cache (as a GPU's is
// not): rows in a map, reachable only through ReadRows and WriteRows.
type rowStore struct {
	kvDim int
	rows  map[[3]int][2][]uint16 // (layer, block, slot) -> K, V
}

func (s *rowStore) row(layer int, block int32, slot int) [2][]uint16 {
	key := [3]int{layer, int(block), slot}
	r, ok := s.rows[key]
	if !ok {
		r = [2][]uint16{make([]uint16, s.kvDim), make([]uint16, s.kvDim)}
		s.rows[key] = r
	}
	return r
}

func (s *rowStore) ReadRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	w := hi - lo
	for t := range n {
		r := s.row(layer, block, slot+t)
		copy(k[t*w:(t+1)*w], r[0][lo:hi])
		copy(v[t*w:(t+1)*w], r[1][lo:hi])
	}
}

func (s *rowStore) WriteRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	w := hi - lo
	for t := range n {
		r := s.row(layer, block, slot+t)
		copy(r[0][lo:hi], k[t*w:(t+1)*w])
		copy(r[1][lo:hi], v[t*w:(t+1)*w])
	}
}

// A cache over a device's store exports and imports blocks and ranges
// byte for byte like one over host memory.
func TestDeviceStoreExportImport(t *testing.T) {
	cfg := Config{FirstLayer: 3, Layers: 2, KVDim: 6, BlockSize: 4, NumBlocks: 6}
	host, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := NewWithStore(cfg, &rowStore{kvDim: cfg.KVDim, rows: map[[3]int][2][]uint16{}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	if _, err := host.Reserve(1, n); err != nil {
		t.Fatal(err)
	}
	for l := range cfg.Layers {
		for p := range n {
			k, v := make([]float32, cfg.KVDim), make([]float32, cfg.KVDim)
			for d := range k {
				k[d], v[d] = float32(l*100+p*10+d), -float32(p+d)
			}
			host.Put(l, host.Blocks(1), p, k, v)
		}
	}
	for i := range host.Blocks(1) {
		blk, err := host.ExportBlock(1, i)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dev.ImportBlock(2, blk); err != nil {
			t.Fatal(err)
		}
		back, err := dev.ExportBlock(2, i)
		if err != nil || !slices.Equal(back, blk) {
			t.Fatalf("block %d: exported from the device store it differs (%v)", i, err)
		}
	}
	const D = 2
	for l := cfg.FirstLayer; l < cfg.FirstLayer+cfg.Layers; l++ {
		want, wantV := make([]uint16, RangeLen(7, 1, 3, D)), make([]uint16, RangeLen(7, 1, 3, D))
		got, gotV := slices.Clone(want), slices.Clone(wantV)
		if err := host.ExportRange(1, l, 2, 7, 1, 3, D, want, wantV); err != nil {
			t.Fatal(err)
		}
		if err := dev.ExportRange(2, l, 2, 7, 1, 3, D, got, gotV); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) || !slices.Equal(gotV, wantV) {
			t.Fatalf("layer %d: range from the device store differs", l)
		}
	}
}
