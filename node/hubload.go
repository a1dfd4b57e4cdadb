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
// downloads the whole file, and the hub serves each byte about once. The
// agent that loads it resolves the reference (one GGUF file, its size and
// LFS sha256) and reads the GGUF header with Range requests: the profile
// the planner needs and the tensor table. It records the model with the
// LFS sha256 as its Digest and an unverified manifest (the table, no
// sums; Model.Unverified), so the model is planned at once. Each planned
// node reads its shards' ranges from the hub (node.hubFetcher, HTTP Range
// requests, preferring nodes that already hold a range) and holds them
// without running them. Once every node holds its ranges, the loading
// agent reads the file back from them in order over the cluster's links
// (checkHubFile), checks its sha256 against the hub's and records the
// full manifest (the sha256 of every unit); each node then assembles its
// shards again from its own copy, every unit checked, and only then runs
// them. When the bytes read back do not match, the loading agent reads
// the whole file from the hub once more to tell a node's bad copy (which
// the unit checks then mend from the hub) from a hub file that does not
// match its sha256 (the model fails and its plan is released).

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

// hubBridge is the largest gap between two wanted ranges read in one Range
// request (its bytes read and dropped): a tensor-parallel member wants half
// of every row of a column-split matrix, and a request per row would be
// hundreds of thousands of requests for a large model, each a round trip to
// the hub, against reading those rows whole.
const hubBridge = 4 << 10

// FetchRanges implements shard.BatchFetcher: one Range request per run of
// ranges at most hubBridge apart.
func (h *hubFetcher) FetchRanges(ctx context.Context, sha string, ranges []shard.Range) (io.ReadCloser, error) {
	var runs []hubRun
	for _, r := range ranges {
		if r.N < 0 || r.Off < 0 {
			return nil, fmt.Errorf("bad range [%d,+%d)", r.Off, r.N)
		}
		if r.N == 0 {
			continue
		}
		if k := len(runs); k > 0 && r.Off >= runs[k-1].End() && r.Off-runs[k-1].End() <= hubBridge {
			runs[k-1].N = r.End() - runs[k-1].Off
			runs[k-1].keep = append(runs[k-1].keep, r)
			continue
		}
		runs = append(runs, hubRun{Range: r, keep: []shard.Range{r}})
	}
	return &runsReader{ctx: ctx, h: h, runs: runs}, nil
}

// hubRun is one Range request: the wanted ranges in it, in order.
type hubRun struct {
	shard.Range
	keep []shard.Range
}

// runsReader reads runs one after the other, opening each when reached,
// and returns only the wanted bytes of each.
type runsReader struct {
	ctx  context.Context
	h    *hubFetcher
	runs []hubRun
	cur  io.ReadCloser
	pos  int64 // file offset of cur's next byte
	skip []byte
}

func (r *runsReader) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			if len(r.runs) == 0 {
				return 0, io.EOF
			}
			r.cur = r.h.c.ReadRange(r.ctx, r.h.repo, r.h.rev, r.h.file, r.runs[0].Off, r.runs[0].N)
			r.pos = r.runs[0].Off
		}
		run := &r.runs[0]
		if len(run.keep) == 0 {
			r.cur.Close()
			r.cur = nil
			r.runs = r.runs[1:]
			continue
		}
		if gap := run.keep[0].Off - r.pos; gap > 0 { // bytes between wanted ranges
			if int64(len(r.skip)) < gap {
				r.skip = make([]byte, gap)
			}
			n, err := io.ReadFull(r.cur, r.skip[:gap])
			r.h.Received.Add(int64(n))
			r.pos += int64(n)
			if err != nil {
				return 0, err
			}
		}
		want := run.keep[0].End() - r.pos
		n, err := r.cur.Read(p[:min(int64(len(p)), want)])
		r.h.Received.Add(int64(n))
		r.pos += int64(n)
		if r.pos == run.keep[0].End() {
			run.keep = run.keep[1:]
		}
		if err == io.EOF && len(run.keep) > 0 {
			err = io.ErrUnexpectedEOF
		} else if err == io.EOF {
			err = nil
		}
		if n > 0 || err != nil {
			return n, err
		}
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
// it resolves the reference, reads the GGUF header, registers the model
// with an unverified manifest (it is planned and fetched at once) and
// checks the file in the background (checkHubFile).
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

	hc := *c
	hc.UserAgent += " header" // its bytes are told apart from the shards'
	prefix, gf, err := readHeader(ctx, &rangeReader{ctx: ctx, c: &hc, repo: ref.Repo, rev: req.Revision, file: fi.Path, size: fi.Size}, fi.Size)
	if err != nil {
		var ce *coordinator.Error
		if errors.As(err, &ce) || errors.Is(err, hub.ErrNotFound) || errors.Is(err, hub.ErrGated) {
			return nil, hubError(req.Hub, err)
		}
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
	if err := coordinator.CheckModelName(name); err != nil {
		return nil, badRequest("%v: give the model a name with --name", err)
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
		Disagg: req.Disagg, DisaggFailure: req.DisaggFailure, Wire: req.Wire, Profile: &prof, Pin: pin, Hub: hf, Digest: fi.SHA256,
	}
	verified := false
	if b.shardManifest != nil {
		if raw, ok := b.shardManifest(fi.SHA256); ok { // checked before by this agent
			if man, err := shard.ParseManifest(raw, shard.ManifestID(raw), fi.SHA256); err == nil && !man.Unverified {
				m.Manifest, verified = shard.ManifestID(raw), true
			}
		}
	}
	var pending []byte
	if !verified {
		if pending, err = shard.UnverifiedManifest(fi.SHA256, table, 0); err != nil {
			return nil, err
		}
		if b.keepManifest != nil {
			b.keepManifest(fi.SHA256, pending) // the nodes fetch it from here
		}
		m.Manifest, m.Unverified = shard.ManifestID(pending), true
	}
	if !verified && !b.claimHubCheck(m.Name, m.Manifest) {
		if old := cs.Models[name]; old != nil && old.Manifest == m.Manifest {
			return old, nil // loaded already, being checked: the same load again
		}
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("model %q from %s is being checked already: wait for it (shoal model ls)", name, where)}
	}
	if err := b.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m}); err != nil {
		if !verified {
			b.releaseHubCheck(m.Name)
		}
		return nil, err
	}
	b.log.Info("model registered from the hub", zap.String("model", name), zap.String("hub", m.Source), zap.Int64("bytes", fi.Size),
		zap.String("lfs_sha256", fi.SHA256), zap.Int("layers", prof.NLayer), zap.Int("header_bytes", len(prefix)), zap.Bool("verified", verified))
	if !verified {
		b.bg.Add(1)
		go b.checkHubFile(m, pending, prefix)
	}
	return &m, nil
}

// claimHubCheck notes that the check of model under manifest id runs
// here, or reports false when one already does.
func (b *admin) claimHubCheck(model, id string) bool {
	b.hubMu.Lock()
	defer b.hubMu.Unlock()
	if b.hubChecks == nil {
		b.hubChecks = map[string]string{}
	}
	if b.hubChecks[model] == id {
		return false
	}
	b.hubChecks[model] = id
	return true
}

func (b *admin) releaseHubCheck(model string) {
	b.hubMu.Lock()
	delete(b.hubChecks, model)
	b.hubMu.Unlock()
}

// resumeHubChecks starts the check of every hub model this agent loaded
// that is still unverified with no check running here (the agent stopped
// during one) and, on the leader, of those whose loading agent failed or
// left (the leader becomes their source). The unverified manifest is the one it kept, or is built
// again from the header read anew; a file whose header changed fails.
func (b *admin) resumeHubChecks(st *coordinator.State) {
	if b.hub == nil {
		return
	}
	for _, m := range st.Models {
		if !m.Unverified || m.Hub == nil || m.Status == coordinator.ModelFailed {
			continue
		}
		takeOver := false
		if m.SourceNode != b.id {
			// The loading agent is gone: the leader takes its check over.
			src := st.Nodes[m.SourceNode]
			gone := src == nil || src.Status == coordinator.StatusFailed || src.Status == coordinator.StatusLeft
			if !gone || b.srv == nil || !b.srv.IsLeader() {
				continue
			}
			takeOver = true
		}
		if !b.claimHubCheck(m.Name, m.Manifest) {
			continue
		}
		b.log.Info("resuming the check of a model from the hub", zap.String("model", m.Name), zap.String("hub", m.Source),
			zap.Bool("taken_over", takeOver), zap.String("loaded_by", m.SourceNode))
		b.bg.Add(1)
		go func(m coordinator.Model) {
			if takeOver {
				b.updateModel(m.Name, m.Manifest, func(cur *coordinator.Model) { cur.SourceNode = b.id })
				m.SourceNode = b.id
			}
			var pending []byte
			if b.shardManifest != nil {
				if raw, ok := b.shardManifest(m.Digest); ok && shard.ManifestID(raw) == m.Manifest {
					pending = raw
				}
			}
			if pending == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				c := b.hub()
				_, gf, err := readHeader(ctx, &rangeReader{ctx: ctx, c: c, repo: m.Hub.Repo, rev: m.Hub.Revision, file: m.Hub.File, size: m.Hub.Size}, m.Hub.Size)
				cancel()
				var t *shard.Table
				if err == nil {
					if t, err = shard.TableOf(gf); err == nil {
						t.FileSize = m.Hub.Size
						pending, err = shard.UnverifiedManifest(m.Digest, t, 0)
					}
				}
				switch {
				case err != nil:
					b.releaseHubCheck(m.Name) // tried again on a later pass
					b.bg.Done()
					b.log.Warn("cannot read the hub model's header to resume its check", zap.String("model", m.Name), zap.Error(err))
					return
				case shard.ManifestID(pending) != m.Manifest:
					b.failHub(m, fmt.Sprintf("%s/%s changed on the hub while it was being loaded (its header differs): load it again", m.Hub.Repo, m.Hub.File))
					b.releaseHubCheck(m.Name)
					b.bg.Done()
					return
				}
				if b.keepManifest != nil {
					b.keepManifest(m.Digest, pending)
				}
			}
			b.checkHubFile(m, pending, nil)
		}(*m)
	}
}

// rangeReader reads a hub file from its start, each Read one Range
// request for exactly the bytes asked (the hub serves no byte unread).
type rangeReader struct {
	ctx             context.Context
	c               *hub.Client
	repo, rev, file string
	size, pos       int64
}

func (r *rangeReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.size-r.pos)
	rc := r.c.ReadRange(r.ctx, r.repo, r.rev, r.file, r.pos, n)
	defer rc.Close()
	k, err := io.ReadFull(rc, p[:n])
	r.pos += int64(k)
	return k, err
}

// readHeader reads the start of r until the GGUF header and tensor table
// parse (the buffer grows by doubling from 64 KiB), returning what it read.
func readHeader(ctx context.Context, r io.Reader, size int64) ([]byte, *gguf.File, error) {
	var buf []byte
	want := int64(64 << 10)
	for {
		want = min(want, size, maxHubHeader)
		if int64(len(buf)) < want {
			more := make([]byte, want-int64(len(buf)))
			n, err := io.ReadFull(r, more)
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

// hubCheckWait bounds how long checkHubFile waits for the plan's nodes to
// hold their ranges.
const hubCheckWait = 6 * time.Hour

// checkHubFile checks a hub model registered with an unverified manifest:
// once every node of its plan holds its ranges, it reads the file back
// from them in order (the header from prefix, padding as zeros, a range
// no node holds from the hub), checks its sha256 against the hub's LFS
// sha256 and records the full manifest. When that does not match, it
// reads the whole file from the hub: a match means a node holds bad bytes
// (its unit checks will mend them); no match fails the model with both
// hashes.
func (b *admin) checkHubFile(m coordinator.Model, pending, prefix []byte) {
	defer b.bg.Done()
	defer b.releaseHubCheck(m.Name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	t0 := time.Now()
	where := m.Hub.Repo + "/" + m.Hub.File
	pendingID := shard.ManifestID(pending)
	man, err := shard.ParseManifest(pending, pendingID, m.Digest)
	if err != nil {
		b.failHub(m, fmt.Sprintf("%s: %v", where, err))
		return
	}
	holders, ok := b.awaitHubHolders(ctx, m.Name, pendingID, m.Digest)
	if !ok {
		return // unloaded, loaded again, or the agent stops
	}
	if len(prefix) > 0 {
		var lf shard.LocalFetcher
		lf.Add(m.Digest, bytes.NewReader(prefix))
		holders = append([]shard.Holder{{ID: "header", Name: "the header read at load", Held: []shard.Range{{Off: 0, N: int64(len(prefix))}}, F: &lf}}, holders...)
	}
	table := man.Table
	vc := *b.hub()
	vc.UserAgent += " verify" // its bytes are told apart from the shards'
	origin := hubOrigin(m.Hub)
	holders = append(holders, shard.Holder{ID: origin, Name: "the hub", Held: []shard.Range{{Off: 0, N: m.Hub.Size}}, F: newHubFetcher(&vc, origin), Last: true})
	r, hf := shard.FileReader(ctx, man, holders)
	sha, raw, err := shard.BuildManifestFrom(table, r, man.UnitSize)
	served, _ := hf.Served()
	how := "read back from the nodes"
	if err == nil && sha != m.Hub.SHA256 {
		b.log.Warn("the hub model's ranges read back from the nodes do not match the hub's sha256; reading the file from the hub",
			zap.String("model", m.Name), zap.String("sha256", sha), zap.String("lfs_sha256", m.Hub.SHA256))
		stream := vc.ReadRange(ctx, m.Hub.Repo, m.Hub.Revision, m.Hub.File, 0, m.Hub.Size)
		sha, raw, err = shard.BuildManifestFrom(table, stream, man.UnitSize)
		stream.Close()
		how = "read whole from the hub"
	}
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		b.failHub(m, fmt.Sprintf("checking %s on %s: %v", where, b.name, err))
		return
	case sha != m.Hub.SHA256:
		b.failHub(m, fmt.Sprintf("%s from the hub: sha256 mismatch: the %d bytes read have sha256 %s, the hub lists %s (LFS); the hub served corrupt bytes or the file changed: load it again", where, m.Hub.Size, sha, m.Hub.SHA256))
		return
	}
	if b.keepManifest != nil {
		b.keepManifest(sha, raw)
	}
	id := shard.ManifestID(raw)
	b.updateModel(m.Name, pendingID, func(cur *coordinator.Model) { cur.Manifest, cur.Unverified = id, false })
	b.log.Info("model from the hub verified", zap.String("model", m.Name), zap.String("sha256", sha), zap.String("how", how),
		zap.Any("bytes_by_holder", served), zap.Duration("took", time.Since(t0)))
}

// awaitHubHolders waits until every node of model's plan holds its ranges
// (its shards verifying) and returns them as holders, or false when the
// model no longer has the manifest pendingID or the wait ends.
func (b *admin) awaitHubHolders(ctx context.Context, model, pendingID, sha string) ([]shard.Holder, bool) {
	deadline := time.Now().Add(hubCheckWait)
	for ; time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if ctx.Err() != nil {
			return nil, false
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := b.cluster.State(sctx)
		cancel()
		if err != nil {
			continue
		}
		cur := st.Models[model]
		if cur == nil || cur.Manifest != pendingID {
			return nil, false
		}
		p := st.Plans[model]
		if p == nil || len(p.Pools) == 0 {
			continue
		}
		var holders []shard.Holder
		all := true
		for _, id := range p.Nodes() {
			n, s := st.Nodes[id], st.Shards[coordinator.ShardKey(id, model)]
			if n == nil || s == nil || s.PlanVersion != p.Version || s.State != coordinator.ShardVerifying && s.State != coordinator.ShardReady {
				all = false
				break
			}
			hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, held, err := b.peers.Holdings(hctx, n.RPCAddr, sha)
			cancel()
			if err != nil || len(held) == 0 {
				all = false
				break
			}
			holders = append(holders, shard.Holder{ID: id, Name: n.Name, Held: held, F: b.peers.Ranges(n.RPCAddr)})
		}
		if all {
			return holders, true
		}
	}
	b.log.Warn("the hub model's nodes did not all hold their ranges in time; it stays unverified", zap.String("model", model), zap.Duration("waited", hubCheckWait))
	return nil, false
}

// failHub records hub model m failed for reason (its plan is released).
func (b *admin) failHub(m coordinator.Model, reason string) {
	b.log.Warn("model from the hub failed verification", zap.String("model", m.Name), zap.String("reason", reason))
	b.updateModel(m.Name, m.Manifest, func(cur *coordinator.Model) { cur.Status, cur.Reason = coordinator.ModelFailed, reason })
}

// updateModel changes the model named name, while it still has manifest
// id, as set does, writing it back (retried: the planner may write the
// model meanwhile).
func (b *admin) updateModel(name, id string, set func(*coordinator.Model)) {
	ok := b.retryWrite(func(ctx context.Context) error {
		st, err := b.cluster.State(ctx)
		if err != nil {
			return err
		}
		cur := st.Models[name]
		if cur == nil || cur.Manifest != id {
			return nil // unloaded or loaded again
		}
		mm := *cur
		set(&mm)
		return b.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: mm})
	})
	if !ok {
		b.log.Warn("could not record the model's check", zap.String("model", name))
	}
}
