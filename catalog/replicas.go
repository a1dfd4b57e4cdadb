package catalog

import (
	"context"
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

// ReplicasDir is where the copies of model files this node keeps for the
// cluster live, below the data dir.
const ReplicasDir = "replicas"

// replicaChunk is the bytes of one weights request of a copy.
const replicaChunk = 16 << 20

// replicator keeps whole copies of model files so that a model's file is
// not on one node only: while fewer live nodes than the model's replicas
// have the file, the first eligible nodes by name (alive, not draining,
// not the source, not holding it, not out of disk) copy it from a node
// that has it, verify it against the digest and manifest the state
// records, register it with the node's files (so it serves its ranges and
// survives restarts) and report themselves holders. A copy no model has
// any more is removed.
type replicator struct {
	id   string
	dir  string
	reg  *fileRegistry
	net  shard.Peers
	log  *zap.Logger
	free func() (uint64, bool) // free disk for copies; false when unknown
	// report records this node's copy of a model's file in the state.
	report func(ctx context.Context, model string, h coordinator.ModelHolder) error
	// retry is the pause before a failed copy is tried again.
	retry time.Duration

	mu       sync.Mutex
	running  map[string]context.CancelFunc // copies under way, by file sha256
	failedAt map[string]time.Time          // the last failed copy, by file sha256
	inflight map[string]bool               // reports under way, by model
	closed   bool
	wg       sync.WaitGroup
}

func newReplicator(id, dataDir string, reg *fileRegistry, net shard.Peers, diskLimit uint64, diskFree func(string) (uint64, bool), log *zap.Logger) *replicator {
	r := &replicator{
		id: id, dir: filepath.Join(dataDir, ReplicasDir), reg: reg, net: net, log: log, retry: 10 * time.Second,
		running: map[string]context.CancelFunc{}, failedAt: map[string]time.Time{}, inflight: map[string]bool{},
	}
	r.free = func() (uint64, bool) {
		var free uint64
		ok := false
		if diskFree != nil {
			free, ok = diskFree(dataDir)
		}
		if diskLimit > 0 {
			var used uint64
			for _, lf := range reg.replicas() {
				used += uint64(lf.Size)
			}
			left := uint64(0)
			if diskLimit > used {
				left = diskLimit - used
			}
			if !ok || left < free {
				free, ok = left, true
			}
		}
		return free, ok
	}
	r.cleanDir()
	return r
}

// cleanDir removes what a copy interrupted by a stop left behind, and
// files no longer registered.
func (r *replicator) cleanDir() {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	kept := map[string]bool{}
	for _, lf := range r.reg.replicas() {
		kept[lf.Path] = true
	}
	for _, e := range ents {
		if p := filepath.Join(r.dir, e.Name()); !kept[p] && !e.IsDir() {
			_ = os.Remove(p)
		}
	}
}

// roomFor reports whether the node has the disk for a copy of size bytes
// (the size plus a tenth), and what it has.
func (r *replicator) roomFor(size uint64) (bool, uint64) {
	free, ok := r.free()
	return !ok || free >= size+size/10, free
}

// reconcile removes the copies no model has, and starts the copies this
// node should make.
func (r *replicator) reconcile(st *coordinator.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	inUse := map[string]bool{}
	for _, m := range st.Models {
		if m.Digest != "" {
			inUse[m.Digest] = true
		}
	}
	for sha, cancel := range r.running {
		if !inUse[sha] {
			cancel()
		}
	}
	for _, lf := range r.reg.replicas() {
		if inUse[lf.SHA] || st.Index < lf.Index {
			continue
		}
		if err := r.reg.remove(lf.SHA); err != nil {
			r.log.Warn("forgetting a model file copy", zap.String("path", lf.Path), zap.Error(err))
		}
		_ = os.Remove(lf.Path)
		r.reg.dropManifest(lf.SHA)
		r.log.Info("removed a model file copy no model has", zap.String("sha256", lf.SHA), zap.String("path", lf.Path))
	}
	names := make([]string, 0, len(st.Models))
	for n := range st.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		r.reconcileModel(st, st.Models[name])
	}
}

// reconcileModel reports this node's copy of m's file, or starts one when
// this node is among the first that should make it.
func (r *replicator) reconcileModel(st *coordinator.State, m *coordinator.Model) {
	if m.Digest == "" || m.Manifest == "" || m.Status == coordinator.ModelHashing || m.Status == coordinator.ModelFailed || m.SourceNode == r.id || m.Hub != nil {
		return
	}
	mine := m.Holders[r.id]
	state := ""
	if mine != nil {
		state = mine.State
	}
	if _, ok := r.reg.get(m.Digest); ok {
		if state != coordinator.HolderReady {
			r.send(m.Name, coordinator.ModelHolder{Node: r.id, Digest: m.Digest, State: coordinator.HolderReady})
		}
		return
	}
	if _, ok := r.running[m.Digest]; ok {
		return
	}
	if state == coordinator.HolderReady {
		// Recorded, but the file is gone (removed, or changed since).
		r.send(m.Name, coordinator.ModelHolder{Node: r.id, Digest: m.Digest})
		return
	}
	if state == coordinator.HolderNoRoom || !coordinator.CopyChosen(st, m, r.id) {
		return
	}
	if t, ok := r.failedAt[m.Digest]; ok && time.Since(t) < r.retry {
		return
	}
	from := coordinator.WholeHolders(st, m)
	if len(from) == 0 {
		return
	}
	if ok, free := r.roomFor(m.Bytes); !ok {
		r.log.Info("no room for a copy of a model file", zap.String("model", m.Name),
			zap.String("needs", placement.GiB(m.Bytes+m.Bytes/10)), zap.String("free", placement.GiB(free)))
		r.send(m.Name, coordinator.ModelHolder{Node: r.id, Digest: m.Digest, State: coordinator.HolderNoRoom,
			Error: fmt.Sprintf("a copy needs %s of disk, %s is free", placement.GiB(m.Bytes+m.Bytes/10), placement.GiB(free))})
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.running[m.Digest] = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := r.copyFile(ctx, *m, from, st.Index)
		r.mu.Lock()
		delete(r.running, m.Digest)
		if err != nil {
			r.failedAt[m.Digest] = time.Now()
		} else {
			delete(r.failedAt, m.Digest)
		}
		r.mu.Unlock()
	}()
}

// send reports this node's copy of model's file in the background, one
// report per model at a time (a report lost is sent again by a later
// reconcile, which sees the state unchanged).
func (r *replicator) send(model string, h coordinator.ModelHolder) {
	if r.inflight[model] {
		return
	}
	r.inflight[model] = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.reportNow(model, h)
		r.mu.Lock()
		delete(r.inflight, model)
		r.mu.Unlock()
	}()
}

func (r *replicator) reportNow(model string, h coordinator.ModelHolder) {
	h.UpdatedAt = time.Now().UTC()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.report(ctx, model, h); err != nil {
		r.log.Debug("model file copy report failed", zap.String("model", model), zap.String("state", h.State), zap.Error(err))
	}
}

// close stops the copies under way and waits for them and the reports.
func (r *replicator) close() {
	r.mu.Lock()
	r.closed = true
	for _, cancel := range r.running {
		cancel()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
