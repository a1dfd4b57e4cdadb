package shard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"shoal/placement"
)

// job is one shard the node should hold.
type job struct {
	key     string
	model   string
	spec    ShardSpec
	version uint64 // the plan version it serves (updated when a new plan keeps the spec)

	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	state     string
	err       string
	bytes     int64
	doneBytes int64
	source    string
	fetched   int64
	refetched int
	path      string // assembled shard file, empty when opened locally
	sh        *Shard
	held      *heldFile // the assembled file, opened to serve its ranges
	attempts  int
	retryAt   time.Time
	reported  string // the last report sent, to skip repeats
	// manifest is the manifest ID of the Want the job was started for;
	// unverified, that the shard was assembled under an unverified
	// manifest (its bytes are held for the file's check, never run).
	manifest   string
	unverified bool
	noRoom     bool // the last attempt failed for want of disk (NoRoomError)
	linger     bool // kept for a plan a newer one replaces (Want.Linger)
}

// reassemble reports whether j, assembled (or being assembled) under an
// unverified manifest, must be assembled again for w, whose manifest is
// another: the checked one.
func (j *job) reassemble(w Want) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.unverified && w.Manifest != "" && w.Manifest != j.manifest
}

// start loads j in the background: from the local file, or assembled from
// the source's ranges; a failure is retried by a later Reconcile after a
// back-off.
func (m *Manager) start(j *job, w Want) {
	ctx, cancel := context.WithCancel(context.Background())
	j.mu.Lock()
	j.cancel, j.done = cancel, make(chan struct{})
	// noRoom stays set while a retry runs: the planner keeps leaving the
	// node out instead of planning on it again until a try has room
	j.state, j.err, j.attempts = StateFetching, "", j.attempts+1
	j.manifest = w.Manifest
	done := j.done
	j.mu.Unlock()
	go func() {
		defer close(done)
		err := m.load(ctx, j, w)
		j.mu.Lock()
		if err != nil {
			if ctx.Err() != nil {
				j.mu.Unlock()
				return // released
			}
			j.state, j.err, j.noRoom = StateFailed, err.Error(), errors.As(err, new(*NoRoomError))
			j.retryAt = time.Now().Add(min(10*time.Second, time.Duration(j.attempts)*time.Second))
		} else {
			j.state, j.noRoom = StateReady, false
		}
		checked := err == nil && !j.unverified
		path := j.path
		j.mu.Unlock()
		if err != nil {
			m.log.Warn("shard failed", zap.String("model", j.model), zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi), zap.Error(err))
		}
		if checked {
			m.dropHolding(unverifiedKey(j.key)) // its unverified file, read again
			if path != "" {
				// Left by an agent that stopped before the file was checked.
				_ = os.Remove(strings.TrimSuffix(path, ".shard") + ".unverified.shard")
			}
		}
		m.reportModel(j.model, true)
	}()
}

// load opens the spec from the local file when the node has it, else
// assembles it from the source node's ranges, or, when the source is down
// or fails, from the ranges the live holders have between them, verified
// against the model's manifest.
func (m *Manager) load(ctx context.Context, j *job, w Want) error {
	spec := w.Spec
	if path, ok := m.cfg.Files.LocalPath(spec.FileSHA); ok {
		t0 := time.Now()
		sh, err := Open(path, spec)
		if err != nil {
			return err
		}
		j.mu.Lock()
		j.sh, j.source, j.bytes, j.doneBytes = sh, "local", sh.Bytes(), sh.Bytes()
		j.mu.Unlock()
		m.log.Info("shard ready", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
			zap.String("source", "local file"), zap.String("bytes", placement.GiB(uint64(sh.Bytes()))), zap.Duration("took", time.Since(t0)))
		return nil
	}
	src := w.Source
	var srcErr error
	switch {
	case src.Addr == "":
		srcErr = errors.New("no node with the model file is known")
	case src.Down != "":
		srcErr = fmt.Errorf("the node with the model file (%s) is %s", src.Name, src.Down)
	default:
		srcErr = m.loadFromSource(ctx, j, w)
		if srcErr == nil {
			m.keepManifest(ctx, w, []Peer{src})
			return nil
		}
	}
	if w.Origin != "" && m.cfg.Origin != nil && src.Addr == "" {
		srcErr = fmt.Errorf("no node has the model file and it is read from %s", w.Origin)
	}
	if ctx.Err() != nil || w.Manifest == "" || len(w.Holders) == 0 && w.Origin == "" {
		return srcErr
	}
	m.log.Info("fetching shard from the holders", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
		zap.NamedError("source", srcErr))
	if err := m.loadFromHolders(ctx, j, w); err != nil {
		if w.Origin != "" && m.cfg.Origin != nil {
			return fmt.Errorf("%v; from the other nodes and it: %w", srcErr, err)
		}
		return fmt.Errorf("%v; from the other nodes: %w", srcErr, err)
	}
	return nil
}

// loadFromSource assembles the shard from the ranges of the node with the
// model file, with the layout it signs.
func (m *Manager) loadFromSource(ctx context.Context, j *job, w Want) error {
	src, spec := w.Source, w.Spec
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	l, err := m.cfg.Peers.Layout(lctx, src.Addr, spec)
	cancel()
	if err != nil {
		return fmt.Errorf("layout from %s: %w", src.Name, err)
	}
	return m.assemble(ctx, j, l, m.cfg.Peers.Ranges(src.Addr), src.ID, src.Name)
}

// loadFromHolders assembles the shard from the ranges the holders serve,
// every unit checked against the manifest the cluster state names (from
// any holder: its ID is checked), with a layout built from its table.
func (m *Manager) loadFromHolders(ctx context.Context, j *job, w Want) error {
	sha := w.Spec.FileSHA
	raw, _ := m.Manifest(sha)
	if raw != nil && ManifestID(raw) != w.Manifest {
		raw = nil
	}
	var holders []Holder
	if hr, ok := m.Holdings(sha); ok { // this node's own shard files
		var lf LocalFetcher
		lf.Add(sha, hr)
		holders = append(holders, Holder{ID: "local", Name: "this node", Held: hr.Ranges(), F: &lf})
	}
	var errs []string
	for _, p := range w.Holders {
		if p.Down != "" || p.Addr == "" {
			continue
		}
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		man, held, err := m.cfg.Peers.Holdings(hctx, p.Addr, sha)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", p.Name, err))
			continue
		}
		if raw == nil && man != nil && ManifestID(man) == w.Manifest {
			raw = man
		}
		if len(held) > 0 {
			holders = append(holders, Holder{ID: p.ID, Name: p.Name, Held: held, F: m.cfg.Peers.Ranges(p.Addr)})
		}
	}
	if raw == nil {
		return fmt.Errorf("no live node has the model's manifest %.12s %v: the node that loaded the model keeps it; start that node again, or unload the model and load it again", w.Manifest, errs)
	}
	man, err := ParseManifest(raw, w.Manifest, sha)
	if err != nil {
		return err
	}
	m.saveManifest(sha, raw)
	if man.Unverified {
		j.mu.Lock()
		j.unverified = true
		j.mu.Unlock()
	}
	if w.Origin != "" && m.cfg.Origin != nil && man.Table.FileSize > 0 {
		// Last: a range some node holds is read over the LAN.
		holders = append(holders, Holder{ID: w.Origin, Name: w.Origin, Held: []Range{{0, man.Table.FileSize}}, F: m.cfg.Origin(w.Origin), Last: true})
	}
	l, err := NewLayout(man.Table, w.Spec, 0)
	if err != nil {
		return err
	}
	hf := NewHolderFetcher(man, holders)
	if err := hf.Covers(l.Ranges()); err != nil {
		return fmt.Errorf("%w (layers [%d,%d) of %d holders)", err, w.Spec.Lo, w.Spec.Hi, len(holders))
	}
	err = m.assemble(ctx, j, l, hf, "", "the holders")
	served, bad := hf.Served()
	top := ""
	for id, n := range served {
		if id == "local" || n == 0 {
			continue
		}
		if top == "" || n > served[top] || n == served[top] && id < top {
			top = id
		}
		if bad[id] > 0 {
			m.log.Warn("a holder served bytes that failed their checksum", zap.String("model", j.model), zap.String("holder", id), zap.Int("units", bad[id]))
		}
	}
	if top == "" {
		top = "local"
	}
	j.mu.Lock()
	j.source = top
	j.mu.Unlock()
	return err
}

// assemble makes j's shard file from f and opens it.
func (m *Manager) assemble(ctx context.Context, j *job, l *Layout, f RangeFetcher, srcID, srcName string) error {
	t0 := time.Now()
	spec := l.Spec
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return err
	}
	suffix := ".shard"
	j.mu.Lock()
	if j.unverified {
		suffix = ".unverified.shard" // never resumed into by the checked assembly
	}
	j.mu.Unlock()
	path := filepath.Join(m.cfg.Dir, fmt.Sprintf("%s-%s%s", safeName(j.model), l.ID()[:16], suffix))
	if err := m.roomFor(path, l.Bytes()); err != nil {
		return err
	}
	j.mu.Lock()
	j.path, j.source, j.bytes = path, srcID, l.Bytes()
	j.mu.Unlock()
	m.log.Info("fetching shard", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
		zap.String("from", srcName), zap.String("bytes", placement.GiB(uint64(l.Bytes()))), zap.Int("pieces", len(l.Pieces)))
	var lastReport time.Time
	lastLog := -1
	pr, err := Assemble(ctx, path, l, f, AssembleOptions{Progress: func(p Progress) {
		j.progress(p)
		if pct := int(100 * p.DoneBytes / max(1, p.Bytes)); pct/25 != lastLog/25 {
			lastLog = pct
			m.log.Info("shard progress", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
				zap.Int("percent", pct), zap.Int("pieces", p.Done), zap.Int("of", p.Pieces))
		}
		if time.Since(lastReport) > 500*time.Millisecond {
			lastReport = time.Now()
			m.reportModel(j.model, false)
		}
	}})
	j.progress(pr)
	if errors.Is(err, syscall.ENOSPC) {
		free, _ := m.diskFree()
		return &NoRoomError{Need: uint64(l.Bytes()), Free: free, Dir: m.cfg.Dir}
	}
	if err != nil {
		return err
	}
	sh, err := OpenFile(path)
	if err != nil {
		return err
	}
	j.mu.Lock()
	j.sh = sh
	j.mu.Unlock()
	m.log.Info("shard ready", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
		zap.String("source", srcName), zap.String("bytes", placement.GiB(uint64(pr.Bytes))),
		zap.Int("resumed_pieces", pr.Resumed), zap.Int64("fetched", pr.Fetched), zap.Int("refetched", pr.Refetched), zap.Duration("took", time.Since(t0)))
	return nil
}

// keepManifest fetches and keeps the model's manifest (from the first of
// peers that has it) so this node can hand it on with its ranges.
func (m *Manager) keepManifest(ctx context.Context, w Want, peers []Peer) {
	if w.Manifest == "" {
		return
	}
	if raw, ok := m.Manifest(w.Spec.FileSHA); ok && ManifestID(raw) == w.Manifest {
		return
	}
	for _, p := range peers {
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		raw, _, err := m.cfg.Peers.Holdings(hctx, p.Addr, w.Spec.FileSHA)
		cancel()
		if err == nil && raw != nil && ManifestID(raw) == w.Manifest {
			if _, err := ParseManifest(raw, w.Manifest, w.Spec.FileSHA); err == nil {
				m.saveManifest(w.Spec.FileSHA, raw)
				return
			}
		}
	}
	m.log.Debug("no manifest kept", zap.String("model", w.Model))
}

// manifestPath is where a model file's manifest is kept.
func (m *Manager) manifestPath(fileSHA string) string {
	return filepath.Join(m.cfg.Dir, safeName(fileSHA)+".manifest")
}

// Manifest returns the manifest of the file with sha256 fileSHA this node
// keeps (fetched with a shard), or false.
func (m *Manager) Manifest(fileSHA string) ([]byte, bool) {
	b, err := os.ReadFile(m.manifestPath(fileSHA))
	return b, err == nil
}

// KeepManifest keeps raw, the manifest of the file with sha256 fileSHA
// (built by this node), to serve it with Holdings and use it for shards.
func (m *Manager) KeepManifest(fileSHA string, raw []byte) { m.saveManifest(fileSHA, raw) }

func (m *Manager) saveManifest(fileSHA string, raw []byte) {
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return
	}
	tmp := m.manifestPath(fileSHA) + ".tmp"
	if os.WriteFile(tmp, raw, 0o600) == nil {
		_ = os.Rename(tmp, m.manifestPath(fileSHA))
	}
}

func (j *job) progress(p Progress) {
	j.mu.Lock()
	j.doneBytes, j.fetched, j.refetched = p.DoneBytes, p.Fetched, p.Refetched
	j.mu.Unlock()
}

func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	return string(b)
}

// stop cancels j's load, waits for it and unmaps the shard.
func (j *job) stop() {
	j.mu.Lock()
	cancel, done := j.cancel, j.done
	j.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.sh != nil {
		_ = j.sh.Close()
		j.sh = nil
	}
	if j.held != nil {
		j.held.close()
		j.held = nil
	}
}

// heldFile opens j's assembled file to serve its ranges, once it is ready
// (nil when it is not, or was opened from the node's own copy).
func (j *job) heldFile() *heldFile {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.held == nil && j.state == StateReady && j.path != "" && j.sh != nil {
		j.held, _ = openHeld(j.path)
	}
	return j.held
}
