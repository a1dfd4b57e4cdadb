package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/engine/gguf"
	"shoal/shard"
	"shoal/transport"
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

// PeerFetcher fetches byte ranges of a model file from the peer at Addr
// over the weights stream. It implements shard.RangeFetcher and
// shard.BatchFetcher; Received counts the bytes it delivered.
type PeerFetcher struct {
	EP       *transport.Endpoint
	Addr     string
	Received atomic.Int64
}

// Fetch implements shard.RangeFetcher.
func (p *PeerFetcher) Fetch(ctx context.Context, sha string, off, n int64) (io.ReadCloser, error) {
	return p.FetchRanges(ctx, sha, []shard.Range{{Off: off, N: n}})
}

// FetchRanges implements shard.BatchFetcher: one request for all ranges.
func (p *PeerFetcher) FetchRanges(ctx context.Context, sha string, ranges []shard.Range) (io.ReadCloser, error) {
	wr := make([]transport.WeightRange, len(ranges))
	for i, r := range ranges {
		wr[i] = transport.WeightRange{Off: r.Off, N: r.N}
	}
	rc, err := p.EP.FetchWeights(ctx, p.Addr, sha, wr)
	if err != nil {
		return nil, err
	}
	return &countingReadCloser{rc: rc, n: &p.Received}, nil
}

type countingReadCloser struct {
	rc io.ReadCloser
	n  *atomic.Int64
}

func (c *countingReadCloser) Read(b []byte) (int, error) {
	n, err := c.rc.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReadCloser) Close() error { return c.rc.Close() }

// layoutRequest asks the node that has a model file for the signed layout
// of a shard: the file's table and every piece's sha256, from which the
// asker rebuilds the layout (shard.NewLayout is a pure function of both).
type layoutRequest struct {
	Spec      shard.ShardSpec `json:"spec"`
	PieceSize int64           `json:"piece_size"`
}

type layoutResponse struct {
	Table *shard.Table `json:"table"`
	Sums  []string     `json:"sums"`
}

// signedLayouts caches the layouts this node signed for peers: at most
// 64 and maxLayoutCache bytes of checksums (then it starts over).
type signedLayouts struct {
	mu    sync.Mutex
	m     map[string]*layoutResponse
	bytes int64
}

const maxLayoutCache = 32 << 20

// serveLayout answers Weights.Layout from a local copy of the file.
func (a *Agent) serveLayout(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
	return a.layouts.serve(a.files, a.cfg.Name, body)
}

// serve answers a layout request from files, through the cache.
func (sl *signedLayouts) serve(files *fileRegistry, nodeName string, body json.RawMessage) (any, error) {
	var req layoutRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &coordinator.Error{Code: http.StatusBadRequest, Msg: "malformed layout request"}
	}
	key, _ := json.Marshal(req)
	sl.mu.Lock()
	if r, ok := sl.m[string(key)]; ok {
		sl.mu.Unlock()
		return r, nil
	}
	sl.mu.Unlock()
	lf, ok := files.get(req.Spec.FileSHA)
	if !ok {
		return nil, &coordinator.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("node %s has no file with sha256 %s", nodeName, req.Spec.FileSHA)}
	}
	r, err := signLayout(lf, req)
	if err != nil {
		return nil, err
	}
	size := int64(len(r.Sums)) * layoutSumBytes
	sl.mu.Lock()
	if sl.m == nil || len(sl.m) >= 64 || sl.bytes+size > maxLayoutCache {
		sl.m, sl.bytes = map[string]*layoutResponse{}, 0
	}
	sl.m[string(key)] = r
	sl.bytes += size
	sl.mu.Unlock()
	return r, nil
}

// Bounds of a Weights.Layout request. The reply holds a 64-character
// checksum per piece, so its size is the shard's bytes over the piece
// size: pieces smaller than minLayoutPiece would let a peer make this node
// hash every few bytes of a model and build a reply hundreds of times the
// file's size, and signing reads a whole piece into memory, so pieces
// larger than maxLayoutPiece are refused too. Nodes ask with the default
// (shard.DefaultPieceSize, 1 MiB).
const (
	minLayoutPiece = 64 << 10
	maxLayoutPiece = 64 << 20
	// layoutSumBytes is a piece's share of the reply: the quoted hex
	// checksum and a comma.
	layoutSumBytes = 2*32 + 3
	// maxLayoutReply leaves room in the RPC frame for its envelope.
	maxLayoutReply = transport.DefaultMaxFrame - 4<<10
)

// buildLayout is shard.NewLayout; tests count its calls.
var buildLayout = shard.NewLayout

// checkLayoutSize refuses a layout request whose reply would not fit an
// RPC frame, before any piece is built: the shard's bytes come from its
// slices (a pure function of the table), the reply's size from the number
// of pieces they fill.
func checkLayoutSize(t *shard.Table, req layoutRequest) error {
	piece := req.PieceSize
	if piece <= 0 {
		piece = shard.DefaultPieceSize
	}
	if piece < minLayoutPiece || piece > maxLayoutPiece {
		return &coordinator.Error{Code: http.StatusBadRequest,
			Msg: fmt.Sprintf("layout piece size %d is outside [%d, %d] bytes: ask with 0 for the default (%d)", piece, minLayoutPiece, maxLayoutPiece, shard.DefaultPieceSize)}
	}
	slices, err := req.Spec.Slices(t)
	if err != nil {
		return &coordinator.Error{Code: http.StatusBadRequest, Msg: err.Error()}
	}
	total := int64(t.DataOffset)
	for _, sl := range slices {
		for _, r := range sl.Segs {
			total += r.N
		}
	}
	pieces := (total + piece - 1) / piece
	table, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if reply := int64(len(table)) + pieces*layoutSumBytes; reply > maxLayoutReply {
		return &coordinator.Error{Code: http.StatusRequestEntityTooLarge,
			Msg: fmt.Sprintf("the layout of this %d-byte shard in %d-byte pieces is a %d-byte reply, over the %d-byte frame limit: ask with larger pieces or a smaller shard", total, piece, reply, maxLayoutReply)}
	}
	return nil
}

func signLayout(lf *localFile, req layoutRequest) (*layoutResponse, error) {
	f, err := gguf.Open(lf.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := shard.TableOf(f)
	if err != nil {
		return nil, err
	}
	if err := checkLayoutSize(t, req); err != nil {
		return nil, err
	}
	l, err := buildLayout(t, req.Spec, req.PieceSize)
	if err != nil {
		return nil, &coordinator.Error{Code: http.StatusBadRequest, Msg: err.Error()}
	}
	if err := l.Sign(lf.f); err != nil {
		return nil, err
	}
	r := &layoutResponse{Table: t, Sums: make([]string, len(l.Pieces))}
	for i := range l.Pieces {
		r.Sums[i] = l.Pieces[i].Sum
	}
	return r, nil
}

// fetchLayout asks the peer at addr for the signed layout of spec.
func fetchLayout(ctx context.Context, ep *transport.Endpoint, addr string, spec shard.ShardSpec, piece int64) (*shard.Layout, error) {
	var resp layoutResponse
	if err := transport.Call(ctx, ep, addr, transport.KindRPC, "Weights.Layout", layoutRequest{Spec: spec, PieceSize: piece}, &resp); err != nil {
		return nil, err
	}
	if resp.Table == nil {
		return nil, fmt.Errorf("layout from %s: no table", addr)
	}
	l, err := shard.NewLayout(resp.Table, spec, piece)
	if err != nil {
		return nil, err
	}
	if len(resp.Sums) != len(l.Pieces) {
		return nil, fmt.Errorf("layout from %s: %d piece checksums for %d pieces", addr, len(resp.Sums), len(l.Pieces))
	}
	for i := range l.Pieces {
		l.Pieces[i].Sum = resp.Sums[i]
	}
	if !l.Signed() {
		return nil, fmt.Errorf("layout from %s: malformed piece checksums", addr)
	}
	return l, nil
}

// LocalPath implements shard.LocalFiles.
func (r *fileRegistry) LocalPath(sha string) (string, bool) {
	lf, ok := r.get(sha)
	if !ok {
		return "", false
	}
	return lf.Path, true
}

// peers reaches the nodes with a model file over the endpoint: the
// Weights.Layout RPC and the weights stream. It implements shard.Peers.
type peers struct{ ep *transport.Endpoint }

func (p peers) Layout(ctx context.Context, addr string, spec shard.ShardSpec) (*shard.Layout, error) {
	return fetchLayout(ctx, p.ep, addr, spec, 0)
}

func (p peers) Ranges(addr string) shard.RangeFetcher { return &PeerFetcher{EP: p.ep, Addr: addr} }

// weightSource serves the weights stream from the model files this node
// has and, for a file it has not, from the ranges its shard files hold.
type weightSource struct{ a *Agent }

// OpenWeights implements transport.WeightSource.
func (w weightSource) OpenWeights(sha string) (io.ReaderAt, int64, bool) {
	if r, size, ok := w.a.files.OpenWeights(sha); ok {
		return r, size, true
	}
	if w.a.shards == nil {
		return nil, 0, false
	}
	hr, ok := w.a.shards.Holdings(sha)
	if !ok {
		return nil, 0, false
	}
	return hr, hr.Size(), true
}

// holdingsRequest asks a node what it holds of a model file.
type holdingsRequest struct {
	FileSHA string `json:"file_sha"`
}

// holdingsResponse is the file's manifest (raw, as its ID is computed;
// absent when the node has none) and the ranges the node serves.
type holdingsResponse struct {
	Manifest json.RawMessage `json:"manifest,omitempty"`
	Held     []shard.Range   `json:"held,omitempty"`
}

// serveHoldings answers Weights.Holdings.
func (a *Agent) serveHoldings(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
	var req holdingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &coordinator.Error{Code: http.StatusBadRequest, Msg: "malformed holdings request"}
	}
	var out holdingsResponse
	if raw, ok := a.files.manifest(req.FileSHA); ok {
		out.Manifest = raw
	} else if a.shards != nil {
		if raw, ok := a.shards.Manifest(req.FileSHA); ok {
			out.Manifest = raw
		}
	}
	if lf, ok := a.files.get(req.FileSHA); ok {
		out.Held = []shard.Range{{Off: 0, N: lf.Size}}
	} else if a.shards != nil {
		if hr, ok := a.shards.Holdings(req.FileSHA); ok {
			out.Held = hr.Ranges()
		}
	}
	return out, nil
}

func (p peers) Holdings(ctx context.Context, addr, sha string) ([]byte, []shard.Range, error) {
	var resp holdingsResponse
	if err := transport.Call(ctx, p.ep, addr, transport.KindRPC, methodHoldings, holdingsRequest{FileSHA: sha}, &resp); err != nil {
		return nil, nil, err
	}
	var raw []byte
	if len(resp.Manifest) > 0 {
		raw = []byte(resp.Manifest)
	}
	return raw, resp.Held, nil
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
