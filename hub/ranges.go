package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Resolve finds the one file a reference names in repo at revision ("" =
// main), with its size and LFS sha256, for reading it in place by range
// (ReadRange) instead of pulling it. Only single-file GGUF models qualify:
// a split model (NAME-00001-of-0000N.gguf) is refused, and so is a file
// without an LFS sha256 (its bytes could not be verified).
func (c *Client) Resolve(ctx context.Context, ref, revision string) (Ref, FileInfo, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return Ref{}, FileInfo{}, err
	}
	files, err := c.ListFiles(ctx, r.Repo, revision)
	if err != nil {
		return Ref{}, FileInfo{}, err
	}
	m, err := selectModel(r, files)
	if err != nil {
		return Ref{}, FileInfo{}, err
	}
	if len(m.parts) > 1 || splitRE.MatchString(m.first()) {
		return Ref{}, FileInfo{}, fmt.Errorf("%s is a split model (%s, %d parts): loading by hub reference reads one file in place; pull it instead (shoal pull %s) and load the pulled model", r, m.first(), len(m.parts), r)
	}
	f := m.parts[0]
	if f.SHA256 == "" || f.Size <= 0 {
		return Ref{}, FileInfo{}, fmt.Errorf("%s/%s has no LFS sha256 in the hub's listing, so its bytes could not be verified; pull it instead", r.Repo, f.Path)
	}
	return r, f, nil
}

// ReadRange reads the n bytes at off of file in repo at revision ("" =
// main) with HTTP Range requests. A connection cut (or a 5xx) mid-range is
// retried from the first byte not yet delivered, up to MaxAttempts failures
// in a row with a back-off; the bytes are not verified here (the caller
// checks them against the file's sums).
func (c *Client) ReadRange(ctx context.Context, repo, revision, file string, off, n int64) io.ReadCloser {
	return &rangeReader{c: c, ctx: ctx, u: c.resolveURL(repo, revision, file), repo: repo, file: file, off: off, left: n}
}

type rangeReader struct {
	c          *Client
	ctx        context.Context
	u          string
	repo, file string
	off, left  int64
	body       io.ReadCloser
	fails      int
	err        error
}

func (r *rangeReader) Read(p []byte) (int, error) {
	for {
		if r.err != nil {
			return 0, r.err
		}
		if r.left <= 0 {
			r.close()
			return 0, io.EOF
		}
		if r.body == nil {
			if err := r.open(); err != nil {
				if !r.retry(err) {
					return 0, r.err
				}
				continue
			}
		}
		if int64(len(p)) > r.left {
			p = p[:r.left]
		}
		k, err := r.body.Read(p)
		r.off += int64(k)
		r.left -= int64(k)
		if k > 0 {
			r.fails = 0
		}
		if err == io.EOF && r.left > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			r.close()
			if k > 0 {
				return k, nil // retried at the next Read
			}
			if !r.retry(&retryableError{err}) {
				return 0, r.err
			}
			continue
		}
		if k > 0 || err == io.EOF {
			return k, nil
		}
	}
}

// retry waits before another attempt, or records why there is none.
func (r *rangeReader) retry(err error) bool {
	var re *retryableError
	if r.ctx.Err() != nil {
		r.err = r.ctx.Err()
		return false
	}
	if !errors.As(err, &re) {
		r.err = fmt.Errorf("reading %s/%s: %w", r.repo, r.file, err)
		return false
	}
	attempts := r.c.MaxAttempts
	if attempts <= 0 {
		attempts = 6
	}
	if r.fails++; r.fails >= attempts {
		r.err = fmt.Errorf("reading bytes [%d,+%d) of %s/%s: %w (gave up after %d attempts)", r.off, r.left, r.repo, r.file, err, r.fails)
		return false
	}
	backoff := r.c.Backoff
	if backoff <= 0 {
		backoff = 500 * time.Millisecond
	}
	select {
	case <-r.ctx.Done():
		r.err = r.ctx.Err()
		return false
	case <-time.After(min(backoff<<(r.fails-1), 30*time.Second)):
	}
	return true
}

// open requests bytes [off, off+left).
func (r *rangeReader) open() error {
	req, err := r.c.newRequest(r.ctx, r.u)
	if err != nil {
		return err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", r.off, r.off+r.left-1))
	resp, err := r.c.httpClient().Do(req)
	if err != nil {
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		return &retryableError{err}
	}
	switch {
	case resp.StatusCode == http.StatusPartialContent:
		if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); !ok || start != r.off {
			resp.Body.Close()
			return fmt.Errorf("the hub sent bytes %q for a request from byte %d", resp.Header.Get("Content-Range"), r.off)
		}
	case resp.StatusCode == http.StatusOK:
		// The server ignored Range: skip to off (costly, but correct).
		if _, err := io.CopyN(io.Discard, resp.Body, r.off); err != nil {
			resp.Body.Close()
			return &retryableError{err}
		}
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		resp.Body.Close()
		return &retryableError{fmt.Errorf("hub answered HTTP %d for %s", resp.StatusCode, r.file)}
	default:
		defer resp.Body.Close()
		return r.c.statusError(resp, r.repo, r.file+" (bytes "+strings.TrimPrefix(req.Header.Get("Range"), "bytes=")+")")
	}
	r.body = resp.Body
	return nil
}

func (r *rangeReader) close() {
	if r.body != nil {
		r.body.Close()
		r.body = nil
	}
}

// Close implements io.Closer.
func (r *rangeReader) Close() error {
	r.close()
	if r.err == nil {
		r.err = errors.New("hub: range reader closed")
	}
	return nil
}
