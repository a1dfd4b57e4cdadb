package node

import (
	"context"
	"time"

	"shoal/coordinator"
	"shoal/node/links"
)

// Network telemetry modes (Config.NetTelemetry, shoal agent --net-telemetry).
const (
	NetTelemetryAuto = links.ModeAuto // eBPF where it can be loaded, else quic-go's counts
	NetTelemetryEBPF = links.ModeEBPF // eBPF or fail to start
	NetTelemetryQUIC = links.ModeQUIC // quic-go's counts only (the default of an in-process agent)
)

// linkLoop measures the links to every live, certified peer and reports
// them into the cluster state (links.Loop), every Tuning.LinkProbe.
func (a *Agent) linkLoop() {
	defer a.bg.Done()
	links.Loop(a.done, links.Config{
		ID:        a.id,
		Every:     a.cfg.Tuning.LinkProbe.or(time.Minute),
		Members:   a.gossip.Members,
		Certified: a.certifiedAt,
		Probe:     a.ep.Probe,
		Traffic:   a.net,
		Report: func(ctx context.Context, l []coordinator.LinkStat) error {
			return a.cluster.Apply(ctx, coordinator.LinkReportType|coordinator.IgnoreUnknownTypeFlag, coordinator.LinkReportRequest{Links: l})
		},
		Log: a.log,
	})
}
