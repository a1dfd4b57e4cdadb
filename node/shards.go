package node

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

	"shoal/coordinator"
	"shoal/placement"
	"shoal/shard"
)

// shardJob is one shard this node should hold: opened from the local
// file, or assembled from a peer into the data dir and then opened.
type shardJob struct {
	key     string
	model   string
	spec    shard.ShardSpec
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
	sh        *shard.Shard
	attempts  int
	retryAt   time.Time
	reported  string // the last report sent, to skip repeats
}

// shardSet is the agent's shards by key.
type shardSet struct {
	mu   sync.Mutex
	jobs map[string]*shardJob
	// report serializes status reports, so an older one never lands after
	// a newer one.
	report sync.Mutex
}

func specKey(s shard.ShardSpec) string {
	b, _ := json.Marshal(s)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// ShardsDir is where assembled shard files live, below the data dir.
const ShardsDir = "shards"

// shardLoop reconciles the shards this node holds with the committed plans:
// on every state change (servers) or every reconcile interval.
func (a *Agent) shardLoop() {
	defer a.bg.Done()
	interval := a.cfg.Tuning.ReconcileInterval.or(2 * time.Second)
	for {
		var changed <-chan struct{}
		if a.srv != nil {
			changed = a.srv.FSM().Changed()
		}
		a.reconcileShards()
		select {
		case <-a.done:
			a.dropShards()
			return
		case <-changed:
		case <-a.dist.wake:
		case <-time.After(interval):
		}
	}
}

// desiredShard is a shard the plan gives this node.
type desiredShard struct {
	model   string
	spec    shard.ShardSpec
	version uint64
	source  *coordinator.Node // the node with the file
}

func (a *Agent) reconcileShards() {
	var st *coordinator.State
	if a.srv != nil {
		st = a.srv.FSM().State()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		st, err = a.cluster.State(ctx)
		cancel()
		if err != nil {
			return
		}
	}
	desired := map[string]desiredShard{}
	for name, m := range st.Models {
		p := st.Plans[name]
		if p == nil || m.Digest == "" {
			continue
		}
		for _, spec := range shard.SpecsFor(*p, a.id, m.Digest) {
			desired[specKey(spec)] = desiredShard{model: name, spec: spec, version: p.Version, source: st.Nodes[m.SourceNode]}
		}
	}
	now := time.Now()
	a.shards.mu.Lock()
	if a.shards.jobs == nil {
		a.shards.jobs = map[string]*shardJob{}
	}
	touched := map[string]bool{}
	for key, j := range a.shards.jobs {
		if _, ok := desired[key]; !ok {
			delete(a.shards.jobs, key)
			touched[j.model] = true
			go a.releaseShard(j)
		}
	}
	for key, d := range desired {
		j := a.shards.jobs[key]
		if j == nil {
			j = &shardJob{key: key, model: d.model, spec: d.spec}
			a.shards.jobs[key] = j
		}
		j.mu.Lock()
		j.version = d.version
		start := j.done == nil || (j.state == coordinator.ShardFailed && now.After(j.retryAt) && isClosed(j.done))
		j.mu.Unlock()
		if start {
			a.startShard(j, d)
		}
		touched[d.model] = true
	}
	a.shards.mu.Unlock()
	for model := range touched {
		a.reportModel(model, false)
	}
	a.reconcileDist(st)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (a *Agent) startShard(j *shardJob, d desiredShard) {
	ctx, cancel := context.WithCancel(context.Background())
	j.mu.Lock()
	j.cancel, j.done = cancel, make(chan struct{})
	j.state, j.err, j.attempts = coordinator.ShardFetching, "", j.attempts+1
	done := j.done
	j.mu.Unlock()
	go func() {
		defer close(done)
		err := a.loadShard(ctx, j, d)
		j.mu.Lock()
		if err != nil {
			if ctx.Err() != nil {
				j.mu.Unlock()
				return // released
			}
			j.state, j.err = coordinator.ShardFailed, err.Error()
			j.retryAt = time.Now().Add(min(10*time.Second, time.Duration(j.attempts)*time.Second))
		} else {
			j.state = coordinator.ShardReady
		}
		j.mu.Unlock()
		if err != nil {
			a.log.Warn("shard failed", zap.String("model", j.model), zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi), zap.Error(err))
		}
		a.reportModel(j.model, true)
	}()
}

// loadShard opens spec from the local file when this node has it, else
// assembles it from the source node over the weights stream.
func (a *Agent) loadShard(ctx context.Context, j *shardJob, d desiredShard) error {
	t0 := time.Now()
	spec := d.spec
	if lf, ok := a.files.get(spec.FileSHA); ok {
		sh, err := shard.Open(lf.Path, spec)
		if err != nil {
			return err
		}
		j.mu.Lock()
		j.sh, j.source, j.bytes, j.doneBytes = sh, "local", sh.Bytes(), sh.Bytes()
		j.mu.Unlock()
		a.log.Info("shard ready", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
			zap.String("source", "local file"), zap.String("bytes", placement.GiB(uint64(sh.Bytes()))), zap.Duration("took", time.Since(t0)))
		return nil
	}
	if d.source == nil || d.source.RPCAddr == "" {
		return errors.New("no node with the model file is known")
	}
	if d.source.Status != coordinator.StatusAlive {
		return fmt.Errorf("the node with the model file (%s) is %s", d.source.Name, d.source.Status)
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	l, err := fetchLayout(lctx, a.ep, d.source.RPCAddr, spec, 0)
	cancel()
	if err != nil {
		return fmt.Errorf("layout from %s: %w", d.source.Name, err)
	}
	dir := filepath.Join(a.cfg.DataDir, ShardsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.shard", safeName(j.model), l.ID()[:16]))
	j.mu.Lock()
	j.path, j.source, j.bytes = path, d.source.ID, l.Bytes()
	j.mu.Unlock()
	a.log.Info("fetching shard", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
		zap.String("from", d.source.Name), zap.String("bytes", placement.GiB(uint64(l.Bytes()))), zap.Int("pieces", len(l.Pieces)))
	f := &PeerFetcher{EP: a.ep, Addr: d.source.RPCAddr}
	var lastReport time.Time
	lastLog := -1
	pr, err := shard.Assemble(ctx, path, l, f, shard.AssembleOptions{Progress: func(p shard.Progress) {
		j.mu.Lock()
		j.doneBytes, j.fetched, j.refetched = p.DoneBytes, p.Fetched, p.Refetched
		j.mu.Unlock()
		if pct := int(100 * p.DoneBytes / max(1, p.Bytes)); pct/25 != lastLog/25 {
			lastLog = pct
			a.log.Info("shard progress", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
				zap.Int("percent", pct), zap.Int("pieces", p.Done), zap.Int("of", p.Pieces))
		}
		if time.Since(lastReport) > 500*time.Millisecond {
			lastReport = time.Now()
			a.reportModel(j.model, false)
		}
	}})
	j.mu.Lock()
	j.doneBytes, j.fetched, j.refetched = pr.DoneBytes, pr.Fetched, pr.Refetched
	j.mu.Unlock()
	if err != nil {
		return err
	}
	sh, err := shard.OpenFile(path)
	if err != nil {
		return err
	}
	j.mu.Lock()
	j.sh = sh
	j.mu.Unlock()
	a.log.Info("shard ready", zap.String("model", j.model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi),
		zap.String("source", d.source.Name), zap.String("bytes", placement.GiB(uint64(pr.Bytes))),
		zap.Int("resumed_pieces", pr.Resumed), zap.Int64("fetched", pr.Fetched), zap.Int("refetched", pr.Refetched), zap.Duration("took", time.Since(t0)))
	return nil
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

// releaseShard stops a shard the plan no longer gives this node, closes it
// and removes its assembled file.
func (a *Agent) releaseShard(j *shardJob) {
	a.dropMember(j.key)
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
	if j.path != "" {
		_ = os.Remove(j.path)
	}
	a.log.Info("released shard", zap.String("model", j.model), zap.Int("lo", j.spec.Lo), zap.Int("hi", j.spec.Hi))
}

func (a *Agent) dropShards() {
	a.closeDist()
	a.shards.mu.Lock()
	jobs := a.shards.jobs
	a.shards.jobs = nil
	a.shards.mu.Unlock()
	for _, j := range jobs {
		j.mu.Lock()
		cancel, done := j.cancel, j.done
		j.mu.Unlock()
		if cancel != nil {
			cancel()
			<-done
		}
		j.mu.Lock()
		if j.sh != nil {
			_ = j.sh.Close()
			j.sh = nil
		}
		j.mu.Unlock()
	}
}

// Shard returns an opened, verified shard of model that this node holds
// (the first by layer), for the distributed runtime.
func (a *Agent) Shard(model string) (*shard.Shard, bool) {
	a.shards.mu.Lock()
	defer a.shards.mu.Unlock()
	var best *shardJob
	for _, j := range a.shards.jobs {
		j.mu.Lock()
		ok := j.model == model && j.state == coordinator.ShardReady && j.sh != nil
		j.mu.Unlock()
		if ok && (best == nil || j.spec.Lo < best.spec.Lo) {
			best = j
		}
	}
	if best == nil {
		return nil, false
	}
	return best.sh, true
}

// reportModel sends this node's shard status for model to the leader:
// one entry per node and model, summing its shards. force sends it even
// when it did not change.
func (a *Agent) reportModel(model string, force bool) {
	a.shards.report.Lock()
	defer a.shards.report.Unlock()
	a.shards.mu.Lock()
	var jobs []*shardJob
	for _, j := range a.shards.jobs {
		if j.model == model {
			jobs = append(jobs, j)
		}
	}
	a.shards.mu.Unlock()
	if len(jobs) == 0 {
		return
	}
	sort.Slice(jobs, func(i, k int) bool { return jobs[i].spec.Lo < jobs[k].spec.Lo })
	s := coordinator.ShardStatus{Node: a.id, Model: model, Lo: jobs[0].spec.Lo, State: coordinator.ShardReady}
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
		case j.state == coordinator.ShardFailed:
			s.State, s.Error = coordinator.ShardFailed, j.err
		case j.state != coordinator.ShardReady && s.State != coordinator.ShardFailed:
			s.State = coordinator.ShardFetching
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
	s.UpdatedAt = time.Now().UTC()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := a.cluster.Apply(ctx, coordinator.ShardStatusType, coordinator.ShardStatusRequest{Shard: s}); err != nil {
		first.mu.Lock()
		first.reported = "" // send again next time
		first.mu.Unlock()
		a.log.Debug("shard status report failed", zap.String("model", model), zap.Error(err))
	}
}
