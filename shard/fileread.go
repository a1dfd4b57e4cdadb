package shard

import (
	"context"
	"io"
)

// FileReader reads the whole file of m, in order, from holders: each unit
// through a HolderFetcher (checked against m unless m is Unverified), the
// padding between units and after the last as zero bytes (GGUF writers
// pad with zeros; a file padded otherwise reads wrong this way and fails
// its sha256 check). It is how a file that no node holds whole is read
// once, from the nodes that hold its ranges between them, to be checked.
// The fetcher says which holder served what.
func FileReader(ctx context.Context, m *Manifest, holders []Holder) (io.Reader, *HolderFetcher) {
	hf := NewHolderFetcher(m, holders)
	return &fileReader{ctx: ctx, hf: hf, units: hf.units, size: m.Table.FileSize}, hf
}

type fileReader struct {
	ctx   context.Context
	hf    *HolderFetcher
	units []Range
	next  int   // the unit to fetch next
	pos   int64 // file offset of the next byte returned
	size  int64 // the file's size (0: ends with the last unit)
	buf   []byte
}

func (r *fileReader) Read(p []byte) (int, error) {
	if len(r.buf) > 0 {
		n := copy(p, r.buf)
		r.buf, r.pos = r.buf[n:], r.pos+int64(n)
		return n, nil
	}
	end := r.size
	if r.next < len(r.units) {
		end = r.units[r.next].Off
	}
	if r.pos < end { // padding
		n := int(min(int64(len(p)), end-r.pos))
		clear(p[:n])
		r.pos += int64(n)
		return n, nil
	}
	if r.next == len(r.units) {
		return 0, io.EOF
	}
	u := r.units[r.next]
	b, err := r.hf.read(r.ctx, u.Off, u.N, nil)
	if err != nil {
		return 0, err
	}
	r.next++
	r.buf = b
	return r.Read(p)
}
