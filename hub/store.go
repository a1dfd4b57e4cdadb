package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Store is the local model store:
//
//	<dir>/blobs/sha256-<hex>            verified file contents, by sha256
//	<dir>/blobs/sha256-<hex>.partial    a download in progress (resumable)
//	<dir>/manifests/<name>.json         a model: its reference and parts
type Store struct {
	Dir string
}

// Manifest names one model in the store.
type Manifest struct {
	Name     string    `json:"name"`     // e.g. qwen2.5-0.5b-instruct:q4_k_m
	Ref      string    `json:"ref"`      // the hub reference, e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
	Repo     string    `json:"repo"`     // Qwen/Qwen2.5-0.5B-Instruct-GGUF
	Revision string    `json:"revision"` // main, a branch, tag or commit
	Parts    []Part    `json:"parts"`    // in load order (split GGUF: 00001 first)
	Pulled   time.Time `json:"pulled"`
	// Joined is a split model's parts joined into one file (Store.Join),
	// the file engines load; nil until joined.
	Joined *Part `json:"joined,omitempty"`
}

// Part is one file of a model.
type Part struct {
	Path   string `json:"path"`   // path inside the repository
	Size   int64  `json:"size"`   // bytes
	SHA256 string `json:"sha256"` // the blob is blobs/sha256-<SHA256>
}

// Size is the model's total bytes.
func (m Manifest) Size() int64 {
	var n int64
	for _, p := range m.Parts {
		n += p.Size
	}
	return n
}

// DefaultDir is $SHOAL_MODELS or ~/.shoal/models.
func DefaultDir() (string, error) {
	if d := os.Getenv("SHOAL_MODELS"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no model store: set SHOAL_MODELS or --store (%w)", err)
	}
	return filepath.Join(home, ".shoal", "models"), nil
}

// OpenStore opens (creating it if needed) the store at dir ("" = DefaultDir).
func OpenStore(dir string) (*Store, error) {
	if dir == "" {
		d, err := DefaultDir()
		if err != nil {
			return nil, err
		}
		dir = d
	}
	for _, sub := range []string{"blobs", "manifests"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("model store: %w", err)
		}
	}
	return &Store{Dir: dir}, nil
}

// BlobPath is where the blob of sha256 hex lives.
func (s *Store) BlobPath(sha string) string {
	return filepath.Join(s.Dir, "blobs", "sha256-"+sha)
}

// Paths are the local files of m's parts, in order.
func (s *Store) Paths(m Manifest) []string {
	out := make([]string, len(m.Parts))
	for i, p := range m.Parts {
		out[i] = s.BlobPath(p.SHA256)
	}
	return out
}

func checkName(name string) error {
	if name == "" || strings.HasPrefix(name, ".") || strings.ContainsAny(name, `/\`) || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' }) {
		return fmt.Errorf("bad model name %q: no slashes, not starting with a dot", name)
	}
	return nil
}

func (s *Store) manifestPath(name string) string {
	return filepath.Join(s.Dir, "manifests", name+".json")
}

// PullOptions tune Pull.
type PullOptions struct {
	Name     string // store name ("" = derived: qwen2.5-0.5b-instruct:q4_k_m)
	Revision string // "" = main
	Offline  bool   // use only the store; never the network
	// Stored answers from the store, without the network, when it holds
	// what the reference names (a bare REPO: the model that reference
	// pulled, or its Q4_K_M file); else Pull asks the hub.
	Stored bool
	Client *Client // nil = NewClient() (HF_ENDPOINT, HF_TOKEN)
	// Progress, if set, gets the bytes of the model on disk so far and its
	// total, across all parts (blobs already in the store count as done).
	Progress func(done, total int64)
}

// Pull makes the model ref names available in the store: it resolves the
// reference against the hub's file list, downloads (resuming, verifying)
// each part not yet in the store and writes the manifest.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*Manifest, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	rev := opts.Revision
	if rev == "" {
		rev = "main"
	}
	if opts.Name != "" {
		if err := checkName(opts.Name); err != nil {
			return nil, err
		}
	}
	if opts.Stored && !opts.Offline {
		if m, ok := s.stored(r, rev, opts.Name); ok {
			return m, nil
		}
	}
	if opts.Offline {
		m, err := s.findLocal(r, rev, opts.Name)
		if err != nil {
			return nil, err
		}
		if opts.Progress != nil {
			opts.Progress(m.Size(), m.Size())
		}
		return m, nil
	}
	c := opts.Client
	if c == nil {
		c = NewClient()
	}
	files, err := c.ListFiles(ctx, r.Repo, rev)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, ErrGated) && !errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("%w (is %s reachable? HF_ENDPOINT names a mirror; --offline uses the store alone)", err, c.base())
		}
		return nil, err
	}
	sel, err := selectModel(r, files)
	if err != nil {
		return nil, err
	}
	m := &Manifest{Name: opts.Name, Ref: r.String(), Repo: r.Repo, Revision: rev, Pulled: time.Now().UTC()}
	if m.Name == "" {
		m.Name = defaultName(r, sel)
	}
	if err := checkName(m.Name); err != nil {
		return nil, err
	}
	var total, done int64
	for _, p := range sel.parts {
		total += p.Size
	}
	report := func(n int64) {
		if opts.Progress != nil {
			opts.Progress(n, total)
		}
	}
	report(0)
	for _, p := range sel.parts {
		sha := p.SHA256
		if sha == "" || !exists(s.BlobPath(sha)) {
			base := done
			sha, err = c.download(ctx, r.Repo, rev, p, filepath.Join(s.Dir, "blobs"), func(n int64) { report(base + n) })
			if err != nil {
				return nil, err
			}
		}
		done += p.Size
		report(done)
		m.Parts = append(m.Parts, Part{Path: p.Path, Size: p.Size, SHA256: sha})
	}
	old, oldErr := s.readManifest(s.manifestPath(m.Name))
	if oldErr == nil && sameModel(old, m) {
		return old, nil // already stored as it is: keep its reference and date
	}
	_, replaced := os.Stat(s.manifestPath(m.Name))
	if err := s.writeManifest(m); err != nil {
		return nil, err
	}
	if replaced == nil { // the old parts may be orphans now
		if err := s.gc(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func sameModel(a, b *Manifest) bool {
	if !strings.EqualFold(a.Repo, b.Repo) || a.Revision != b.Revision || len(a.Parts) != len(b.Parts) {
		return false
	}
	for i := range a.Parts {
		if a.Parts[i] != b.Parts[i] {
			return false
		}
	}
	return true
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (s *Store) writeManifest(m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Join(s.Dir, "manifests"), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.manifestPath(m.Name))
}

// List returns the store's models sorted by name.
func (s *Store) List() ([]Manifest, error) {
	ents, err := os.ReadDir(filepath.Join(s.Dir, "manifests"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []Manifest
	for _, e := range ents {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		m, err := s.readManifest(filepath.Join(s.Dir, "manifests", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *Store) readManifest(p string) (*Manifest, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("model store: %s: %w", p, err)
	}
	return &m, nil
}

// Get returns the manifest called name.
func (s *Store) Get(name string) (*Manifest, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	m, err := s.readManifest(s.manifestPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: no model called %s in %s", ErrNotInStore, name, s.Dir)
	}
	return m, err
}

// findLocal finds the stored model a reference names without the network:
// by name (given or derivable from REPO:QUANT), else by repository and
// quantization or file.
func (s *Store) findLocal(r Ref, rev, name string) (*Manifest, error) {
	var m *Manifest
	if name != "" {
		got, err := s.Get(name)
		if err != nil {
			return nil, err
		}
		if r.Repo != "" && (!matchesRef(*got, r) || rev != "" && got.Revision != rev) {
			return nil, fmt.Errorf("%w: the stored model %s is %s@%s, not %s@%s", ErrNotInStore, name, got.Ref, got.Revision, r, rev)
		}
		m = got
	} else {
		all, err := s.List()
		if err != nil {
			return nil, err
		}
		var hits []Manifest
		for _, c := range all {
			if matchesRef(c, r) && (rev == "" || c.Revision == rev) {
				hits = append(hits, c)
			}
		}
		if len(hits) == 0 {
			return nil, fmt.Errorf("%w: %s (revision %s) was never pulled into %s; pull it without --offline first", ErrNotInStore, r, rev, s.Dir)
		}
		if len(hits) > 1 {
			var names []string
			for _, h := range hits {
				names = append(names, h.Name)
			}
			return nil, fmt.Errorf("%s names several stored models (%s); give --name or REPO:QUANT", r, strings.Join(names, ", "))
		}
		m = &hits[0]
	}
	for _, p := range m.Parts {
		if !exists(s.BlobPath(p.SHA256)) {
			return nil, fmt.Errorf("%w: %s lacks its blob for %s; pull it again without --offline", ErrNotInStore, m.Name, p.Path)
		}
	}
	return m, nil
}

// stored finds without the network the model a reference names when the
// store can tell: REPO:QUANT or REPO/FILE.gguf as findLocal matches it; a
// bare REPO only by the model pulled with that same reference or by its
// stored Q4_K_M file, which is what the hub would choose first (another
// stored file of the repository may not be).
func (s *Store) stored(r Ref, rev, name string) (*Manifest, bool) {
	if r.Quant != "" || r.File != "" || name != "" {
		m, err := s.findLocal(r, rev, name)
		return m, err == nil
	}
	if m, err := s.findLocal(Ref{Repo: r.Repo, Quant: "Q4_K_M"}, rev, ""); err == nil {
		return m, true
	}
	all, err := s.List()
	if err != nil {
		return nil, false
	}
	var hit string
	for _, m := range all {
		if strings.EqualFold(m.Ref, r.String()) && m.Revision == rev {
			if hit != "" {
				return nil, false
			}
			hit = m.Name
		}
	}
	if hit == "" {
		return nil, false
	}
	m, err := s.findLocal(Ref{}, rev, hit)
	return m, err == nil
}

// ModelAt returns the stored model whose file (the one engines load) is
// path, when path is a blob of a model store (STORE/blobs/sha256-HEX):
// the store is the folder above blobs, found from the path alone.
func ModelAt(path string) (*Manifest, bool) {
	abs, err := filepath.Abs(path)
	if err != nil || !strings.HasPrefix(filepath.Base(abs), "sha256-") || filepath.Base(filepath.Dir(abs)) != "blobs" {
		return nil, false
	}
	s := &Store{Dir: filepath.Dir(filepath.Dir(abs))}
	all, err := s.List()
	if err != nil {
		return nil, false
	}
	for _, m := range all {
		if p, ok := s.LoadPath(m); ok && p == abs {
			return &m, true
		}
	}
	return nil, false
}

// matchesRef reports whether the stored model m is what r names.
func matchesRef(m Manifest, r Ref) bool {
	if !strings.EqualFold(m.Repo, r.Repo) || len(m.Parts) == 0 {
		return false
	}
	sel := model{parts: make([]FileInfo, len(m.Parts))}
	for i, p := range m.Parts {
		sel.parts[i] = FileInfo{Path: p.Path}
	}
	switch {
	case r.File != "":
		for _, p := range m.Parts {
			if p.Path == r.File {
				return true
			}
		}
		return false
	case r.Quant != "":
		return sel.matchesQuant(r.Quant)
	}
	return true
}

// Resolve returns the local files, in load order, of the stored model
// called nameOrRef, or of the one stored model a hub reference names.
func (s *Store) Resolve(nameOrRef string) ([]string, error) {
	if checkName(nameOrRef) == nil && exists(s.manifestPath(nameOrRef)) {
		m, err := s.findLocal(Ref{}, "", nameOrRef)
		if err != nil {
			return nil, err
		}
		return s.Paths(*m), nil
	}
	r, err := ParseRef(nameOrRef)
	if err != nil {
		return nil, fmt.Errorf("%w: no model called %s in %s", ErrNotInStore, nameOrRef, s.Dir)
	}
	m, err := s.findLocal(r, "", "")
	if err != nil {
		return nil, err
	}
	return s.Paths(*m), nil
}

// Remove deletes the model called name and every blob no other manifest
// names.
func (s *Store) Remove(name string) error {
	if _, err := s.Get(name); err != nil {
		return err
	}
	if err := os.Remove(s.manifestPath(name)); err != nil {
		return err
	}
	return s.gc()
}

// gc deletes blobs no manifest names (partial downloads are kept: they are
// resumed by the next pull).
func (s *Store) gc() error {
	all, err := s.List()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, m := range all {
		for _, p := range m.Parts {
			keep["sha256-"+p.SHA256] = true
		}
		if m.Joined != nil {
			keep["sha256-"+m.Joined.SHA256] = true
		}
	}
	ents, err := os.ReadDir(filepath.Join(s.Dir, "blobs"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, "sha256-") || strings.HasSuffix(n, ".partial") || keep[n] {
			continue
		}
		if err := os.Remove(filepath.Join(s.Dir, "blobs", n)); err != nil {
			return err
		}
	}
	return nil
}
