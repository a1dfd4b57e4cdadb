package node

import (
	"context"
	"time"

	"shoal/coordinator"
	"shoal/node/links"
)

// linkLoop measures the links to every live, certified peer and reports
// them into the cluster state (links.Loop), every Tuning.LinkProbe.
func (a *Agent) linkLoop() {
	defer a.bg.Done()
	links.Loop(a.done, links.Config{
		ID:          a.id,
		Every:       a.cfg.Tuning.LinkProbe.Or(time.Minute),
		Members:     a.gossip.Members,
		Certified:   a.certifiedAt,
		Probe:       a.ep.Probe,
		ProbeDirect: a.ep.ProbeDirect,
		Traffic:     a.net,
		Report: func(ctx context.Context, l []coordinator.LinkStat) error {
			return a.cluster.Apply(ctx, coordinator.LinkReportType|coordinator.IgnoreUnknownTypeFlag, coordinator.LinkReportRequest{Links: l})
		},
		Log: a.log,
	})
}
