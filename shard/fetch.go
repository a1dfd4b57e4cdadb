package shard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// RangeFetcher returns n bytes at offset off of the file whose sha256 is
// fileSHA, from wherever it can: a local copy, or a peer over the transport.
// The bytes are not trusted; Assemble verifies them.
type RangeFetcher interface {
	Fetch(ctx context.Context, fileSHA string, off, n int64) (io.ReadCloser, error)
}

// BatchFetcher is an optional RangeFetcher extension that returns several
// ranges concatenated in one request (a piece of a column slice is many
// short row segments).
type BatchFetcher interface {
	FetchRanges(ctx context.Context, fileSHA string, ranges []Range) (io.ReadCloser, error)
}

// LocalFetcher serves ranges of files this node has, by sha256.
type LocalFetcher struct {
	mu    sync.Mutex
	files map[string]io.ReaderAt
}

// Add makes r, the file with sha256 sha, available.
func (lf *LocalFetcher) Add(sha string, r io.ReaderAt) {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.files == nil {
		lf.files = map[string]io.ReaderAt{}
	}
	lf.files[sha] = r
}

// Fetch implements RangeFetcher.
func (lf *LocalFetcher) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	lf.mu.Lock()
	r, ok := lf.files[sha]
	lf.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("shard: no local file with sha256 %s", sha)
	}
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("shard: bad range [%d,+%d)", off, n)
	}
	return io.NopCloser(io.NewSectionReader(r, off, n)), nil
}

// FileSHA256 hashes the file at path (hex).
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Progress reports an assembly.
type Progress struct {
	Pieces    int   // in the shard
	Done      int   // present on disk
	Bytes     int64 // of the shard's pieces
	DoneBytes int64
	Resumed   int   // pieces found present and intact at start
	Fetched   int64 // bytes fetched by this run, refetches included
	Refetched int   // piece fetches repeated after a bad checksum or a failed read
}

// AssembleOptions tune Assemble.
type AssembleOptions struct {
	Parallel int // pieces fetched at once (4 if 0)
	Attempts int // fetches of one piece before giving up (3 if 0)
	// TrustExisting skips re-hashing the pieces a resumed file marks present.
	TrustExisting bool
	// SyncBytes is how much data is written between syncs that make
	// pieces count as present (32 MiB if 0).
	SyncBytes int64
	Progress  func(Progress) // called after every piece written, from one goroutine
}

// Assemble makes path a complete shard file for l, fetching what it lacks
// through f. A file left by an earlier, interrupted run is resumed: its
// present pieces are kept (after re-hashing them, unless trusted), so only
// missing ones are fetched. Every fetched piece is checked against its
// sha256 and fetched again when it does not match. l must be signed.
func Assemble(ctx context.Context, path string, l *Layout, f RangeFetcher, o AssembleOptions) (Progress, error) {
	// unsigned: the fetcher verifies its bytes (against a manifest) and
	// the layout is signed from them as they come; the file is marked
	// present only once its index holds every sum.
	unsigned := false
	if !l.Signed() {
		if _, ok := f.(VerifiedFetcher); !ok {
			return Progress{}, fmt.Errorf("shard: layout is not signed (no piece checksums)")
		}
		if sums := signedSums(path, l); sums != nil {
			for i := range l.Pieces {
				l.Pieces[i].Sum = sums[i]
			}
		} else {
			unsigned = true
			for i := range l.Pieces {
				l.Pieces[i].Sum = unsignedSum
			}
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return Progress{}, err
			}
		}
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.SyncBytes <= 0 {
		o.SyncBytes = 32 << 20
	}
	sf, err := openFile(path, l)
	switch {
	case errors.Is(err, os.ErrNotExist):
		sf, err = createFile(path, l)
	case err != nil && !errors.Is(err, ErrMismatch):
		// An unreadable header (a crash while creating it): start over.
		sf, err = createFile(path, l)
	}
	if err != nil {
		return Progress{}, fmt.Errorf("shard %s: %w", path, err)
	}
	defer sf.f.Close()

	pr := Progress{Pieces: len(l.Pieces), Bytes: l.Bytes()}
	var todo []int
	var bad []int
	var buf []byte
	for i := range l.Pieces {
		if sf.state[i] == 1 && !o.TrustExisting {
			if buf, err = sf.readPiece(i, buf); err != nil || !checkSum(buf, l.Pieces[i].Sum) {
				bad = append(bad, i)
				sf.state[i] = 0
			}
		}
		if sf.state[i] == 1 {
			pr.Done++
			pr.Resumed++
			pr.DoneBytes += l.Pieces[i].Size()
		} else {
			todo = append(todo, i)
		}
	}
	if err := sf.mark(bad, 0); err != nil {
		return pr, err
	}
	if len(todo) == 0 {
		return pr, nil
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i         int
		data      []byte
		fetched   int64
		refetched int
		sum       string // computed, for an unsigned layout
		err       error
	}
	work := make(chan int)
	results := make(chan result)
	var wg sync.WaitGroup
	for range min(o.Parallel, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r := result{i: i}
				for attempt := 0; attempt < o.Attempts; attempt++ {
					if attempt > 0 {
						r.refetched++
					}
					var data []byte
					data, r.err = fetchPiece(ctx, f, l.Spec.FileSHA, &l.Pieces[i])
					r.fetched += int64(len(data))
					if r.err == nil && unsigned {
						sum := sha256.Sum256(data)
						r.sum = hex.EncodeToString(sum[:])
					} else if r.err == nil && !checkSum(data, l.Pieces[i].Sum) {
						r.err = fmt.Errorf("piece %d (%d bytes from file offset %d): sha256 mismatch", i, l.Pieces[i].Size(), l.Pieces[i].Segs[0].Src)
					}
					if r.err == nil {
						r.data = data
						break
					}
					if ctx.Err() != nil {
						break
					}
				}
				select {
				case results <- r:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	go func() {
		defer close(work)
		for _, i := range todo {
			select {
			case work <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); close(results) }()

	var firstErr error
	var pending []int
	sums := make([]string, len(l.Pieces))
	var pendingBytes int64
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		if unsigned {
			return nil // marked once the index is signed
		}
		if err := sf.f.Sync(); err != nil {
			return err
		}
		if err := sf.mark(pending, 1); err != nil {
			return err
		}
		pending, pendingBytes = pending[:0], 0
		return nil
	}
	for r := range results {
		pr.Fetched += r.fetched
		pr.Refetched += r.refetched
		if r.err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("shard %s: %w", path, r.err)
				cancel()
			}
			continue
		}
		if err := sf.writePiece(r.i, r.data); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("shard %s: %w", path, err)
				cancel()
			}
			continue
		}
		if unsigned {
			sums[r.i] = r.sum
		}
		pending = append(pending, r.i)
		pendingBytes += int64(len(r.data))
		pr.Done++
		pr.DoneBytes += int64(len(r.data))
		if pendingBytes >= o.SyncBytes {
			if err := flush(); err != nil && firstErr == nil {
				firstErr = err
				cancel()
			}
		}
		if o.Progress != nil {
			o.Progress(pr)
		}
	}
	if err := flush(); err != nil && firstErr == nil {
		firstErr = err
	}
	if unsigned && firstErr == nil && pr.Done == pr.Pieces {
		for i := range l.Pieces {
			l.Pieces[i].Sum = sums[i]
		}
		if err := sf.f.Sync(); err != nil {
			firstErr = err
		} else if err := sf.writeIndex(); err != nil {
			firstErr = err
		} else if err := sf.f.Sync(); err != nil {
			firstErr = err
		} else {
			unsigned = false
			firstErr = flush()
		}
	}
	if err := sf.f.Sync(); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr == nil && pr.Done != pr.Pieces {
		firstErr = fmt.Errorf("shard %s: %d of %d pieces missing", path, pr.Pieces-pr.Done, pr.Pieces)
	}
	return pr, firstErr
}

// fetchPiece reads a piece's segments, in one request when f can batch.
func fetchPiece(ctx context.Context, f RangeFetcher, sha string, p *Piece) ([]byte, error) {
	size := p.Size()
	buf := make([]byte, size)
	if bf, ok := f.(BatchFetcher); ok && len(p.Segs) > 1 {
		rs := make([]Range, len(p.Segs))
		for i, s := range p.Segs {
			rs[i] = Range{s.Src, s.N}
		}
		rc, err := bf.FetchRanges(ctx, sha, rs)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		n, err := io.ReadFull(rc, buf)
		return buf[:n], err
	}
	at := 0
	for _, s := range p.Segs {
		rc, err := f.Fetch(ctx, sha, s.Src, s.N)
		if err != nil {
			return buf[:at], err
		}
		n, err := io.ReadFull(rc, buf[at:at+int(s.N)])
		rc.Close()
		at += n
		if err != nil {
			return buf[:at], fmt.Errorf("range [%d,+%d): %w", s.Src, s.N, err)
		}
	}
	return buf, nil
}
