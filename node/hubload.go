package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/engine/gguf"
	"shoal/hub"
	"shoal/placement"
	"shoal/shard"
)

// Loading a model by hub reference (api.LoadModelRequest.Hub): no node
// downloads the whole file to disk. The agent that loads it resolves the
// reference (one GGUF file, its size and LFS sha256), reads the file once
// from the hub as a stream — the header gives the profile the planner
// needs; the rest only passes through sha256 — and checks the file's
// sha256 against the hub's LFS sha256 while building the manifest (the
// sha256 of every unit). Only then does the model get its Digest and
// Manifest, so only then is it planned. Each planned node then reads its
// shards' ranges from the hub (node.hubFetcher, HTTP Range requests)
// through a shard.HolderFetcher that checks every unit against the
// manifest the loading agent serves, preferring nodes that already hold
// a range over the hub.

// maxHubHeader bounds the bytes read to find the end of a GGUF header.
const maxHubHeader = 256 << 20

// hubClient is the agent's hub client: Config.Hub, or one configured
// from the environment (HF_ENDPOINT, HF_TOKEN), with the agent's name in
// the User-Agent.
func (a *Agent) hubClient() *hub.Client {
	var c hub.Client
	if a.cfg.Hub != nil {
		c = *a.cfg.Hub
	} else {
		c = *hub.NewClient()
	}
	if c.UserAgent == "" {
		c.UserAgent = "shoal/" + a.cfg.Name
	}
	return &c
}

// hubOrigin is the shard.Want origin of a model read from the hub:
// REPO/FILE@REVISION (parsed back by parseHubOrigin).
func hubOrigin(h *coordinator.HubFile) string {
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

// FetchRanges implements shard.BatchFetcher: one Range request per run of
// adjacent ranges.
func (h *hubFetcher) FetchRanges(ctx context.Context, sha string, ranges []shard.Range) (io.ReadCloser, error) {
	var runs []shard.Range
	for _, r := range ranges {
		if r.N < 0 || r.Off < 0 {
			return nil, fmt.Errorf("bad range [%d,+%d)", r.Off, r.N)
		}
		if r.N == 0 {
			continue
		}
		if k := len(runs); k > 0 && runs[k-1].End() == r.Off {
			runs[k-1].N += r.N
			continue
		}
		runs = append(runs, r)
	}
	return &runsReader{ctx: ctx, h: h, runs: runs}, nil
}

// runsReader reads runs one after the other, opening each when reached.
type runsReader struct {
	ctx  context.Context
	h    *hubFetcher
	runs []shard.Range
	cur  io.ReadCloser
}

func (r *runsReader) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			if len(r.runs) == 0 {
				return 0, io.EOF
			}
			r.cur = r.h.c.ReadRange(r.ctx, r.h.repo, r.h.rev, r.h.file, r.runs[0].Off, r.runs[0].N)
			r.runs = r.runs[1:]
		}
		n, err := r.cur.Read(p)
		r.h.Received.Add(int64(n))
		if err == io.EOF {
			r.cur.Close()
			r.cur = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
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

// hubError maps a hub failure to an API error.
func hubError(ref string, err error) error {
	switch {
	case errors.Is(err, hub.ErrNotFound):
		return notFoundErr("%v", err)
	case errors.Is(err, hub.ErrGated):
		return &coordinator.Error{Code: http.StatusForbidden, Msg: err.Error()}
	}
	return &coordinator.Error{Code: http.StatusBadGateway, Msg: fmt.Sprintf("hub reference %s: %v", ref, err)}
}

// registerHubModel registers the hub file req.Hub names, read in place:
// it resolves the reference, reads the GGUF header from the start of a
// stream of the file and registers the model (hashing), then reads the
// rest of the stream in the background to check the file's sha256 and
// build its manifest (verifyHub).
func (b *admin) registerHubModel(ctx context.Context, req api.LoadModelRequest) (*coordinator.Model, error) {
	if req.Path != "" {
		return nil, badRequest("give a path or a hub reference, not both")
	}
	if req.Ctx < 0 || req.MaxSeqs < 0 || req.Queue < 0 || req.Replicas < 0 {
		return nil, badRequest("ctx %d, max-seqs %d, queue %d, replicas %d: want positive numbers (or 0 for the defaults)", req.Ctx, req.MaxSeqs, req.Queue, req.Replicas)
	}
	if req.Replicas > 1 {
		return nil, badRequest("--replicas %d: a model read from the hub has no whole copies on the nodes (each reads its own ranges); pull it (shoal pull) and load the file to keep copies", req.Replicas)
	}
	if b.hub == nil {
		return nil, badRequest("this agent cannot reach a hub")
	}
	c := b.hub()
	if _, err := hub.ParseRef(req.Hub); err != nil {
		return nil, badRequest("%v", err)
	}
	ref, fi, err := c.Resolve(ctx, req.Hub, req.Revision)
	if err != nil {
		var ce *coordinator.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		if errors.Is(err, hub.ErrNotFound) || errors.Is(err, hub.ErrGated) {
			return nil, hubError(req.Hub, err)
		}
		if strings.Contains(err.Error(), "split model") || strings.Contains(err.Error(), "ambiguous") || strings.Contains(err.Error(), "several") {
			return nil, badRequest("%v", err)
		}
		return nil, hubError(req.Hub, err)
	}
	hf := &coordinator.HubFile{Endpoint: c.Endpoint, Repo: ref.Repo, Revision: req.Revision, File: fi.Path, SHA256: fi.SHA256, Size: fi.Size}
	where := fmt.Sprintf("%s/%s", ref.Repo, fi.Path)

	// One stream of the whole file: the header now, the rest hashed in
	// the background.
	sctx, cancel := context.WithCancel(context.Background())
	vc := *c
	vc.UserAgent += " verify" // its bytes are told apart from the shards'
	stream := vc.ReadRange(sctx, ref.Repo, req.Revision, fi.Path, 0, fi.Size)
	keep := false
	defer func() {
		if !keep {
			stream.Close()
			cancel()
		}
	}()
	prefix, gf, err := readHeader(ctx, stream, fi.Size)
	if err != nil {
		return nil, badRequest("%s is not a GGUF model file shoal can read: %v", where, err)
	}
	prof, err := placement.ProfileFromGGUF(gf)
	if err != nil {
		return nil, badRequest("%s: %v", where, err)
	}
	table, err := shard.TableOf(gf)
	if err != nil {
		return nil, badRequest("%s: %v", where, err)
	}
	table.FileSize = fi.Size

	name := req.Name
	if name == "" {
		name = strings.TrimSuffix(strings.TrimSuffix(path.Base(fi.Path), ".gguf"), ".GGUF")
	}
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		return nil, badRequest("model name %q: want a name without spaces or slashes (--name)", name)
	}
	cs, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	var pin []string
	if len(req.Nodes) > 0 {
		if pin, err = nodeIDs(cs, req.Nodes); err != nil {
			return nil, err
		}
	}
	if old := cs.Models[name]; old != nil && (old.SourceNode != b.id || old.Hub == nil || *old.Hub != *hf) {
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("a model named %q is already loaded from %s: unload it first or pick another --name", name, old.Source)}
	}
	m := coordinator.Model{
		Name: name, Source: hubOrigin(hf), Layers: prof.NLayer, Bytes: uint64(fi.Size), CreatedAt: time.Now().UTC(),
		SourceNode: b.id, Replicas: 1, Ctx: req.Ctx, MaxSeqs: req.MaxSeqs, Queue: req.Queue, Overhead: req.Overhead, Strategy: req.Strategy,
		Disagg: req.Disagg, DisaggFailure: req.DisaggFailure, Wire: req.Wire, Profile: &prof, Status: coordinator.ModelHashing, Pin: pin, Hub: hf,
	}
	if b.shardManifest != nil {
		if raw, ok := b.shardManifest(fi.SHA256); ok { // verified before by this agent
			m.Digest, m.Manifest, m.Status = fi.SHA256, shard.ManifestID(raw), ""
		}
	}
	if err := b.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m}); err != nil {
		return nil, err
	}
	b.log.Info("model registered from the hub", zap.String("model", name), zap.String("hub", m.Source), zap.Int64("bytes", fi.Size),
		zap.String("lfs_sha256", fi.SHA256), zap.Int("layers", prof.NLayer), zap.Bool("verified", m.Digest != ""))
	if m.Digest == "" {
		keep = true
		b.bg.Add(1)
		go func() {
			select {
			case <-b.done:
				cancel()
			case <-sctx.Done():
			}
		}()
		go func() {
			defer cancel()
			b.verifyHub(m, table, prefix, stream)
		}()
	}
	return &m, nil
}

// readHeader reads the start of stream until the GGUF header and tensor
// table parse (the buffer grows by doubling), returning what it read.
func readHeader(ctx context.Context, stream io.Reader, size int64) ([]byte, *gguf.File, error) {
	var buf []byte
	want := int64(256 << 10)
	for {
		want = min(want, size, maxHubHeader)
		if int64(len(buf)) < want {
			more := make([]byte, want-int64(len(buf)))
			n, err := io.ReadFull(stream, more)
			buf = append(buf, more[:n]...)
			if err != nil && int64(len(buf)) < want {
				return nil, nil, err
			}
		}
		f, err := gguf.ParseTable(buf, size)
		if err == nil {
			return buf, f, nil
		}
		if int64(len(buf)) >= size || int64(len(buf)) >= maxHubHeader {
			return nil, nil, err
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		want *= 2
	}
}

// verifyHub reads the rest of a hub model's file, checks its sha256
// against the hub's LFS sha256 and builds its manifest, then records the
// digest and the manifest (which lets the leader plan the model), or the
// model failed with the two hashes.
func (b *admin) verifyHub(m coordinator.Model, table *shard.Table, prefix []byte, stream io.ReadCloser) {
	defer b.bg.Done()
	defer stream.Close()
	t0 := time.Now()
	where := m.Hub.Repo + "/" + m.Hub.File
	sha, raw, err := shard.BuildManifestFrom(table, io.MultiReader(bytes.NewReader(prefix), stream), 0)
	switch {
	case err != nil:
		m.Status, m.Reason = coordinator.ModelFailed, fmt.Sprintf("reading %s from the hub on %s: %v", where, b.name, err)
	case sha != m.Hub.SHA256:
		m.Status, m.Reason = coordinator.ModelFailed, fmt.Sprintf("%s from the hub: sha256 mismatch: the %d bytes read have sha256 %s, the hub lists %s (LFS); the hub served corrupt bytes or the file changed: load it again", where, m.Hub.Size, sha, m.Hub.SHA256)
	default:
		if b.keepManifest != nil {
			b.keepManifest(sha, raw)
		}
		m.Digest, m.Manifest, m.Status = sha, shard.ManifestID(raw), ""
	}
	if m.Status == coordinator.ModelFailed {
		b.log.Warn("model from the hub failed verification", zap.String("model", m.Name), zap.String("reason", m.Reason))
	} else {
		b.log.Info("model from the hub verified", zap.String("model", m.Name), zap.String("sha256", sha), zap.Duration("took", time.Since(t0)))
	}
	b.recordModel(m)
}
