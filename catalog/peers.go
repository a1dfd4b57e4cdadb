package catalog

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"

	"shoal/coordinator"
	"shoal/shard"
	"shoal/transport"
)

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

// peers reaches the nodes with a model file over the endpoint: the
// Weights.Layout RPC and the weights stream. It implements shard.Peers.
type peers struct{ ep *transport.Endpoint }

func (p peers) Layout(ctx context.Context, addr string, spec shard.ShardSpec) (*shard.Layout, error) {
	return fetchLayout(ctx, p.ep, addr, spec, 0)
}

func (p peers) Ranges(addr string) shard.RangeFetcher { return &PeerFetcher{EP: p.ep, Addr: addr} }

// weightSource serves the weights stream from the model files this node
// has and, for a file it has not, from the ranges its shard files hold.
type weightSource struct{ c *Catalog }

// OpenWeights implements transport.WeightSource.
func (w weightSource) OpenWeights(sha string) (io.ReaderAt, int64, bool) {
	if r, size, ok := w.c.files.OpenWeights(sha); ok {
		return r, size, true
	}
	ss := w.c.shardStore()
	if ss == nil {
		return nil, 0, false
	}
	hr, ok := ss.Holdings(sha)
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
func (c *Catalog) serveHoldings(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
	var req holdingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &coordinator.Error{Code: http.StatusBadRequest, Msg: "malformed holdings request"}
	}
	var out holdingsResponse
	ss := c.shardStore()
	if raw, ok := c.files.manifest(req.FileSHA); ok {
		out.Manifest = raw
	} else if ss != nil {
		if raw, ok := ss.Manifest(req.FileSHA); ok {
			out.Manifest = raw
		}
	}
	if lf, ok := c.files.get(req.FileSHA); ok {
		out.Held = []shard.Range{{Off: 0, N: lf.Size}}
	} else if ss != nil {
		if hr, ok := ss.Holdings(req.FileSHA); ok {
			out.Held = hr.Ranges()
		}
	}
	return out, nil
}

func (p peers) Holdings(ctx context.Context, addr, sha string) ([]byte, []shard.Range, error) {
	var resp holdingsResponse
	if err := transport.Call(ctx, p.ep, addr, transport.KindRPC, MethodHoldings, holdingsRequest{FileSHA: sha}, &resp); err != nil {
		return nil, nil, err
	}
	var raw []byte
	if len(resp.Manifest) > 0 {
		raw = []byte(resp.Manifest)
	}
	return raw, resp.Held, nil
}
