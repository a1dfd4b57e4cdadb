package catalog

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"shoal/coordinator"
	"shoal/hub"
	"shoal/shard"
)

// HubOrigin is the shard.Want origin of a model read from the hub:
// REPO/FILE@REVISION (parsed back by parseHubOrigin).
func HubOrigin(h *coordinator.HubFile) string {
	rev := h.Revision
	if rev == "" {
		rev = "main"
	}
	return "hub:" + h.Repo + "/" + h.File + "@" + rev
}

func parseHubOrigin(s string) (repo, file, rev string, ok bool) {
	s, ok = strings.CutPrefix(s, "hub:")
	at := strings.LastIndexByte(s, '@')
	if !ok || at < 0 {
		return "", "", "", false
	}
	s, rev = s[:at], s[at+1:]
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0] + "/" + parts[1], parts[2], rev, true
}

// hubFetcher reads byte ranges of a hub file with HTTP Range requests
// (hub.Client.ReadRange: a cut connection resumes from the first byte not
// delivered). It implements shard.RangeFetcher and shard.BatchFetcher
// (adjacent ranges go in one request); the bytes are verified by the
// caller. Received counts the bytes it delivered.
type hubFetcher struct {
	c               *hub.Client
	repo, file, rev string
	Received        atomic.Int64
}

func newHubFetcher(c *hub.Client, origin string) shard.RangeFetcher {
	repo, file, rev, ok := parseHubOrigin(origin)
	if !ok {
		return errFetcher{fmt.Errorf("bad hub origin %q", origin)}
	}
	return &hubFetcher{c: c, repo: repo, file: file, rev: rev}
}

// Fetch implements shard.RangeFetcher.
func (h *hubFetcher) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	return h.FetchRanges(ctx, sha, []shard.Range{{Off: off, N: n}})
}

// hubBridge is the largest gap between two wanted ranges read in one Range
// request (its bytes read and dropped): a tensor-parallel member wants half
// of every row of a column-split matrix, and a request per row would be
// hundreds of thousands of requests for a large model, each a round trip to
// the hub, against reading those rows whole.
const hubBridge = 4 << 10

// FetchRanges implements shard.BatchFetcher: one Range request per run of
// ranges at most hubBridge apart.
func (h *hubFetcher) FetchRanges(ctx context.Context, sha string, ranges []shard.Range) (io.ReadCloser, error) {
	var runs []hubRun
	for _, r := range ranges {
		if r.N < 0 || r.Off < 0 {
			return nil, fmt.Errorf("bad range [%d,+%d)", r.Off, r.N)
		}
		if r.N == 0 {
			continue
		}
		if k := len(runs); k > 0 && r.Off >= runs[k-1].End() && r.Off-runs[k-1].End() <= hubBridge {
			runs[k-1].N = r.End() - runs[k-1].Off
			runs[k-1].keep = append(runs[k-1].keep, r)
			continue
		}
		runs = append(runs, hubRun{Range: r, keep: []shard.Range{r}})
	}
	return &runsReader{ctx: ctx, h: h, runs: runs}, nil
}

// hubRun is one Range request: the wanted ranges in it, in order.
type hubRun struct {
	shard.Range
	keep []shard.Range
}

// runsReader reads runs one after the other, opening each when reached,
// and returns only the wanted bytes of each.
type runsReader struct {
	ctx  context.Context
	h    *hubFetcher
	runs []hubRun
	cur  io.ReadCloser
	pos  int64 // file offset of cur's next byte
	skip []byte
}

func (r *runsReader) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			if len(r.runs) == 0 {
				return 0, io.EOF
			}
			r.cur = r.h.c.ReadRange(r.ctx, r.h.repo, r.h.rev, r.h.file, r.runs[0].Off, r.runs[0].N)
			r.pos = r.runs[0].Off
		}
		run := &r.runs[0]
		if len(run.keep) == 0 {
			r.cur.Close()
			r.cur = nil
			r.runs = r.runs[1:]
			continue
		}
		if gap := run.keep[0].Off - r.pos; gap > 0 { // bytes between wanted ranges
			if int64(len(r.skip)) < gap {
				r.skip = make([]byte, gap)
			}
			n, err := io.ReadFull(r.cur, r.skip[:gap])
			r.h.Received.Add(int64(n))
			r.pos += int64(n)
			if err != nil {
				return 0, err
			}
		}
		want := run.keep[0].End() - r.pos
		n, err := r.cur.Read(p[:min(int64(len(p)), want)])
		r.h.Received.Add(int64(n))
		r.pos += int64(n)
		if r.pos == run.keep[0].End() {
			run.keep = run.keep[1:]
		}
		if err == io.EOF && len(run.keep) > 0 {
			err = io.ErrUnexpectedEOF
		} else if err == io.EOF {
			err = nil
		}
		if n > 0 || err != nil {
			return n, err
		}
	}
}

func (r *runsReader) Close() error {
	if r.cur != nil {
		r.cur.Close()
		r.cur = nil
	}
	r.runs = nil
	return nil
}

type errFetcher struct{ err error }

func (e errFetcher) Fetch(context.Context, string, int64, int64) (io.ReadCloser, error) {
	return nil, e.err
}

// rangeReader reads a hub file from its start, each Read one Range
// request for exactly the bytes asked (the hub serves no byte unread).
type rangeReader struct {
	ctx             context.Context
	c               *hub.Client
	repo, rev, file string
	size, pos       int64
}

func (r *rangeReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.size-r.pos)
	rc := r.c.ReadRange(r.ctx, r.repo, r.rev, r.file, r.pos, n)
	defer rc.Close()
	k, err := io.ReadFull(rc, p[:n])
	r.pos += int64(k)
	return k, err
}
