package shard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/engine/gguf"
)

// Shard states, as a Status reports them.
const (
	StateFetching = "fetching"
	StateReady    = "ready"
	StateFailed   = "failed"
	// StateVerifying: assembled under an unverified manifest; held and
	// served to peers (the file's check reads them), never run.
	StateVerifying = "verifying"
)

// unverifiedKey is the holding key of a job's unverified file, kept
// while the shard is assembled again under the checked manifest.
func unverifiedKey(key string) string { return key + "~unverified" }

// Want is a shard the node should hold: Spec of Model for plan Version,
// from the node Source when this node has no copy of the file.
type Want struct {
	Model   string
	Spec    ShardSpec
	Version uint64
	Source  Peer
	// Manifest is the ID of the file's manifest recorded in the cluster
	// state (empty for a model loaded before manifests): with it the shard
	// is assembled from Holders, the other nodes that may hold the ranges,
	// when Source is down or fails.
	Manifest string
	Holders  []Peer
	// Origin, when set, names where the file's bytes can be read when no
	// node has the file (a hub file, opaque here): ManagerConfig.Origin
	// turns it into a RangeFetcher holding the whole file, ranked after
	// the holders and verified against the manifest like them.
	Origin string
	// Linger keeps the shard of a plan a newer one replaces while the
	// newer one loads (make-before-break: the driver's session over the
	// old plan serves until it moves): a job that exists is kept as it
	// is, none is started, and it is left out of the model's reports.
	Linger bool
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
	// Holdings asks the node at addr for the manifest of the file (nil
	// when it has none) and the ranges of it that it serves.
	Holdings(ctx context.Context, addr, fileSHA string) (manifest []byte, held []Range, err error)
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
	// NoRoom: a shard failed for want of disk on this node.
	NoRoom bool
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
	// HoldFor is how long the file of a shard no longer wanted is kept to
	// serve its ranges to peers (re-planned nodes fetch from it) before
	// it is removed (10 minutes if 0).
	HoldFor time.Duration
	// Fetching reports whether a node may still read model's ranges from
	// the holders: a plan of it is not loaded on every node yet. A held
	// file of a model nobody fetches is removed after HoldGrace, not
	// HoldFor (nil: held files last HoldFor).
	Fetching  func(model string) bool
	HoldGrace time.Duration // 20 s if 0
	// OrphanAge is how old an assembled file no job or holding claims
	// must be to be removed (30 s if 0); Dir is swept every OrphanAge/2.
	OrphanAge time.Duration
	// DiskFree reports a folder's free disk (nil, or false: unknown; a
	// shard is then written until the disk says no).
	DiskFree func(dir string) (uint64, bool)
	Log      *zap.Logger
	// Origin reads the file of a Want with an Origin (nil: none).
	Origin func(origin string) RangeFetcher
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

	hmu      sync.Mutex
	holdings map[string]*holding // files of released shards, by key
	swept    time.Time           // when Dir was last swept of orphaned files

	// readers caches the last HeldReader of each file with the held files
	// it was built from: a tensor-parallel shard holds one segment per row
	// of a split matrix, and peers ask for ranges one unit at a time.
	rmu     sync.Mutex
	readers map[string]cachedReader
}

type cachedReader struct {
	files []*heldFile
	r     *HeldReader
}

// holding is the file of a shard no longer wanted, kept to serve its
// ranges until it expires.
type holding struct {
	model string
	since time.Time
	path  string
	held  *heldFile
	until time.Time
}

// NewManager makes a manager holding no shards.
func NewManager(cfg ManagerConfig) *Manager {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.BeforeRelease == nil {
		cfg.BeforeRelease = func(string) {}
	}
	if cfg.HoldFor <= 0 {
		cfg.HoldFor = 10 * time.Minute
	}
	if cfg.HoldGrace <= 0 {
		cfg.HoldGrace = 20 * time.Second
	}
	if cfg.OrphanAge <= 0 {
		cfg.OrphanAge = 30 * time.Second
	}
	return &Manager{cfg: cfg, log: cfg.Log, jobs: map[string]*job{}, holdings: map[string]*holding{}}
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
		if !w.Linger {
			desired[Key(w.Spec)] = w
		}
	}
	linger := map[string]bool{}
	for _, w := range want {
		if _, cur := desired[Key(w.Spec)]; w.Linger && !cur {
			linger[Key(w.Spec)] = true
		}
	}
	now := time.Now()
	m.mu.Lock()
	if m.jobs == nil {
		m.mu.Unlock()
		return // closed
	}
	m.expireHoldings(now, desired)
	defer m.sweepOrphans(now)
	touched := map[string]bool{}
	for key, j := range m.jobs {
		if linger[key] {
			j.mu.Lock()
			j.linger = true
			j.mu.Unlock()
			continue
		}
		if _, ok := desired[key]; !ok {
			delete(m.jobs, key)
			touched[j.model] = true
			held := m.hold(j) // before the shards wanted now start: they may need its ranges
			go m.release(j, held)
		}
	}
	for key, w := range desired {
		j := m.jobs[key]
		if j != nil && j.reassemble(w) {
			// Assembled under an unverified manifest that the checked one
			// replaced: assembled again, its old file (kept a while) the
			// first holder, every unit checked.
			held := m.holdAs(j, unverifiedKey(key))
			go func(old *job) { // stop waits for a load that may report (taking m.mu)
				old.stop()
				old.mu.Lock()
				path := old.path
				old.mu.Unlock()
				if !held && path != "" {
					_ = os.Remove(path)
				}
			}(j)
			m.log.Info("assembling the shard again under the checked manifest", zap.String("model", j.model),
				zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi), zap.Bool("from_own_copy", held))
			j = nil
		}
		if j == nil {
			j = &job{key: key, model: w.Model, spec: w.Spec}
			m.jobs[key] = j
		}
		j.mu.Lock()
		j.version, j.linger = w.Version, false
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

// hold keeps the complete assembled file of j, a shard no longer wanted,
// for HoldFor to serve its ranges; it reports whether it did.
func (m *Manager) hold(j *job) bool { return m.holdAs(j, j.key) }

// holdAs is hold under the holding key key.
func (m *Manager) holdAs(j *job, key string) bool {
	j.mu.Lock()
	path, ready := j.path, j.state == StateReady
	j.mu.Unlock()
	if path == "" || !ready {
		return false
	}
	hf, err := openHeld(path)
	if err != nil {
		return false
	}
	m.hmu.Lock()
	defer m.hmu.Unlock()
	if m.holdings == nil {
		hf.close()
		return false
	}
	if old := m.holdings[key]; old != nil {
		old.held.close()
		if old.path != path {
			_ = os.Remove(old.path)
		}
	}
	now := time.Now()
	m.holdings[key] = &holding{model: j.model, since: now, path: path, held: hf, until: now.Add(m.cfg.HoldFor)}
	return true
}

// dropHolding removes the file held under key now.
func (m *Manager) dropHolding(key string) {
	m.hmu.Lock()
	h := m.holdings[key]
	delete(m.holdings, key)
	m.hmu.Unlock()
	if h != nil {
		h.held.close()
		_ = os.Remove(h.path)
	}
}

// release stops a shard no longer wanted and removes its assembled file
// unless it is held for peers.
func (m *Manager) release(j *job, held bool) {
	m.cfg.BeforeRelease(j.key)
	j.stop()
	j.mu.Lock()
	path := j.path
	j.mu.Unlock()
	if path != "" && !held {
		_ = os.Remove(path)
	}
	m.log.Info("released shard", zap.String("model", j.model), zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi),
		zap.Bool("kept_for_peers", held))
}

// expireHoldings removes the held files past their time, and forgets (but
// keeps) those of shards wanted again, which resume from them.
func (m *Manager) expireHoldings(now time.Time, desired map[string]Want) {
	m.hmu.Lock()
	defer m.hmu.Unlock()
	for key, h := range m.holdings {
		_, again := desired[key]
		wanted := now.Before(h.until) && (m.cfg.Fetching == nil || now.Before(h.since.Add(m.cfg.HoldGrace)) || m.cfg.Fetching(h.model))
		if !again && wanted {
			continue
		}
		delete(m.holdings, key)
		h.held.close()
		if !again {
			_ = os.Remove(h.path)
		}
	}
}

// Holdings returns a reader of the ranges of the file with sha256 fileSHA
// that this node's complete shard files hold (those it runs and those kept
// after a release), or false when there are none.
func (m *Manager) Holdings(fileSHA string) (*HeldReader, bool) {
	var files []*heldFile
	m.mu.Lock()
	for _, j := range m.jobs {
		if hf := j.heldFile(); hf != nil && hf.sha == fileSHA {
			files = append(files, hf)
		}
	}
	m.mu.Unlock()
	m.hmu.Lock()
	for _, h := range m.holdings {
		if h.held.sha == fileSHA {
			files = append(files, h.held)
		}
	}
	m.hmu.Unlock()
	m.rmu.Lock()
	defer m.rmu.Unlock()
	if len(files) == 0 {
		delete(m.readers, fileSHA)
		return nil, false
	}
	if c, ok := m.readers[fileSHA]; ok && sameFiles(c.files, files) {
		return c.r, true
	}
	r := newHeldReader(files, files[0].size)
	if m.readers == nil {
		m.readers = map[string]cachedReader{}
	}
	m.readers[fileSHA] = cachedReader{files, r}
	return r, true
}

// sameFiles reports whether a and b hold the same files in any order.
func sameFiles(a, b []*heldFile) bool {
	if len(a) != len(b) {
		return false
	}
	for _, f := range b {
		if !slices.Contains(a, f) {
			return false
		}
	}
	return true
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
	m.hmu.Lock()
	for _, h := range m.holdings {
		h.held.close()
	}
	m.holdings = nil
	m.hmu.Unlock()
	m.rmu.Lock()
	m.readers = nil
	m.rmu.Unlock()
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
		if j.state == StateReady && j.sh != nil && !j.unverified {
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
	var jobs []*job
	for _, j := range m.modelJobs(model) {
		j.mu.Lock()
		if !j.linger {
			jobs = append(jobs, j)
		}
		j.mu.Unlock()
	}
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
		// A retry after a failure for want of disk still lacks the room
		// until it succeeds: the planner keeps leaving the node out.
		s.NoRoom = s.NoRoom || j.noRoom
		switch {
		case j.state == StateFailed:
			s.State, s.Error = StateFailed, j.err
		case j.state != StateReady && s.State != StateFailed:
			s.State = StateFetching
		case j.unverified && s.State == StateReady:
			s.State = StateVerifying
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
