package shard

import (
	"fmt"
	"os"
	"unsafe"

	"shoal/engine/gguf"
	"shoal/engine/model"
)

// Tensor is a tensor slice and its packed data.
type Tensor struct {
	TensorSlice
	Data []byte
}

// Shard is a loaded shard: the tensor slices of its spec with their data,
// views into a mapping (or packed copies of column slices).
type Shard struct {
	Spec    ShardSpec
	Config  model.Config
	Tensors []Tensor // file order
	byName  map[string]int
	closer  func() error
	release func([]byte) bool // drops pages of mapped tensor bytes (nil: none mapped)
}

// Tensor returns the named tensor's slice.
func (s *Shard) Tensor(name string) (*Tensor, bool) {
	i, ok := s.byName[name]
	if !ok {
		return nil, false
	}
	return &s.Tensors[i], true
}

// Bytes is the size of the tensor data held.
func (s *Shard) Bytes() int64 {
	n := int64(0)
	for i := range s.Tensors {
		n += int64(len(s.Tensors[i].Data))
	}
	return n
}

// Close releases the mapping; tensor data must not be used afterwards.
func (s *Shard) Close() error {
	if s.closer == nil {
		return nil
	}
	err := s.closer()
	s.closer = nil
	return err
}

// Open loads spec's shard from a local copy of the whole model file. The
// file is mapped; only the header and the shard's ranges are touched. Row
// slices are views into the mapping; column slices (attn_output, ffn_down
// of a TP member) are packed into a new buffer, touching only their row
// segments (pages shared with the other columns are read by the kernel
// but stay clean and reclaimable).
func Open(path string, spec ShardSpec) (*Shard, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	s, err := openGGUF(f, spec, func(ti *gguf.TensorInfo, off, n int64) []byte {
		base := int64(f.DataOffset + ti.Offset)
		return f.Data(ti)[off-base : off-base+n]
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	s.closer, s.release = f.Close, f.Release
	return s, nil
}

// openGGUF builds the shard from view, which returns n bytes at file offset
// off inside tensor ti.
func openGGUF(f *gguf.File, spec ShardSpec, view func(ti *gguf.TensorInfo, off, n int64) []byte) (*Shard, error) {
	t, err := TableOf(f)
	if err != nil {
		return nil, err
	}
	slices, err := spec.Slices(t)
	if err != nil {
		return nil, err
	}
	s := &Shard{Spec: spec, Config: t.Config, byName: map[string]int{}}
	for _, sl := range slices {
		var data []byte
		switch len(sl.Segs) {
		case 0:
		case 1:
			data = view(&sl.Info, sl.Segs[0].Off, sl.Segs[0].N)
		default:
			data = make([]byte, 0, sl.Size())
			for _, r := range sl.Segs {
				data = append(data, view(&sl.Info, r.Off, r.N)...)
			}
		}
		s.byName[sl.Name] = len(s.Tensors)
		s.Tensors = append(s.Tensors, Tensor{TensorSlice: sl, Data: data})
	}
	return s, nil
}

// OpenFile maps a complete shard file written by Assemble. Tensor data are
// views into the mapping.
func OpenFile(path string) (*Shard, error) {
	fh, size, l, state, dataOff, err := openShardFile(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	missing := 0
	for _, b := range state {
		if b != 1 {
			missing++
		}
	}
	if missing > 0 {
		return nil, fmt.Errorf("shard %s is incomplete: %d of %d pieces missing", path, missing, len(l.Pieces))
	}
	data, unmap, err := mapFile(fh, size)
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", path, err)
	}
	s := &Shard{Spec: l.Spec, Config: l.Config, byName: map[string]int{}, closer: unmap}
	// The engine copies the weights it loads into resident, packed memory
	// only where the mapped original can be dropped (model.packWeights):
	// without this, a shard fetched from another node ran on the file's
	// pages in the unpacked layout, a 1,024-token prefill 25% slower than
	// on the node that holds the model file.
	s.release = func(b []byte) bool {
		if len(b) == 0 || len(data) == 0 {
			return false
		}
		base, p := uintptr(unsafe.Pointer(unsafe.SliceData(data))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if p < base || p+uintptr(len(b)) > base+uintptr(len(data)) {
			return false // bytes the shard holds in memory
		}
		return gguf.DropPages(b) // false where the file was read, not mapped
	}
	for _, p := range l.Tensors {
		at := dataOff + p.Dst
		size := p.Size()
		s.byName[p.Name] = len(s.Tensors)
		s.Tensors = append(s.Tensors, Tensor{TensorSlice: p.TensorSlice, Data: data[at : at+size : at+size]})
	}
	return s, nil
}

// Header returns the GGUF header bytes kept at the start of a shard file's
// data region (metadata and tokenizer for the node that needs them), once
// the pieces holding it are present.
func Header(path string) ([]byte, error) {
	fh, _, l, state, dataOff, err := openShardFile(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	for i, p := range l.Pieces {
		if p.Segs[0].Dst < l.HeaderLen && state[i] != 1 {
			return nil, fmt.Errorf("shard %s: the GGUF header is not fetched yet", path)
		}
	}
	b := make([]byte, l.HeaderLen)
	_, err = fh.ReadAt(b, dataOff)
	return b, err
}

// openShardFile opens a shard file written by Assemble and reads its
// layout and piece states; the caller closes fh.
func openShardFile(path string) (fh *os.File, size int64, l *Layout, state []byte, dataOff int64, err error) {
	fh, err = os.Open(path)
	if err != nil {
		return nil, 0, nil, nil, 0, err
	}
	st, err := fh.Stat()
	if err == nil {
		size = st.Size()
		var stateOff int64
		if l, stateOff, dataOff, err = readHeader(fh, size); err == nil {
			state = make([]byte, len(l.Pieces))
			_, err = fh.ReadAt(state, stateOff)
		}
	}
	if err != nil {
		fh.Close()
		return nil, 0, nil, nil, 0, fmt.Errorf("shard %s: %w", path, err)
	}
	return fh, size, l, state, dataOff, nil
}
