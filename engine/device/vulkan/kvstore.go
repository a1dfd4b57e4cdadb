package vulkan

import (
	"fmt"
	"unsafe"

	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kv"
)

// kvStore is a range's F16 K and V rows in device memory, one buffer each
// per layer, laid out as kv.HostStore's: block b's slot s of a layer at
// element (b·BlockSize+s)·KVDim.
type kvStore struct {
	kvDim, bs int
	k, v      []*vk.Buf
}

func newKVStore(g *GPU, c kv.Config) (*kvStore, error) {
	s := &kvStore{kvDim: c.KVDim, bs: c.BlockSize}
	size := uint64(2*c.NumBlocks*c.BlockSize*c.KVDim+3) &^ 3
	if size > g.maxBinding {
		return nil, fmt.Errorf("vulkan: a layer's KV cache of %d MiB exceeds the device's storage binding of %d MiB (use fewer cache tokens)", size>>20, g.maxBinding>>20)
	}
	for range c.Layers {
		k, err := g.ctx.NewBuffer(max(size, 4), false)
		if err != nil {
			s.free()
			return nil, fmt.Errorf("vulkan: KV cache: %w", err)
		}
		s.k = append(s.k, k)
		v, err := g.ctx.NewBuffer(max(size, 4), false)
		if err != nil {
			s.free()
			return nil, fmt.Errorf("vulkan: KV cache: %w", err)
		}
		s.v = append(s.v, v)
	}
	return s, nil
}

func (s *kvStore) free() {
	for i := range s.k {
		s.k[i].Free()
	}
	for i := range s.v {
		s.v[i].Free()
	}
	s.k, s.v = nil, nil
}

func u16bytes(x []uint16) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 2*len(x))
}

// ReadRows implements kv.Store.
func (s *kvStore) ReadRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	s.rows(layer, block, slot, n, lo, hi, k, v, false)
}

// WriteRows implements kv.Store.
func (s *kvStore) WriteRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	s.rows(layer, block, slot, n, lo, hi, k, v, true)
}

func (s *kvStore) rows(layer int, block int32, slot, n, lo, hi int, k, v []uint16, write bool) {
	w := hi - lo
	for t := 0; t < n; t++ {
		o := uint64(2 * ((int(block)*s.bs+slot+t)*s.kvDim + lo))
		kr, vr := u16bytes(k[t*w:(t+1)*w]), u16bytes(v[t*w:(t+1)*w])
		var err error
		if write {
			if err = s.k[layer].Write(o, kr); err == nil {
				err = s.v[layer].Write(o, vr)
			}
		} else if err = s.k[layer].Read(o, kr); err == nil {
			err = s.v[layer].Read(o, vr)
		}
		if err != nil {
			// kv.Store has no error: a failed device copy is a lost device
			panic(fmt.Sprintf("vulkan: KV rows of layer %d: %v", layer, err))
		}
	}
}
