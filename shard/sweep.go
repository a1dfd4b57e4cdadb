package shard

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Files no plan uses leave the disk. A shard released by a re-plan is
// kept to serve its ranges to the nodes that now load them (HoldFor at
// the most), but only while some node of a plan of its model is still
// loading (ManagerConfig.Fetching) and for HoldGrace at least; an
// assembled file that nothing claims (left by a process that stopped, or
// by a plan that moved while it was down) is removed once it is OrphanAge
// old and no job of its model could still resume into it.
const shardSuffix = ".shard"

// sweepOrphans removes the assembled shard files in Dir that no job and no
// holding claims, at most every OrphanAge/2. A file whose model has a job
// that has not named its file yet is left alone: the job may resume into
// it (a restarted node finds its pieces there).
func (m *Manager) sweepOrphans(now time.Time) {
	m.mu.Lock()
	if m.jobs == nil || now.Sub(m.swept) < m.cfg.OrphanAge/2 {
		m.mu.Unlock()
		return
	}
	m.swept = now
	claimed := map[string]bool{}
	naming := map[string]bool{} // models with a job that has no file yet
	for _, j := range m.jobs {
		j.mu.Lock()
		if j.path != "" {
			claimed[j.path] = true
		} else if j.state != StateFailed {
			naming[safeName(j.model)] = true
		}
		j.mu.Unlock()
	}
	m.mu.Unlock()
	m.hmu.Lock()
	for _, h := range m.holdings {
		claimed[h.path] = true
	}
	m.hmu.Unlock()
	entries, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return
	}
	var freed int64
	var removed []string
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(m.cfg.Dir, name)
		if !e.Type().IsRegular() || !strings.HasSuffix(name, shardSuffix) || claimed[path] {
			continue
		}
		if i := strings.LastIndex(strings.TrimSuffix(name, ".unverified"+shardSuffix), "-"); i > 0 && naming[name[:i]] {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < m.cfg.OrphanAge {
			continue
		}
		if os.Remove(path) == nil {
			freed += info.Size()
			removed = append(removed, name)
		}
	}
	if len(removed) > 0 {
		m.log.Info("removed shard files no plan uses", zap.Strings("files", removed), zap.Int64("bytes", freed))
	}
}
