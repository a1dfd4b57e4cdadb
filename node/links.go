package node

import (
	"context"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
)

// linkProbeBulk is what one link probe pushes to measure bandwidth.
const linkProbeBulk = 1 << 20

// linkLoop measures the links to every live peer over the QUIC endpoint
// (transport.Endpoint.Probe: median ping round trip, time to push 1 MiB)
// and records them in the cluster state, where the planner reads them as
// the link matrix. A peer is measured within a few seconds of being seen
// alive, then again every Tuning.LinkProbe.
func (a *Agent) linkLoop() {
	defer a.bg.Done()
	every := a.cfg.Tuning.LinkProbe.or(time.Minute)
	tick := min(every, 3*time.Second)
	measured := map[string]time.Time{} // peer ID -> when its link was last recorded
	for {
		select {
		case <-a.done:
			return
		case <-time.After(tick):
		}
		var links []coordinator.LinkStat
		for _, m := range a.gossip.Members() {
			if m.ID == a.id || m.Status != coordinator.StatusAlive || m.RPCAddr == "" || time.Since(measured[m.ID]) < every {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			p, err := a.ep.Probe(ctx, m.RPCAddr, linkProbeBulk)
			cancel()
			if err != nil || p.Bandwidth <= 0 {
				a.log.Debug("link probe failed", zap.String("peer", m.Name), zap.Error(err))
				continue
			}
			links = append(links, coordinator.LinkStat{
				From: a.id, To: m.ID, Gbit: p.Bandwidth * 8 / 1e9,
				LatencyMs: float64(p.RTT.Microseconds()) / 2000, MeasuredAt: time.Now().UTC(),
			})
		}
		if len(links) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := a.cluster.Apply(ctx, coordinator.LinkReportType|coordinator.IgnoreUnknownTypeFlag, coordinator.LinkReportRequest{Links: links})
		cancel()
		if err != nil {
			a.log.Debug("link report failed", zap.Error(err))
			continue // measure them again next tick
		}
		for _, l := range links {
			measured[l.To] = l.MeasuredAt
		}
	}
}
