package shard

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"

	"shoal/engine/model"
)

// DefaultPieceSize bounds the bytes of one piece, the unit of fetching,
// verifying and resuming.
const DefaultPieceSize = 1 << 20

// tensorAlign aligns each tensor slice in the shard's data region.
const tensorAlign = 32

// Seg copies N bytes from file offset Src to shard data offset Dst.
type Seg struct {
	Src int64 `json:"src"`
	Dst int64 `json:"dst"`
	N   int64 `json:"n"`
}

// Piece is a run of segments, in data order, fetched and verified together:
// Sum is the hex sha256 of their bytes concatenated. Most pieces are one
// contiguous range; a column slice's many short row segments share pieces.
type Piece struct {
	Segs []Seg  `json:"segs"`
	Sum  string `json:"sum,omitempty"`
}

// Size is the number of bytes in p.
func (p *Piece) Size() int64 {
	n := int64(0)
	for _, s := range p.Segs {
		n += s.N
	}
	return n
}

// PlacedSlice is a tensor slice and where its packed data starts in the
// shard's data region.
type PlacedSlice struct {
	TensorSlice
	Dst int64 `json:"dst"`
}

// Layout says where every byte a shard needs comes from in the model file
// and goes to in the shard file. It is a pure function of the table, the
// spec and the piece size; Sign adds the checksums from a trusted copy of
// the file.
type Layout struct {
	Spec      ShardSpec     `json:"spec"`
	Config    model.Config  `json:"config"`
	FileSize  int64         `json:"file_size"`
	HeaderLen int64         `json:"header_len"` // the GGUF header, at data offset 0
	Tensors   []PlacedSlice `json:"tensors"`
	Pieces    []Piece       `json:"pieces"`
	DataSize  int64         `json:"data_size"`
}

// NewLayout lays out spec's shard of the model in t. pieceSize <= 0 means
// DefaultPieceSize.
func NewLayout(t *Table, spec ShardSpec, pieceSize int64) (*Layout, error) {
	if pieceSize <= 0 {
		pieceSize = DefaultPieceSize
	}
	if spec.FileSHA == "" {
		return nil, fmt.Errorf("shard: spec has no file sha256")
	}
	slices, err := spec.Slices(t)
	if err != nil {
		return nil, err
	}
	l := &Layout{Spec: spec, Config: t.Config, FileSize: t.FileSize, HeaderLen: int64(t.DataOffset)}
	var segs []Seg
	add := func(src, dst, n int64) {
		if k := len(segs); k > 0 && segs[k-1].Src+segs[k-1].N == src && segs[k-1].Dst+segs[k-1].N == dst {
			segs[k-1].N += n
			return
		}
		segs = append(segs, Seg{src, dst, n})
	}
	add(0, 0, l.HeaderLen)
	at := l.HeaderLen
	for _, sl := range slices {
		at = (at + tensorAlign - 1) &^ (tensorAlign - 1)
		l.Tensors = append(l.Tensors, PlacedSlice{TensorSlice: sl, Dst: at})
		for _, r := range sl.Segs {
			add(r.Off, at, r.N)
			at += r.N
		}
	}
	l.DataSize = at
	var cur Piece
	room := pieceSize
	for _, s := range segs {
		for s.N > 0 {
			n := min(s.N, room)
			cur.Segs = append(cur.Segs, Seg{s.Src, s.Dst, n})
			s.Src, s.Dst, s.N = s.Src+n, s.Dst+n, s.N-n
			room -= n
			if room == 0 {
				l.Pieces = append(l.Pieces, cur)
				cur, room = Piece{}, pieceSize
			}
		}
	}
	if len(cur.Segs) > 0 {
		l.Pieces = append(l.Pieces, cur)
	}
	return l, nil
}

// Bytes is the number of bytes the shard takes from the model file.
func (l *Layout) Bytes() int64 {
	n := int64(0)
	for i := range l.Pieces {
		n += l.Pieces[i].Size()
	}
	return n
}

// Ranges lists the model file ranges of the shard, merged.
func (l *Layout) Ranges() []Range {
	var rs []Range
	for _, p := range l.Pieces {
		for _, s := range p.Segs {
			rs = append(rs, Range{s.Src, s.N})
		}
	}
	return mergeRanges(rs)
}

// ID is the shard's content address: a hash of the file's sha256 and of
// every segment and piece boundary (not of the sums, which follow from them).
func (l *Layout) ID() string {
	h := sha256.New()
	io.WriteString(h, l.Spec.FileSHA)
	var b [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	put(l.FileSize)
	for _, p := range l.Pieces {
		put(int64(len(p.Segs)))
		for _, s := range p.Segs {
			put(s.Src)
			put(s.Dst)
			put(s.N)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Sign computes every piece's checksum by reading the needed ranges of src,
// a copy of the model file trusted to have the spec's sha256 (for example
// the one the model was loaded from, verified once).
func (l *Layout) Sign(src io.ReaderAt) error {
	var buf []byte
	for i := range l.Pieces {
		p := &l.Pieces[i]
		buf = buf[:0]
		for _, s := range p.Segs {
			k := len(buf)
			buf = append(buf, make([]byte, s.N)...)
			if _, err := src.ReadAt(buf[k:], s.Src); err != nil {
				return fmt.Errorf("shard: reading [%d,+%d) of the model file: %w", s.Src, s.N, err)
			}
		}
		sum := sha256.Sum256(buf)
		p.Sum = hex.EncodeToString(sum[:])
	}
	return nil
}

// Signed reports whether every piece has a checksum.
func (l *Layout) Signed() bool {
	for i := range l.Pieces {
		if len(l.Pieces[i].Sum) != 2*sha256.Size {
			return false
		}
	}
	return len(l.Pieces) > 0
}

func (l *Layout) marshal() ([]byte, error) { return json.Marshal(l) }

func unmarshalLayout(b []byte) (*Layout, error) {
	var l Layout
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, err
	}
	return &l, nil
}
