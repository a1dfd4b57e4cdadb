package hub

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// download fetches file into blobsDir, verified, and returns the blob's
// sha256. The bytes go to sha256-<hex>.partial first (kept across runs, so
// a later pull resumes it) and are renamed to sha256-<hex> once verified.
// progress gets the bytes of this file on disk so far.
func (c *Client) download(ctx context.Context, repo, revision string, file FileInfo, blobsDir string, progress func(done int64)) (string, error) {
	want := file.SHA256
	partial := filepath.Join(blobsDir, "sha256-"+want+".partial")
	if want == "" {
		// Not an LFS file: no hash to resume against; name it when done.
		var rnd [8]byte
		rand.Read(rnd[:])
		partial = filepath.Join(blobsDir, "tmp-"+hex.EncodeToString(rnd[:])+".partial")
		defer os.Remove(partial)
	}
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := lock(ctx, f); err != nil {
		return "", err
	}
	if want != "" && exists(filepath.Join(blobsDir, "sha256-"+want)) {
		// Another pull finished it while we waited; drop the empty partial
		// we may have created after it renamed its own.
		if a, err := f.Stat(); err == nil {
			if b, err := os.Stat(partial); err == nil && os.SameFile(a, b) {
				os.Remove(partial)
			}
		}
		return want, nil
	}

	h := sha256.New()
	have, err := rehash(f, h, file.Size)
	if err != nil {
		return "", err
	}
	progress(have)

	attempts := c.MaxAttempts
	if attempts <= 0 {
		attempts = 6
	}
	backoff := c.Backoff
	if backoff <= 0 {
		backoff = 500 * time.Millisecond
	}
	u := c.resolveURL(repo, revision, file.Path)
	// A cut connection is retried from the bytes on disk; attempts count
	// failures in a row, so a long download over a flaky link that keeps
	// making progress is not given up.
	for fails := 0; file.Size == 0 || have < file.Size; {
		before := have
		err := c.fetchFrom(ctx, u, repo, file, f, h, &have, progress)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		var re *retryableError
		if !errors.As(err, &re) {
			if errors.Is(err, ErrChecksum) {
				f.Close()
				os.Remove(partial)
			}
			return "", fmt.Errorf("downloading %s/%s: %w", repo, file.Path, err)
		}
		if have > before {
			fails = 0
		}
		if fails++; fails >= attempts {
			return "", fmt.Errorf("downloading %s/%s: %w (gave up after %d attempts; run the pull again to resume from %d of %d bytes)", repo, file.Path, err, fails, have, file.Size)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(min(backoff<<(fails-1), 30*time.Second)):
		}
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	got := hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		f.Close()
		os.Remove(partial)
		return "", fmt.Errorf("%s/%s: %w: got %s, want %s; the download was corrupted or the file changed on the hub", repo, file.Path, ErrChecksum, got, want)
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(partial, filepath.Join(blobsDir, "sha256-"+got)); err != nil {
		return "", err
	}
	return got, nil
}

// rehash feeds the partial file's bytes to h (resuming a download means
// knowing the hash of what is already there) and positions f after them.
// A partial longer than the file is started over.
func rehash(f *os.File, h hash.Hash, size int64) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() > size && size > 0 {
		if err := f.Truncate(0); err != nil {
			return 0, err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// restart empties the partial file and the hash.
func restart(f *os.File, h hash.Hash, have *int64) error {
	h.Reset()
	*have = 0
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// fetchFrom makes one request for the bytes from *have on and appends what
// arrives to f and h. A cut connection is a retryableError with *have
// advanced by what did arrive.
func (c *Client) fetchFrom(ctx context.Context, u, repo string, file FileInfo, f *os.File, h hash.Hash, have *int64, progress func(int64)) error {
	req, err := c.newRequest(ctx, u)
	if err != nil {
		return err
	}
	if *have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", *have))
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &retryableError{err}
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		if *have > 0 { // the server ignored Range: start over
			if err := restart(f, h, have); err != nil {
				return err
			}
			progress(0)
		}
	case http.StatusPartialContent:
		if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); !ok || start != *have {
			if err := restart(f, h, have); err != nil {
				return err
			}
			progress(0)
			return &retryableError{fmt.Errorf("server sent bytes from %q, asked for %d", resp.Header.Get("Content-Range"), *have)}
		}
	case http.StatusRequestedRangeNotSatisfiable:
		if err := restart(f, h, have); err != nil {
			return err
		}
		progress(0)
		return &retryableError{errors.New("server refused the resume range")}
	default:
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
			return &retryableError{fmt.Errorf("hub answered HTTP %d for %s", resp.StatusCode, file.Path)}
		}
		return c.statusError(resp, repo, file.Path)
	}
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if file.Size > 0 && *have+int64(n) > file.Size {
				return fmt.Errorf("%w: the hub sent more than the %d bytes of %s", ErrChecksum, file.Size, file.Path)
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
			h.Write(buf[:n])
			*have += int64(n)
			progress(*have)
		}
		if rerr == io.EOF {
			if file.Size > 0 && *have < file.Size {
				return &retryableError{io.ErrUnexpectedEOF}
			}
			return nil
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return &retryableError{rerr}
		}
	}
}

// contentRangeStart parses the first byte of "bytes N-M/T".
func contentRangeStart(v string) (int64, bool) {
	v, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(v, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(first), 10, 64)
	return n, err == nil
}
