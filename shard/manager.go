package shard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/engine/gguf"
	"shoal/placement"
)

// Shard states, as a Status reports them.
const (
	StateFetching = "fetching"
	StateReady    = "ready"
	StateFailed   = "failed"
)

// Want is a shard the node should hold: Spec of Model for plan Version,
// from the node Source when this node has no copy of the file.
type Want struct {
	Model   string
	Spec    ShardSpec
	Version uint64
	Source  Peer
}

// Peer is a node that has a model file. Down, when set, says why it cannot
// serve ranges now ("failed", "left").
type Peer struct {
	ID, Name, Addr string
	Down           string
}

// LocalFiles finds the model files this node has, by whole-file sha256.
type LocalFiles interface {
	LocalPath(fileSHA string) (string, bool)
}

// Peers reaches the nodes with a file: the signed layout of a shard, and
// the file's byte ranges (the transport's weights stream).
type Peers interface {
	Layout(ctx context.Context, addr string, spec ShardSpec) (*Layout, error)
	Ranges(addr string) RangeFetcher
}

// Status is one node's shards of one model summed up: the span of layers,
// the newest plan version, bytes present of the total and how they came.
type Status struct {
	Model                string
	Lo, Hi               int
	PlanVersion          uint64
	State, Error         string
	Bytes, Done, Fetched uint64
	Refetched            int
	Source               string // "local" or the ID of the node fetched from
}

// Ready is a shard open and verified, ready to run.
type Ready struct {
	Key     string
	Model   string
	Version uint64
	Spec    ShardSpec
	Shard   *Shard
}

// ManagerConfig wires a Manager.
type ManagerConfig struct {
	Dir   string // where assembled shard files live
	Files LocalFiles
	Peers Peers
	// Report sends a model's Status (after a change, or forced after a
	// shard finished or failed); a failed report is sent again next time.
	Report func(Status) error
	// BeforeRelease runs before a shard the node no longer wants is
	// unmapped (to stop what runs on it).
	BeforeRelease func(key string)
	Log           *zap.Logger
}

// Manager holds the node's shards: it opens them from a local file or
// assembles them from a peer's ranges, retries failures, reports progress
// and releases shards no longer wanted. It knows nothing of Raft or HTTP.
type Manager struct {
	cfg    ManagerConfig
	log    *zap.Logger
	mu     sync.Mutex
	jobs   map[string]*job
	report sync.Mutex // serializes reports, so an older one never lands after a newer one
}

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

// NewManager makes a manager holding no shards.
func NewManager(cfg ManagerConfig) *Manager {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.BeforeRelease == nil {
		cfg.BeforeRelease = func(string) {}
	}
	return &Manager{cfg: cfg, log: cfg.Log, jobs: map[string]*job{}}
}

// Key is a spec's short content key.
func Key(s ShardSpec) string {
	b, _ := json.Marshal(s)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// Reconcile starts the wanted shards the node lacks (and failed ones whose
// retry time came), releases the others and reports every model touched.
func (m *Manager) Reconcile(want []Want) {
	desired := map[string]Want{}
	for _, w := range want {
		desired[Key(w.Spec)] = w
	}
	now := time.Now()
	m.mu.Lock()
	if m.jobs == nil {
		m.mu.Unlock()
		return // closed
	}
	touched := map[string]bool{}
	for key, j := range m.jobs {
		if _, ok := desired[key]; !ok {
			delete(m.jobs, key)
			touched[j.model] = true
			go m.release(j)
		}
	}
	for key, w := range desired {
		j := m.jobs[key]
		if j == nil {
			j = &job{key: key, model: w.Model, spec: w.Spec}
			m.jobs[key] = j
		}
		j.mu.Lock()
		j.version = w.Version
		start := j.done == nil || (j.state == StateFailed && now.After(j.retryAt) && isClosed(j.done))
		j.mu.Unlock()
		if start {
			m.start(j, w)
		}
		touched[w.Model] = true
	}
	m.mu.Unlock()
	for model := range touched {
		m.reportModel(model, false)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

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

// release stops a shard no longer wanted and removes its assembled file.
func (m *Manager) release(j *job) {
	m.cfg.BeforeRelease(j.key)
	j.stop()
	j.mu.Lock()
	if j.path != "" {
		_ = os.Remove(j.path)
	}
	j.mu.Unlock()
	m.log.Info("released shard", zap.String("model", j.model), zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi))
}

// Close stops every load and unmaps every shard (assembled files stay for
// the next start); later Reconciles do nothing.
func (m *Manager) Close() {
	m.mu.Lock()
	jobs := m.jobs
	m.jobs = nil
	m.mu.Unlock()
	for _, j := range jobs {
		j.stop()
	}
}

// modelJobs lists the jobs of model, by first layer.
func (m *Manager) modelJobs(model string) []*job {
	m.mu.Lock()
	var jobs []*job
	for _, j := range m.jobs {
		if j.model == model {
			jobs = append(jobs, j)
		}
	}
	m.mu.Unlock()
	sort.Slice(jobs, func(i, k int) bool { return jobs[i].spec.Lo < jobs[k].spec.Lo })
	return jobs
}

// Ready lists the shards open and verified.
func (m *Manager) Ready() []Ready {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Ready
	for _, j := range m.jobs {
		j.mu.Lock()
		if j.state == StateReady && j.sh != nil {
			out = append(out, Ready{Key: j.key, Model: j.model, Version: j.version, Spec: j.spec, Shard: j.sh})
		}
		j.mu.Unlock()
	}
	return out
}

// Meta returns model's GGUF metadata (tokenizer, chat template): from the
// local file when the node has it, else from the header kept in an
// assembled shard file.
func (m *Manager) Meta(model string) (*gguf.File, error) {
	for _, j := range m.modelJobs(model) {
		j.mu.Lock()
		path, sha := j.path, j.spec.FileSHA
		j.mu.Unlock()
		if lp, ok := m.cfg.Files.LocalPath(sha); ok {
			return gguf.Open(lp)
		}
		if path == "" {
			continue
		}
		hdr, err := Header(path)
		if err != nil {
			return nil, err
		}
		return gguf.ParseHeader(hdr)
	}
	return nil, fmt.Errorf("no shard of %s on this node", model)
}

// reportModel sends the node's Status of model: one per node and model,
// summing its shards. force sends it even when it did not change.
func (m *Manager) reportModel(model string, force bool) {
	m.report.Lock()
	defer m.report.Unlock()
	jobs := m.modelJobs(model)
	if len(jobs) == 0 || m.cfg.Report == nil {
		return
	}
	s := Status{Model: model, Lo: jobs[0].spec.Lo, State: StateReady}
	for _, j := range jobs {
		j.mu.Lock()
		s.Hi = max(s.Hi, j.spec.Hi)
		s.PlanVersion = max(s.PlanVersion, j.version)
		s.Bytes += uint64(j.bytes)
		s.Done += uint64(j.doneBytes)
		s.Fetched += uint64(j.fetched)
		s.Refetched += j.refetched
		if s.Source == "" {
			s.Source = j.source
		}
		switch {
		case j.state == StateFailed:
			s.State, s.Error = StateFailed, j.err
		case j.state != StateReady && s.State != StateFailed:
			s.State = StateFetching
		}
		j.mu.Unlock()
	}
	sig, _ := json.Marshal(s)
	first := jobs[0]
	first.mu.Lock()
	same := first.reported == string(sig)
	first.reported = string(sig)
	first.mu.Unlock()
	if same && !force {
		return
	}
	if err := m.cfg.Report(s); err != nil {
		first.mu.Lock()
		first.reported = "" // send again next time
		first.mu.Unlock()
		m.log.Debug("shard status report failed", zap.String("model", model), zap.Error(err))
	}
}
