package kv

import (
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// Store holds the K and V rows of a cache's blocks wherever the device that
// runs the layers keeps them: in host memory (HostStore, the CPU device), or
// in a GPU's memory. The Cache around it keeps the host side: block tables,
// the prefix cache, export and import. A row is one position's K (or V);
// rows are addressed by the cache's local layer index, a block and
// a slot within the block.
//
// Both methods move rows [slot, slot+n) of one block (all within it),
// words [lo, hi) of each, packed in k and v as [n][hi-lo]. A row is the
// cache's RowWords words: KVDim F16 values, or their quantized blocks. A
// Store is safe for concurrent use on distinct blocks.
type Store interface {
	ReadRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16)
	WriteRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16)
}

// HostStore is a Store in host memory: per layer, one slice of K and one of
// V holding every block, block b's slot s at word (b·BlockSize+s)·RowWords.
// The CPU device reads it in place (KRun, VRun).
type HostStore struct {
	kvDim, bs int // kvDim: the words of a row
	typ       quant.Type
	k, v      [][]uint16 // [layer][block*BlockSize*row + slot*row + word]
	vInK      bool       // v is k (Config.VInK)
}

// NewHostStore allocates the rows of every block of cfg (BlockSize must be
// set).
func NewHostStore(cfg Config) *HostStore {
	cfg = cfg.normalize()
	s := &HostStore{kvDim: cfg.RowWords(), bs: cfg.BlockSize, typ: cfg.Type, k: make([][]uint16, cfg.Layers), v: make([][]uint16, cfg.Layers), vInK: cfg.VInK}
	per := cfg.NumBlocks * cfg.BlockSize * s.kvDim
	for l := range s.k {
		s.k[l] = make([]uint16, per)
		s.v[l] = s.k[l]
		if !cfg.VInK {
			s.v[l] = make([]uint16, per)
		}
	}
	return s
}

// ReadRows implements Store.
func (s *HostStore) ReadRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	s.rows(layer, block, slot, n, lo, hi, k, v, false)
}

// WriteRows implements Store.
func (s *HostStore) WriteRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	s.rows(layer, block, slot, n, lo, hi, k, v, true)
}

func (s *HostStore) rows(layer int, block int32, slot, n, lo, hi int, k, v []uint16, write bool) {
	w := hi - lo
	ks, vs := s.k[layer], s.v[layer]
	for t := 0; t < n; t++ {
		o := (int(block)*s.bs+slot+t)*s.kvDim + lo
		switch {
		case write:
			copy(ks[o:o+w], k[t*w:(t+1)*w])
			if !s.vInK {
				copy(vs[o:o+w], v[t*w:(t+1)*w])
			}
		case s.vInK:
			copy(k[t*w:(t+1)*w], ks[o:o+w])
		default:
			copy(k[t*w:(t+1)*w], ks[o:o+w])
			copy(v[t*w:(t+1)*w], vs[o:o+w])
		}
	}
}

// offset is the element offset of position pos in a sequence with the given
// block table.
func (s *HostStore) offset(blocks []int32, pos int) int {
	return (int(blocks[pos/s.bs])*s.bs + pos%s.bs) * s.kvDim
}

// Put stores the K and V rows (KVDim values each) of position pos of a
// sequence with block table blocks, for the local layer index layer,
// rounding to F16 or quantizing as ggml's reference quantizer does. With V
// a view of K (Config.VInK), v is not read (it may be nil).
func (s *HostStore) Put(layer int, blocks []int32, pos int, k, v []float32) {
	o := s.offset(blocks, pos)
	kd, vd := s.k[layer][o:o+s.kvDim], s.v[layer][o:o+s.kvDim]
	if s.typ == quant.F16 {
		kernels.F32ToF16(kd, k[:len(kd)])
		if !s.vInK {
			kernels.F32ToF16(vd, v[:len(vd)])
		}
		return
	}
	n := len(kd) * 2 / s.typ.BlockSize() * s.typ.BlockLen()
	quant.QuantizeRow(s.typ, k[:n], kernels.WordBytes(kd))
	if !s.vInK {
		quant.QuantizeRow(s.typ, v[:n], kernels.WordBytes(vd))
	}
}

// Bytes is the memory the store's rows take (V counted once more only
// when it is not a view of K).
func (s *HostStore) Bytes() int64 {
	var n int64
	for l := range s.k {
		n += 2 * int64(len(s.k[l]))
		if !s.vInK {
			n += 2 * int64(len(s.v[l]))
		}
	}
	return n
}

// Type is how the store keeps its rows.
func (s *HostStore) Type() quant.Type { return s.typ }

// K returns the key row of pos, RowWords words (a view).
func (s *HostStore) K(layer int, blocks []int32, pos int) []uint16 {
	o := s.offset(blocks, pos)
	return s.k[layer][o : o+s.kvDim]
}

// V returns the value row of pos (a view).
func (s *HostStore) V(layer int, blocks []int32, pos int) []uint16 {
	o := s.offset(blocks, pos)
	return s.v[layer][o : o+s.kvDim]
}

// KRun returns the key rows from pos to the end of its block, RowWords
// words apart: row pos+t starts at word t*RowWords (a view).
func (s *HostStore) KRun(layer int, blocks []int32, pos int) []uint16 {
	return s.k[layer][s.offset(blocks, pos):s.blockEnd(blocks, pos)]
}

// VRun is KRun for the value rows.
func (s *HostStore) VRun(layer int, blocks []int32, pos int) []uint16 {
	return s.v[layer][s.offset(blocks, pos):s.blockEnd(blocks, pos)]
}

func (s *HostStore) blockEnd(blocks []int32, pos int) int {
	return (int(blocks[pos/s.bs]) + 1) * s.bs * s.kvDim
}
