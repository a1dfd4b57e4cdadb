package shard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// VerifiedFetcher is a RangeFetcher whose bytes are checked before they are
// returned (against a Manifest): Assemble accepts an unsigned layout with
// it and signs the layout from those bytes.
type VerifiedFetcher interface {
	RangeFetcher
	VerifiesBytes()
}

// Holder is a node that holds ranges of a model file: the whole file, or
// the ranges of its shards.
type Holder struct {
	ID, Name string
	Held     []Range // merged, sorted
	F        RangeFetcher
	// Last keeps the holder after the others whatever their failures:
	// the origin a file is read from over the WAN (a hub), whose bytes
	// cost the most.
	Last bool
}

// HolderFetcher fetches ranges of a model file from the nodes holding them
// and verifies every unit of the manifest it touches (none when the
// manifest is Unverified: the bytes are checked later): a unit's parts may
// come from several holders (each half of a tensor-parallel row), and a
// unit that fails its checksum is fetched again with the holders it used
// ranked last, so a holder serving wrong bytes is passed over for the
// others. It implements VerifiedFetcher and BatchFetcher.
type HolderFetcher struct {
	m     *Manifest
	units []Range

	mu      sync.Mutex
	holders []*holderState
	cache   map[int]*unitEntry
	order   []int // cached units, oldest first
}

type holderState struct {
	Holder
	bad   int   // units it took part in that failed
	bytes int64 // verified bytes it served
}

type unitEntry struct {
	done chan struct{}
	data []byte
	err  error
	used int64 // bytes of it read; a unit read whole is dropped
}

const unitCache = 32

// NewHolderFetcher fetches the file of m from holders, preferred in order.
func NewHolderFetcher(m *Manifest, holders []Holder) *HolderFetcher {
	h := &HolderFetcher{m: m, units: Units(m.Table, m.UnitSize), cache: map[int]*unitEntry{}}
	for _, hd := range holders {
		h.holders = append(h.holders, &holderState{Holder: hd})
	}
	return h
}

// VerifiesBytes implements VerifiedFetcher.
func (h *HolderFetcher) VerifiesBytes() {}

// unitsOf returns the indexes [i,j) of the units overlapping [off,off+n).
func (h *HolderFetcher) unitsOf(off, n int64) (int, int) {
	i := sort.Search(len(h.units), func(k int) bool { return h.units[k].End() > off })
	j := i
	for j < len(h.units) && h.units[j].Off < off+n {
		j++
	}
	return i, j
}

// Covers checks that the holders hold, between them, every unit touching
// rs; it names the first byte range none holds.
func (h *HolderFetcher) Covers(rs []Range) error {
	ranked := h.ranked()
	for _, r := range rs {
		i, j := h.unitsOf(r.Off, r.N)
		if i == j || h.units[i].Off > r.Off || h.units[j-1].End() < r.End() {
			return fmt.Errorf("bytes [%d,+%d) are in no unit of the manifest", r.Off, r.N)
		}
		for k := i; k < j; k++ {
			if _, err := assign(h.units[k], ranked); err != nil {
				return err
			}
		}
	}
	return nil
}

// Served returns the verified bytes each holder served, by holder ID, and
// the units each took part in that failed their checksum.
func (h *HolderFetcher) Served() (bytes map[string]int64, bad map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	bytes, bad = map[string]int64{}, map[string]int{}
	for _, hs := range h.holders {
		bytes[hs.ID], bad[hs.ID] = hs.bytes, hs.bad
	}
	return bytes, bad
}

// ranked lists the holders, those with fewer failures first, those
// marked Last after every other.
func (h *HolderFetcher) ranked() []*holderState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append([]*holderState(nil), h.holders...)
	bad := make([]int, len(out))
	for i, hs := range out {
		bad[i] = hs.bad
		if hs.Last {
			bad[i] += 1 << 30 // a unit's retry still reaches it (fetchUnit)
		}
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return bad[idx[a]] < bad[idx[b]] })
	sorted := make([]*holderState, len(out))
	for i, k := range idx {
		sorted[i] = out[k]
	}
	return sorted
}

type part struct {
	h *holderState
	r Range
}

// assign splits unit u among holders: each byte from the first holder in
// order that holds it.
func assign(u Range, holders []*holderState) ([]part, error) {
	var parts []part
	for pos := u.Off; pos < u.End(); {
		var best *holderState
		end := pos
		for _, hs := range holders {
			k := sort.Search(len(hs.Held), func(k int) bool { return hs.Held[k].End() > pos })
			if k < len(hs.Held) && hs.Held[k].Off <= pos {
				best, end = hs, min(hs.Held[k].End(), u.End())
				break
			}
		}
		if best == nil {
			return nil, fmt.Errorf("no live node holds bytes [%d,+%d) of the model file", pos, u.End()-pos)
		}
		if n := len(parts); n > 0 && parts[n-1].h == best {
			parts[n-1].r.N += end - pos
		} else {
			parts = append(parts, part{best, Range{pos, end - pos}})
		}
		pos = end
	}
	return parts, nil
}

// unit returns unit i's verified bytes, through the cache.
func (h *HolderFetcher) unit(ctx context.Context, i int) ([]byte, error) {
	h.mu.Lock()
	if e, ok := h.cache[i]; ok {
		h.mu.Unlock()
		select {
		case <-e.done:
			if e.err == nil {
				return e.data, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		h.mu.Lock()
		if h.cache[i] == e {
			delete(h.cache, i)
		}
	}
	e := &unitEntry{done: make(chan struct{})}
	h.cache[i] = e
	h.order = append(h.order, i)
	for len(h.order) > unitCache {
		old := h.order[0]
		h.order = h.order[1:]
		if oe := h.cache[old]; oe != nil && oe != e && isClosed(oe.done) {
			delete(h.cache, old)
		}
	}
	h.mu.Unlock()
	e.data, e.err = h.fetchUnit(ctx, i)
	close(e.done)
	if e.err != nil {
		h.mu.Lock()
		if h.cache[i] == e {
			delete(h.cache, i)
		}
		h.mu.Unlock()
	}
	return e.data, e.err
}

// fetchUnit fetches unit i from the holders until its checksum matches,
// ranking the holders of a failed try last.
func (h *HolderFetcher) fetchUnit(ctx context.Context, i int) ([]byte, error) {
	u := h.units[i]
	var lastErr error
	failed := map[*holderState]bool{} // took part in a failed try of this unit
	for attempt := 0; attempt <= len(h.holders); attempt++ {
		parts, err := assign(u, h.orderFor(failed))
		if err != nil {
			return nil, err
		}
		var buf []byte
		buf, _, err = fetchParts(ctx, h.m.FileSHA, parts, make([]byte, 0, u.N))
		if err == nil {
			sum := sha256.Sum256(buf)
			if h.m.Unverified || hex.EncodeToString(sum[:]) == h.m.Sums[i] {
				h.credit(parts)
				return buf, nil
			}
			names := ""
			for _, p := range parts {
				names += " " + p.h.Name
			}
			err = fmt.Errorf("unit [%d,+%d) from%s: sha256 mismatch", u.Off, u.N, names)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch {
		case lastErr == nil:
			lastErr = err
		case !strings.Contains(lastErr.Error(), err.Error()):
			lastErr = fmt.Errorf("%v; %w", lastErr, err)
		}
		h.mu.Lock()
		for _, p := range parts {
			p.h.bad++
			failed[p.h] = true
		}
		h.mu.Unlock()
	}
	return nil, lastErr
}

// read returns the n verified bytes at off. Under an unverified
// manifest it reads just those bytes (a tensor-parallel member reads its
// half of each row, not the whole unit that would be checked).
func (h *HolderFetcher) read(ctx context.Context, off, n int64, buf []byte) ([]byte, error) {
	if h.m.Unverified {
		return h.readRaw(ctx, Range{off, n}, buf)
	}
	i, j := h.unitsOf(off, n)
	if i == j || h.units[i].Off > off || h.units[j-1].End() < off+n {
		return buf, fmt.Errorf("shard: bytes [%d,+%d) are in no unit of the manifest", off, n)
	}
	for k := i; k < j; k++ {
		data, err := h.unit(ctx, k)
		if err != nil {
			return buf, err
		}
		u := h.units[k]
		if k > i && h.units[k-1].End() != u.Off {
			return buf, fmt.Errorf("shard: bytes [%d,+%d) span padding between units", off, n)
		}
		lo, hi := max(off, u.Off), min(off+n, u.End())
		buf = append(buf, data[lo-u.Off:hi-u.Off]...)
		h.used(k, hi-lo)
	}
	return buf, nil
}

// readRaw reads r from the holders as they rank, passing over a holder
// that fails for the next.
func (h *HolderFetcher) readRaw(ctx context.Context, r Range, buf []byte) ([]byte, error) {
	var lastErr error
	failed := map[*holderState]bool{}
	for attempt := 0; attempt <= len(h.holders); attempt++ {
		var order []*holderState
		for _, hs := range h.orderFor(failed) {
			if !failed[hs] {
				order = append(order, hs)
			}
		}
		parts, err := assign(r, order)
		if err != nil {
			if lastErr != nil {
				return buf, lastErr
			}
			return buf, err
		}
		k := len(buf)
		var bad *holderState
		if buf, bad, err = fetchParts(ctx, h.m.FileSHA, parts, buf); err == nil {
			h.credit(parts)
			return buf, nil
		}
		failed[bad], lastErr, buf = true, err, buf[:k]
		if ctx.Err() != nil {
			return buf, ctx.Err()
		}
	}
	return buf, lastErr
}

// readBatched reads ranges (unverified bytes) with one request per run of
// parts its holders serve in a row, from holders that batch (the hub: one
// Range request for adjacent runs). It reports false when a part fails,
// for readRaw to pass over the failing holder range by range.
func (h *HolderFetcher) readBatched(ctx context.Context, ranges []Range) ([]byte, bool) {
	order := h.orderFor(nil)
	var parts []part
	for _, r := range ranges {
		ps, err := assign(r, order)
		if err != nil {
			return nil, false
		}
		parts = append(parts, ps...)
	}
	var buf []byte
	for i := 0; i < len(parts); {
		j := i + 1
		for j < len(parts) && parts[j].h == parts[i].h {
			j++
		}
		run := parts[i:j]
		bf, ok := run[0].h.F.(BatchFetcher)
		if !ok || len(run) == 1 {
			var err error
			if buf, _, err = fetchParts(ctx, h.m.FileSHA, run, buf); err != nil {
				return nil, false
			}
		} else {
			rs := make([]Range, len(run))
			n := int64(0)
			for k, p := range run {
				rs[k], n = p.r, n+p.r.N
			}
			rc, err := bf.FetchRanges(ctx, h.m.FileSHA, rs)
			if err != nil {
				return nil, false
			}
			k := len(buf)
			buf = append(buf, make([]byte, n)...)
			_, err = io.ReadFull(rc, buf[k:])
			rc.Close()
			if err != nil {
				return nil, false
			}
		}
		h.credit(run)
		i = j
	}
	return buf, true
}

// orderFor ranks the holders, those in failed (for the bytes at hand)
// after the others.
func (h *HolderFetcher) orderFor(failed map[*holderState]bool) []*holderState {
	ranked := h.ranked()
	order := make([]*holderState, 0, len(ranked))
	for _, pass := range []bool{false, true} {
		for _, hs := range ranked {
			if failed[hs] == pass {
				order = append(order, hs)
			}
		}
	}
	return order
}

// fetchParts appends the bytes of parts to buf, or names the holder whose
// part failed (buf is then as it was). A holder's parts go in one request
// where its fetcher batches: the halves of a tensor-parallel row alternate
// between two holders, and a request per half row was hundreds of round
// trips per unit (the check of a 2-way tensor-parallel hub model read back
// a 2.8 MB file in 8 to 52 s under -race on a loaded host).
func fetchParts(ctx context.Context, sha string, parts []part, buf []byte) ([]byte, *holderState, error) {
	k := len(buf)
	at := make([]int64, len(parts)) // each part's offset in the bytes appended
	var total int64
	for i, p := range parts {
		at[i], total = total, total+p.r.N
	}
	buf = append(buf, make([]byte, total)...)
	out := buf[k:]
	done := make([]bool, len(parts))
	for i := range parts {
		if done[i] {
			continue
		}
		h := parts[i].h
		var mine []int // h's parts, in order
		for j := i; j < len(parts); j++ {
			if parts[j].h == h {
				mine, done[j] = append(mine, j), true
			}
		}
		if err := fetchHolderParts(ctx, sha, h, parts, mine, at, out); err != nil {
			return buf[:k], h, err
		}
	}
	return buf, nil, nil
}

// fetchHolderParts reads parts[j] for j in mine, all from holder h, into
// out at at[j]: in one request when h batches, else one request each.
func fetchHolderParts(ctx context.Context, sha string, h *holderState, parts []part, mine []int, at []int64, out []byte) error {
	if bf, ok := h.F.(BatchFetcher); ok && len(mine) > 1 {
		rs := make([]Range, len(mine))
		for x, j := range mine {
			rs[x] = parts[j].r
		}
		rc, err := bf.FetchRanges(ctx, sha, rs)
		if err == nil {
			for _, j := range mine {
				if _, err = io.ReadFull(rc, out[at[j]:at[j]+parts[j].r.N]); err != nil {
					break
				}
			}
			rc.Close()
		}
		if err != nil {
			return fmt.Errorf("%d ranges of bytes [%d,%d) from %s: %w", len(mine), rs[0].Off, rs[len(rs)-1].End(), h.Name, err)
		}
		return nil
	}
	for _, j := range mine {
		p := parts[j]
		rc, err := h.F.Fetch(ctx, sha, p.r.Off, p.r.N)
		if err == nil {
			_, err = io.ReadFull(rc, out[at[j]:at[j]+p.r.N])
			rc.Close()
		}
		if err != nil {
			return fmt.Errorf("bytes [%d,+%d) from %s: %w", p.r.Off, p.r.N, h.Name, err)
		}
	}
	return nil
}

// credit counts the bytes of parts as served by their holders.
func (h *HolderFetcher) credit(parts []part) {
	h.mu.Lock()
	for _, p := range parts {
		p.h.bytes += p.r.N
	}
	h.mu.Unlock()
}

// used notes that n bytes of unit k were read. A unit read whole is
// dropped from the cache: the cache then holds the units pieces share
// (a unit across a piece boundary, whose pieces may be fetched far apart
// in time), which are not fetched twice while at most unitCache of them
// wait.
func (h *HolderFetcher) used(k int, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.cache[k]
	if e == nil || !isClosed(e.done) {
		return
	}
	if e.used += n; e.used >= h.units[k].N {
		delete(h.cache, k)
		for x, o := range h.order {
			if o == k {
				h.order = append(h.order[:x], h.order[x+1:]...)
				break
			}
		}
	}
}

// Fetch implements RangeFetcher.
func (h *HolderFetcher) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	if sha != h.m.FileSHA {
		return nil, errors.New("shard: holder fetcher asked for another file")
	}
	b, err := h.read(ctx, off, n, nil)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// FetchRanges implements BatchFetcher.
func (h *HolderFetcher) FetchRanges(ctx context.Context, sha string, ranges []Range) (io.ReadCloser, error) {
	if sha != h.m.FileSHA {
		return nil, errors.New("shard: holder fetcher asked for another file")
	}
	if h.m.Unverified {
		if b, ok := h.readBatched(ctx, ranges); ok {
			return io.NopCloser(bytes.NewReader(b)), nil
		}
	}
	var b []byte
	var err error
	for _, r := range ranges {
		if b, err = h.read(ctx, r.Off, r.N, b); err != nil {
			return nil, err
		}
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}
