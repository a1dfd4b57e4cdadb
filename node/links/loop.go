package links

import (
	"context"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/internal/version"
	"shoal/transport"
)

// Config is what the link loop needs of the agent.
type Config struct {
	ID    string        // this node's
	Every time.Duration // between probes of a link (node's Tuning.LinkProbe)
	// Members lists gossip's members; Certified tells whether the cluster
	// state registered node id, from its certificate, at QUIC address addr:
	// the peers worth measuring links to, not whatever gossip lists.
	Members   func() []coordinator.Member
	Certified func(id, addr string) bool
	// Probe measures the link to addr over the QUIC endpoint, pushing bulk
	// bytes (transport.Endpoint.Probe).
	Probe func(ctx context.Context, addr string, bulk int64) (transport.LinkProbe, error)
	// ProbeDirect measures the bandwidth of a direct link to a peer of
	// version.DirectProtocol or later (transport.Endpoint.ProbeDirect), the
	// path a tensor-parallel group's collectives take; nil: none.
	ProbeDirect func(ctx context.Context, addr string, bulk int64) (transport.LinkProbe, error)
	Traffic     *Traffic // nil: no counters
	// Report records links in the cluster state.
	Report func(ctx context.Context, links []coordinator.LinkStat) error
	Log    *zap.Logger
}

// Loop measures the links to every live peer and records them in the
// cluster state, where the planner reads them as the link matrix, until
// done is closed. A peer is probed over the QUIC endpoint (median ping
// round trip, time to push 1 MiB) within a few seconds of being seen alive,
// then every c.Every. Between probes the live traffic counts (eBPF or
// QUIC's own, see Traffic) say what the link really does: the bandwidth
// real transfers achieved, when above the probe's, and the round trip QUIC
// observes on the open connection. A link is reported again when probed,
// or when what it does moved by a step (a factor of 4; see Estimate).
func Loop(done <-chan struct{}, c Config) {
	tick := min(c.Every, 3*time.Second)
	views := map[string]View{} // by peer ID
	// Peers whose direct probe failed (a firewall that opens only UDP):
	// not tried again before then.
	directOff := map[string]time.Time{}
	for {
		select {
		case <-done:
			return
		case <-time.After(tick):
		}
		var alive []coordinator.Member
		var ips []netip.Addr
		for _, m := range c.Members() {
			if m.ID == c.ID || m.Status != coordinator.StatusAlive || m.RPCAddr == "" || !c.Certified(m.ID, m.RPCAddr) {
				continue
			}
			alive = append(alive, m)
			if ap, err := netip.ParseAddrPort(m.RPCAddr); err == nil {
				ips = append(ips, ap.Addr().Unmap())
			}
		}
		var traffic map[netip.AddrPort]PeerTraffic
		if c.Traffic != nil {
			c.Traffic.Watch(ips)
			traffic = map[netip.AddrPort]PeerTraffic{}
			for _, p := range c.Traffic.Peers() {
				traffic[p.Peer] = p
			}
		}
		now := time.Now()
		var links []coordinator.LinkStat
		for _, m := range alive {
			v := views[m.ID]
			t := Tick{From: c.ID, To: m.ID, Now: now, Every: c.Every, Counted: c.Traffic != nil}
			if ap, err := netip.ParseAddrPort(m.RPCAddr); err == nil {
				t.Traffic = traffic[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())]
			}
			for due := v.Due(now, c.Every); len(t.Probes) < due; {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				p, err := c.Probe(ctx, m.RPCAddr, ProbeBulk)
				cancel()
				if err != nil || p.Bandwidth <= 0 {
					c.Log.Debug("link probe failed", zap.String("peer", m.Name), zap.Error(err))
					break
				}
				r := Reading{Gbit: p.Bandwidth * 8 / 1e9, LatMs: float64(p.RTTMin.Microseconds()) / 2000, At: time.Now()}
				if c.ProbeDirect != nil && m.Protocol >= version.DirectProtocol && now.After(directOff[m.ID]) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					d, err := c.ProbeDirect(ctx, m.RPCAddr, ProbeBulk)
					cancel()
					if err == nil && d.Bandwidth > 0 {
						r.DirectGbit = d.Bandwidth * 8 / 1e9
					} else {
						c.Log.Debug("direct link probe failed", zap.String("peer", m.Name), zap.Error(err))
						directOff[m.ID] = now.Add(10 * c.Every)
					}
				}
				t.Probes = append(t.Probes, r)
			}
			if c.Traffic != nil {
				t.Telemetry = c.Traffic.Source()
			}
			var l coordinator.LinkStat
			var report bool
			views[m.ID], l, report = Estimate(v, t)
			if report {
				links = append(links, l)
			}
		}
		if len(links) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.Report(ctx, links)
		cancel()
		if err != nil {
			c.Log.Debug("link report failed", zap.Error(err))
			for _, l := range links {
				views[l.To] = views[l.To].Unreported() // measure it again next tick
			}
			continue
		}
		for _, l := range links {
			views[l.To] = views[l.To].Reported(l, now)
		}
	}
}
