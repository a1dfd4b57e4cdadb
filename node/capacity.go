package node

import (
	"math"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/node/fingerprint"
	"shoal/node/membership"
)

// The node's compute and memory rates are measured at start, when the
// host may be busy (a node measured at 1.8 GFLOPS beside another's 47.7
// was planned around on that one figure). The agent measures them again
// in the background while it serves no request, and gossips the medians
// of the last samples once they move far enough from what it gossips: the
// leader certifies the node anew and the planner weighs it as measured.

// remeasureShift is how far (relative) a median must move from the
// gossiped figure before the cluster is told.
const remeasureShift = 0.2

// selfMeta is what this agent gossips about itself now.
func (a *Agent) selfMeta() membership.Meta {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	return a.meta
}

// selfCaps are the capacities this agent gossips now.
func (a *Agent) selfCaps() coordinator.Capabilities {
	m := a.selfMeta()
	return m.Caps()
}

// remeasureLoop takes a sample every Tuning.Remeasure (10 min), skipping
// to a minute later while requests are in flight here, and publishes the
// medians (fingerprint.Remeasure) when they moved past remeasureShift.
func (a *Agent) remeasureLoop() {
	defer a.bg.Done()
	every := a.cfg.Tuning.Remeasure.Or(10 * time.Minute)
	if every < 0 {
		return
	}
	d := a.cfg.Tuning.ProbeDuration.Or(300 * time.Millisecond)
	wait := every
	for {
		select {
		case <-a.done:
			return
		case <-time.After(wait):
		}
		if n := a.InFlight(); n > 0 {
			wait = min(every, time.Minute)
			continue
		}
		wait = every
		gflops, gbps, n := fingerprint.Remeasure(a.cfg.DataDir, a.cfg.Version, d, a.cfg.Threads)
		if n == 0 {
			return // figures pinned in the data dir: nothing to measure
		}
		a.metaMu.Lock()
		old := a.meta
		moved := shifted(old.GFLOPS, gflops) || shifted(old.GBps, gbps)
		if moved {
			a.meta.GFLOPS, a.meta.GBps = gflops, gbps
		}
		md := a.meta
		a.metaMu.Unlock()
		a.log.Debug("capacity measured again", zap.Float64("gflops", gflops), zap.Float64("mem_gb_s", gbps), zap.Int("samples", n))
		if !moved {
			continue
		}
		a.log.Info("capacity re-measured: gossiping the new figures (medians of the last samples)",
			zap.Float64("gflops_was", old.GFLOPS), zap.Float64("gflops", gflops),
			zap.Float64("mem_gb_s_was", old.GBps), zap.Float64("mem_gb_s", gbps), zap.Int("samples", n))
		if err := a.gossip.SetMeta(md); err != nil {
			a.log.Warn("gossiping the re-measured capacity", zap.Error(err))
		}
	}
}

// shifted says whether now differs from was by more than remeasureShift.
func shifted(was, now float64) bool {
	if was <= 0 {
		return now > 0
	}
	return math.Abs(now-was)/was > remeasureShift
}
