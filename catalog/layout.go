package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"shoal/coordinator"
	"shoal/engine/gguf"
	"shoal/shard"
	"shoal/transport"
)

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
func (c *Catalog) serveLayout(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
	return c.layouts.serve(c.files, c.name, body)
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
