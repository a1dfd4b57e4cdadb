package shard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
	attempts  int
	retryAt   time.Time
	reported  string // the last report sent, to skip repeats
}

// start loads j in the background: from the local file, or assembled from
// the source's ranges; a failure is retried by a later Reconcile after a
// back-off.
func (m *Manager) start(j *job, w Want) {
	ctx, cancel := context.WithCancel(context.Background())
	j.mu.Lock()
	j.cancel, j.done = cancel, make(chan struct{})
	j.state, j.err, j.attempts = StateFetching, "", j.attempts+1
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
			j.state, j.err = StateFailed, err.Error()
			j.retryAt = time.Now().Add(min(10*time.Second, time.Duration(j.attempts)*time.Second))
		} else {
			j.state = StateReady
		}
		j.mu.Unlock()
		if err != nil {
			m.log.Warn("shard failed", zap.String("model", j.model), zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi), zap.Error(err))
		}
		m.reportModel(j.model, true)
	}()
}

// load opens the spec from the local file when the node has it, else
// assembles it from the source node's ranges.
func (m *Manager) load(ctx context.Context, j *job, w Want) error {
	t0 := time.Now()
	spec := w.Spec
	if path, ok := m.cfg.Files.LocalPath(spec.FileSHA); ok {
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
	if src.Addr == "" {
		return errors.New("no node with the model file is known")
	}
	if src.Down != "" {
		return fmt.Errorf("the node with the model file (%s) is %s", src.Name, src.Down)
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	l, err := m.cfg.Peers.Layout(lctx, src.Addr, spec)
	cancel()
	if err != nil {
		return fmt.Errorf("layout from %s: %w", src.Name, err)
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(m.cfg.Dir, fmt.Sprintf("%s-%s.shard", safeName(j.model), l.ID()[:16]))
	j.mu.Lock()
	j.path, j.source, j.bytes = path, src.ID, l.Bytes()
	j.mu.Unlock()
	m.log.Info("fetching shard", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
		zap.String("from", src.Name), zap.String("bytes", placement.GiB(uint64(l.Bytes()))), zap.Int("pieces", len(l.Pieces)))
	var lastReport time.Time
	lastLog := -1
	pr, err := Assemble(ctx, path, l, m.cfg.Peers.Ranges(src.Addr), AssembleOptions{Progress: func(p Progress) {
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
		zap.String("source", src.Name), zap.String("bytes", placement.GiB(uint64(pr.Bytes))),
		zap.Int("resumed_pieces", pr.Resumed), zap.Int64("fetched", pr.Fetched), zap.Int("refetched", pr.Refetched), zap.Duration("took", time.Since(t0)))
	return nil
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
}
