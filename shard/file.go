package shard

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Shard file format, version 1 (little-endian):
//
//	0   [8]  magic "SHOALSHD"
//	8   u32  version (1)
//	12  u32  flags (0)
//	16  u64  index offset (96)
//	24  u64  index length
//	32  u64  state offset: one byte per piece, 1 when its data is written
//	40  u64  data offset (4096-aligned)
//	48  [32] sha256 of the index
//	80  [16] reserved (0)
//	96  index: the Layout as JSON (spec, config, tensor slices, pieces, sums)
//	    state table
//	    data region: the GGUF header, then each tensor slice packed, at
//	    the offsets the layout gives
//
// A piece's state byte is set only after its data was written and synced,
// so a file cut short by a crash knows which pieces it has; on resume the
// pieces marked present are re-hashed unless the caller trusts them.
const (
	fileMagic   = "SHOALSHD"
	fileVersion = 1
	headerSize  = 96
	dataAlign   = 4096
	// maxIndex bounds the index a shard file may declare.
	maxIndex = 1 << 30
)

// ErrMismatch is returned when a shard file holds a different shard than
// the one asked for.
var ErrMismatch = errors.New("shard file holds a different shard")

type shardFile struct {
	f        *os.File
	l        *Layout
	state    []byte
	stateOff int64
	dataOff  int64
}

// createFile writes a new shard file for l with no pieces present.
func createFile(path string, l *Layout) (*shardFile, error) {
	index, err := l.marshal()
	if err != nil {
		return nil, err
	}
	sf := &shardFile{l: l, state: make([]byte, len(l.Pieces))}
	sf.stateOff = headerSize + int64(len(index))
	sf.dataOff = (sf.stateOff + int64(len(sf.state)) + dataAlign - 1) &^ (dataAlign - 1)
	hdr := make([]byte, headerSize)
	copy(hdr, fileMagic)
	le := binary.LittleEndian
	le.PutUint32(hdr[8:], fileVersion)
	le.PutUint64(hdr[16:], headerSize)
	le.PutUint64(hdr[24:], uint64(len(index)))
	le.PutUint64(hdr[32:], uint64(sf.stateOff))
	le.PutUint64(hdr[40:], uint64(sf.dataOff))
	sum := sha256.Sum256(index)
	copy(hdr[48:80], sum[:])
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	sf.f = f
	buf := append(append(hdr, index...), sf.state...)
	if _, err := f.WriteAt(buf, 0); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Truncate(sf.dataOff + l.DataSize); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

// readHeader parses a shard file's header and index from r.
func readHeader(r io.ReaderAt, size int64) (l *Layout, stateOff, dataOff int64, err error) {
	hdr := make([]byte, headerSize)
	if size < headerSize {
		return nil, 0, 0, fmt.Errorf("shard file is %d bytes, shorter than its header", size)
	}
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return nil, 0, 0, err
	}
	if string(hdr[:8]) != fileMagic {
		return nil, 0, 0, fmt.Errorf("not a shard file (magic %q)", hdr[:8])
	}
	le := binary.LittleEndian
	if v := le.Uint32(hdr[8:]); v != fileVersion {
		return nil, 0, 0, fmt.Errorf("shard file version %d, want %d", v, fileVersion)
	}
	indexOff, indexLen := int64(le.Uint64(hdr[16:])), int64(le.Uint64(hdr[24:]))
	stateOff, dataOff = int64(le.Uint64(hdr[32:])), int64(le.Uint64(hdr[40:]))
	if indexOff != headerSize || indexLen <= 0 || indexLen > maxIndex || stateOff != indexOff+indexLen || dataOff < stateOff || dataOff > size {
		return nil, 0, 0, fmt.Errorf("shard file header is inconsistent (index %d+%d, state %d, data %d, size %d)", indexOff, indexLen, stateOff, dataOff, size)
	}
	index := make([]byte, indexLen)
	if _, err := r.ReadAt(index, indexOff); err != nil {
		return nil, 0, 0, err
	}
	if sum := sha256.Sum256(index); !bytes.Equal(sum[:], hdr[48:80]) {
		return nil, 0, 0, fmt.Errorf("shard file index checksum mismatch")
	}
	if l, err = unmarshalLayout(index); err != nil {
		return nil, 0, 0, fmt.Errorf("shard file index: %w", err)
	}
	if dataOff+l.DataSize != size || stateOff+int64(len(l.Pieces)) > dataOff {
		return nil, 0, 0, fmt.Errorf("shard file is %d bytes, its layout needs %d", size, dataOff+l.DataSize)
	}
	return l, stateOff, dataOff, nil
}

// openFile opens an existing shard file for writing more pieces. It fails
// with ErrMismatch when the file holds another layout than want.
func openFile(path string, want *Layout) (*shardFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	l, stateOff, dataOff, err := readHeader(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("shard %s: %w", path, err)
	}
	if l.ID() != want.ID() || !sameSums(l, want) {
		f.Close()
		return nil, fmt.Errorf("shard %s: %w", path, ErrMismatch)
	}
	sf := &shardFile{f: f, l: l, state: make([]byte, len(l.Pieces)), stateOff: stateOff, dataOff: dataOff}
	if _, err := f.ReadAt(sf.state, stateOff); err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

func sameSums(a, b *Layout) bool {
	for i := range a.Pieces {
		if a.Pieces[i].Sum != b.Pieces[i].Sum {
			return false
		}
	}
	return true
}

// readPiece reads piece i's bytes from the data region.
func (sf *shardFile) readPiece(i int, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for _, s := range sf.l.Pieces[i].Segs {
		k := len(buf)
		buf = append(buf, make([]byte, s.N)...)
		if _, err := sf.f.ReadAt(buf[k:], sf.dataOff+s.Dst); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// writePiece writes piece i's bytes (the segments concatenated).
func (sf *shardFile) writePiece(i int, data []byte) error {
	for _, s := range sf.l.Pieces[i].Segs {
		if _, err := sf.f.WriteAt(data[:s.N], sf.dataOff+s.Dst); err != nil {
			return err
		}
		data = data[s.N:]
	}
	return nil
}

// mark records pieces as present (after their data was synced).
func (sf *shardFile) mark(pieces []int, v byte) error {
	for _, i := range pieces {
		sf.state[i] = v
		if _, err := sf.f.WriteAt([]byte{v}, sf.stateOff+int64(i)); err != nil {
			return err
		}
	}
	return nil
}

func checkSum(data []byte, want string) bool {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]) == want
}

// unsignedSum stands for a piece checksum not known yet (an unsigned
// layout being assembled from verified bytes): as long as a real one, so
// the index keeps its length when it is signed.
var unsignedSum = strings.Repeat("0", 2*sha256.Size)

// writeIndex rewrites the index (the same length: only sums changed) and
// its checksum.
func (sf *shardFile) writeIndex() error {
	index, err := sf.l.marshal()
	if err != nil {
		return err
	}
	if headerSize+int64(len(index)) != sf.stateOff {
		return fmt.Errorf("shard index changed length (%d, room for %d)", len(index), sf.stateOff-headerSize)
	}
	if _, err := sf.f.WriteAt(index, headerSize); err != nil {
		return err
	}
	sum := sha256.Sum256(index)
	_, err = sf.f.WriteAt(sum[:], 48)
	return err
}

// signedSums returns the piece checksums of the shard file at path when it
// holds l's layout signed (by the node with the model file, or from
// verified bytes), else nil.
func signedSums(path string, l *Layout) []string {
	fh, _, fl, _, _, err := openShardFile(path)
	if err != nil {
		return nil
	}
	fh.Close()
	if fl.ID() != l.ID() || !fl.Signed() || len(fl.Pieces) != len(l.Pieces) {
		return nil
	}
	sums := make([]string, len(fl.Pieces))
	for i := range fl.Pieces {
		if fl.Pieces[i].Sum == unsignedSum {
			return nil
		}
		sums[i] = fl.Pieces[i].Sum
	}
	return sums
}
