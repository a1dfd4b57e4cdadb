package shard

import (
	"fmt"
	"io"
	"os"
	"sort"
)

// heldFile serves the model file ranges a complete shard file holds.
type heldFile struct {
	fh   *os.File
	sha  string
	size int64 // of the model file
	segs []Seg // Dst absolute in fh, sorted by Src
}

// openHeld opens the complete shard file at path for serving its ranges.
func openHeld(path string) (*heldFile, error) {
	fh, _, l, state, dataOff, err := openShardFile(path)
	if err != nil {
		return nil, err
	}
	for _, b := range state {
		if b != 1 {
			fh.Close()
			return nil, fmt.Errorf("shard %s is incomplete", path)
		}
	}
	h := &heldFile{fh: fh, sha: l.Spec.FileSHA, size: l.FileSize}
	for _, p := range l.Pieces {
		for _, s := range p.Segs {
			h.segs = append(h.segs, Seg{Src: s.Src, Dst: dataOff + s.Dst, N: s.N})
		}
	}
	sort.Slice(h.segs, func(i, j int) bool { return h.segs[i].Src < h.segs[j].Src })
	return h, nil
}

func (h *heldFile) close() { h.fh.Close() }

// HeldReader reads the ranges of a model file a node's shard files hold
// (a node without the whole file serves them to its peers).
type HeldReader struct {
	segs   []heldSeg // sorted by Src
	size   int64
	ranges []Range
}

type heldSeg struct {
	Seg
	f *os.File
}

func newHeldReader(files []*heldFile, size int64) *HeldReader {
	r := &HeldReader{size: size}
	var all []heldSeg
	for _, hf := range files {
		for _, s := range hf.segs {
			all = append(all, heldSeg{s, hf.fh})
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Src < all[j].Src })
	// Keep the segments disjoint: shard files of one model overlap (every
	// one holds the header).
	covered := int64(0)
	for _, s := range all {
		end := s.Src + s.N
		if end <= covered {
			continue
		}
		if d := covered - s.Src; d > 0 {
			s.Src, s.Dst, s.N = s.Src+d, s.Dst+d, s.N-d
		}
		r.segs = append(r.segs, s)
		covered = end
		if n := len(r.ranges); n > 0 && r.ranges[n-1].End() == s.Src {
			r.ranges[n-1].N += s.N
		} else {
			r.ranges = append(r.ranges, Range{s.Src, s.N})
		}
	}
	return r
}

// Ranges lists the ranges held, merged.
func (r *HeldReader) Ranges() []Range { return r.ranges }

// Size is the model file's size.
func (r *HeldReader) Size() int64 { return r.size }

// Holds reports whether every byte of [off,off+n) is held.
func (r *HeldReader) Holds(off, n int64) bool {
	k := sort.Search(len(r.ranges), func(k int) bool { return r.ranges[k].End() > off })
	return n == 0 || k < len(r.ranges) && r.ranges[k].Off <= off && r.ranges[k].End() >= off+n
}

// ReadAt reads held bytes at model file offset off.
func (r *HeldReader) ReadAt(p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		k := sort.Search(len(r.segs), func(k int) bool { return r.segs[k].Src > pos }) - 1
		if k < 0 || r.segs[k].Src+r.segs[k].N <= pos {
			return done, fmt.Errorf("shard: byte %d of the model file is not held here", pos)
		}
		s := r.segs[k]
		n := min(int64(len(p)-done), s.Src+s.N-pos)
		m, err := s.f.ReadAt(p[done:done+int(n)], s.Dst+pos-s.Src)
		done += m
		if err != nil && !(err == io.EOF && int64(m) == n) {
			return done, err
		}
	}
	return done, nil
}
