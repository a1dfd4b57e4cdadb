package hub

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Join stores the one-file form of the split model called name: write
// gets the file to fill (from the parts, which Paths lists in load order;
// the caller knows the format), the result becomes a blob of its own and
// the manifest's Joined. A model joined before is returned as it is.
func (s *Store) Join(name string, write func(w io.Writer) error) (*Manifest, error) {
	m, err := s.Get(name)
	if err != nil {
		return nil, err
	}
	if len(m.Parts) < 2 {
		return nil, fmt.Errorf("model %s is one file: nothing to join", name)
	}
	if m.Joined != nil && exists(s.BlobPath(m.Joined.SHA256)) {
		return m, nil
	}
	tmp, err := os.CreateTemp(filepath.Join(s.Dir, "blobs"), ".join-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(tmp, h)}
	if err := write(cw); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("joining the %d parts of %s: %w", len(m.Parts), name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	sha := hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(tmp.Name(), s.BlobPath(sha)); err != nil {
		return nil, err
	}
	m.Joined = &Part{Path: "(joined)", Size: cw.n, SHA256: sha}
	if err := s.writeManifest(m); err != nil {
		return nil, err
	}
	return m, nil
}

// LoadPath is the one file of m an engine loads: its only part, or the
// joined file of a split model (false when it was not joined yet).
func (s *Store) LoadPath(m Manifest) (string, bool) {
	switch {
	case len(m.Parts) == 1:
		return s.BlobPath(m.Parts[0].SHA256), true
	case m.Joined != nil && exists(s.BlobPath(m.Joined.SHA256)):
		return s.BlobPath(m.Joined.SHA256), true
	}
	return "", false
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
