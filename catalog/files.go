package catalog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// localFile is a model file this node has, verified by its sha256.
type localFile struct {
	SHA   string    `json:"sha256"`
	Path  string    `json:"path"`
	Size  int64     `json:"size"`
	MTime time.Time `json:"mtime"`
	// Replica marks a copy this node made for the cluster (removed when no
	// model has the file any more); Index is the state's index when the
	// copy began, so a state from before it does not remove it.
	Replica bool   `json:"replica,omitempty"`
	Index   uint64 `json:"index,omitempty"`

	f *os.File
}

// fileRegistry holds the model files this node serves to peers, by sha256,
// and remembers them across restarts (files.json in the data dir). A file
// that changed size or mtime since it was hashed is dropped.
type fileRegistry struct {
	dir  string
	path string
	mu   sync.Mutex
	bySH map[string]*localFile
	read atomic.Int64 // bytes read for peers
}

const filesFile = "files.json"

func openFileRegistry(dir string, log *zap.Logger) *fileRegistry {
	r := &fileRegistry{dir: dir, path: filepath.Join(dir, filesFile), bySH: map[string]*localFile{}}
	b, err := os.ReadFile(r.path)
	if err != nil {
		return r
	}
	var list []*localFile
	if err := json.Unmarshal(b, &list); err != nil {
		log.Warn("ignoring a corrupt file list", zap.String("file", r.path), zap.Error(err))
		return r
	}
	for _, lf := range list {
		if err := lf.open(); err != nil {
			log.Warn("a model file this node served is gone or changed", zap.String("path", lf.Path), zap.Error(err))
			continue
		}
		r.bySH[lf.SHA] = lf
	}
	return r
}

func (lf *localFile) open() error {
	f, st, err := openModelFile(lf.Path) // a FIFO put in its place must not hang the agent
	if nr := (*notRegularError)(nil); errors.As(err, &nr) {
		return fmt.Errorf("%s: %w", lf.Path, err)
	}
	if err != nil {
		return err
	}
	if st.Size() != lf.Size || !st.ModTime().Equal(lf.MTime) {
		err = fmt.Errorf("%s changed since it was hashed", lf.Path)
	}
	if err != nil {
		f.Close()
		return err
	}
	lf.f = f
	return nil
}

// lookupPath returns the sha256 of path when it was hashed before and has
// not changed since.
func (r *fileRegistry) lookupPath(path string, st os.FileInfo) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, lf := range r.bySH {
		if lf.Path == path && lf.Size == st.Size() && lf.MTime.Equal(st.ModTime()) {
			return lf.SHA, true
		}
	}
	return "", false
}

// add registers path, hashed to sha, and saves the list.
func (r *fileRegistry) add(sha, path string, st os.FileInfo) error {
	return r.put(&localFile{SHA: sha, Path: path, Size: st.Size(), MTime: st.ModTime()})
}

// addReplica registers a verified copy of the file with sha at path, made
// from the state at index.
func (r *fileRegistry) addReplica(sha, path string, st os.FileInfo, index uint64) error {
	return r.put(&localFile{SHA: sha, Path: path, Size: st.Size(), MTime: st.ModTime(), Replica: true, Index: index})
}

func (r *fileRegistry) put(lf *localFile) error {
	if err := lf.open(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.bySH[lf.SHA]; old != nil {
		old.f.Close()
	}
	r.bySH[lf.SHA] = lf
	return r.saveLocked()
}

// remove forgets the file with sha and saves the list.
func (r *fileRegistry) remove(sha string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	lf := r.bySH[sha]
	if lf == nil {
		return nil
	}
	lf.f.Close()
	delete(r.bySH, sha)
	return r.saveLocked()
}

func (r *fileRegistry) saveLocked() error {
	list := make([]*localFile, 0, len(r.bySH))
	for _, f := range r.bySH {
		list = append(list, f)
	}
	b, _ := json.MarshalIndent(list, "", "  ")
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.path)
}

// replicas lists the copies this node made.
func (r *fileRegistry) replicas() []localFile {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []localFile
	for _, lf := range r.bySH {
		if lf.Replica {
			out = append(out, localFile{SHA: lf.SHA, Path: lf.Path, Size: lf.Size, MTime: lf.MTime, Replica: true, Index: lf.Index})
		}
	}
	return out
}

// get returns the registered file with sha.
func (r *fileRegistry) get(sha string) (*localFile, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lf, ok := r.bySH[sha]
	return lf, ok
}

// OpenWeights implements transport.WeightSource.
func (r *fileRegistry) OpenWeights(sha string) (io.ReaderAt, int64, bool) {
	lf, ok := r.get(sha)
	if !ok {
		return nil, 0, false
	}
	return countingReaderAt{lf.f, &r.read}, lf.Size, true
}

func (r *fileRegistry) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, lf := range r.bySH {
		lf.f.Close()
	}
}

type countingReaderAt struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// LocalPath implements shard.LocalFiles.
func (r *fileRegistry) LocalPath(sha string) (string, bool) {
	lf, ok := r.get(sha)
	if !ok {
		return "", false
	}
	return lf.Path, true
}

// manifestsDir holds the manifests of the model files this node has.
const manifestsDir = "manifests"

// manifest returns the manifest of a file this node has, when it built one.
func (r *fileRegistry) manifest(sha string) ([]byte, bool) {
	if _, ok := r.get(sha); !ok {
		return nil, false
	}
	b, err := os.ReadFile(filepath.Join(r.dir, manifestsDir, sha+".json"))
	return b, err == nil
}

// dropManifest removes the manifest of the file with sha.
func (r *fileRegistry) dropManifest(sha string) {
	_ = os.Remove(filepath.Join(r.dir, manifestsDir, sha+".json"))
}

// saveManifest keeps the manifest of the file with sha.
func (r *fileRegistry) saveManifest(sha string, raw []byte) error {
	dir := filepath.Join(r.dir, manifestsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, sha+".json"), raw, 0o600)
}
