package node

import (
	"context"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
)

// linkProbeBulk is what one link probe pushes to measure bandwidth.
const linkProbeBulk = 1 << 20

// liveBusyBytes is what a peer must have been sent within one tick of the
// link loop for the tick's rate to count as bandwidth achieved: less says
// more about the traffic than about the link.
const liveBusyBytes = 4 << 20

// A link's estimate comes from its latest probes: the most bandwidth any
// of the last linkProbesBandwidth saw, the least latency of the last
// linkProbesLatency. A probe that ran beside other traffic or waited for
// the CPU reads a link slower than it is (on a loaded host the round trip
// swings by 10x), and a plan moved on such a reading ends the requests its
// driver runs; a link that really slowed reads slow in every probe.
const (
	linkProbesBandwidth = 3
	linkProbesLatency   = 10
)

type probeReading struct{ gbit, latMs float64 }

// linkView is what the link loop knows of the link to one peer.
type linkView struct {
	probes                []probeReading // the latest, oldest first
	probeGbit, probeLatMs float64        // the estimate from them
	probedAt              time.Time
	liveGbit              float64 // the most a busy tick achieved since the last probe
	lastTx                uint64
	lastAt                time.Time
	reported              coordinator.LinkStat
	reportedAt            time.Time
}

// linkLoop measures the links to every live peer and records them in the
// cluster state, where the planner reads them as the link matrix. A peer
// is probed over the QUIC endpoint (transport.Endpoint.Probe: median ping
// round trip, time to push 1 MiB) within a few seconds of being seen alive,
// then every Tuning.LinkProbe. Between probes the live traffic counts
// (eBPF or QUIC's own, see netTelemetry) say what the link really does:
// the bandwidth real transfers achieved, when above the probe's, and the
// round trip QUIC observes on the open connection. A link is reported
// again when probed, or when what it does moved by a step (a factor of 2).
func (a *Agent) linkLoop() {
	defer a.bg.Done()
	every := a.cfg.Tuning.LinkProbe.or(time.Minute)
	tick := min(every, 3*time.Second)
	views := map[string]*linkView{} // by peer ID
	for {
		select {
		case <-a.done:
			return
		case <-time.After(tick):
		}
		var alive []coordinator.Member
		var ips []netip.Addr
		for _, m := range a.gossip.Members() {
			if m.ID == a.id || m.Status != coordinator.StatusAlive || m.RPCAddr == "" || !a.certifiedAt(m.ID, m.RPCAddr) {
				continue
			}
			alive = append(alive, m)
			if ap, err := netip.ParseAddrPort(m.RPCAddr); err == nil {
				ips = append(ips, ap.Addr().Unmap())
			}
		}
		var traffic map[netip.AddrPort]peerTraffic
		if a.net != nil {
			a.net.watch(ips)
			traffic = map[netip.AddrPort]peerTraffic{}
			for _, p := range a.net.peers() {
				traffic[p.Peer] = p
			}
		}
		now := time.Now()
		var links []coordinator.LinkStat
		for _, m := range alive {
			v := views[m.ID]
			if v == nil {
				v = &linkView{}
				views[m.ID] = v
			}
			var tr peerTraffic
			if ap, err := netip.ParseAddrPort(m.RPCAddr); err == nil {
				tr = traffic[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())]
			}
			if !v.lastAt.IsZero() && tr.TxBytes >= v.lastTx {
				if sent := tr.TxBytes - v.lastTx; sent >= liveBusyBytes {
					v.liveGbit = max(v.liveGbit, float64(sent)*8/now.Sub(v.lastAt).Seconds()/1e9)
				}
			}
			v.lastTx, v.lastAt = tr.TxBytes, now
			probed := false
			// A link seen for the first time is probed linkProbesBandwidth
			// times in a row, so its first report is no single reading.
			for n := 0; now.Sub(v.probedAt) >= every || (n > 0 && n < linkProbesBandwidth && len(v.probes) < linkProbesBandwidth); n++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				p, err := a.ep.Probe(ctx, m.RPCAddr, linkProbeBulk)
				cancel()
				if err != nil || p.Bandwidth <= 0 {
					a.log.Debug("link probe failed", zap.String("peer", m.Name), zap.Error(err))
					break
				}
				v.probes = append(v.probes, probeReading{gbit: p.Bandwidth * 8 / 1e9, latMs: float64(p.RTTMin.Microseconds()) / 2000})
				if len(v.probes) > linkProbesLatency {
					v.probes = v.probes[1:]
				}
				v.probeGbit, v.probeLatMs = 0, 0
				for i, r := range v.probes {
					if i >= len(v.probes)-linkProbesBandwidth {
						v.probeGbit = max(v.probeGbit, r.gbit)
					}
					if i == 0 || r.latMs < v.probeLatMs {
						v.probeLatMs = r.latMs
					}
				}
				v.probedAt = time.Now()
				v.liveGbit, probed = 0, true
				// The probe's own bytes are no real traffic.
				if a.net != nil {
					v.lastTx += 2 * linkProbeBulk
				}
			}
			if v.probedAt.IsZero() {
				continue // nothing measured yet
			}
			l := coordinator.LinkStat{From: a.id, To: m.ID, Gbit: v.probeGbit, LatencyMs: v.probeLatMs, MeasuredAt: now.UTC(),
				ProbeGbit: v.probeGbit, LiveGbit: v.liveGbit, Source: "probe", Iface: tr.Iface, TxBytes: tr.TxBytes, RxBytes: tr.RxBytes}
			if v.liveGbit > v.probeGbit {
				l.Gbit, l.Source = v.liveGbit, "traffic"
			}
			if tr.SmoothedRTT > 0 {
				l.RTTMs = float64(tr.SmoothedRTT.Microseconds()) / 1000
			}
			// The least round trip QUIC saw on the open connection is a
			// latency observed on real traffic, between probes too.
			if ms := float64(tr.MinRTT.Microseconds()) / 2000; tr.MinRTT > 0 && ms < l.LatencyMs {
				l.LatencyMs = ms
			}
			if a.net != nil {
				l.Telemetry = a.net.Source()
			}
			// What the planner reads moves only by a factor of 4: readings
			// within it are noise (on a loaded host the least round trip
			// of a few probes still varies by half), and each re-plan they
			// caused could move a model's driver.
			if r := v.reported; !r.MeasuredAt.IsZero() && within(l.Gbit, r.Gbit) && within(l.LatencyMs, r.LatencyMs) {
				l.Gbit, l.LatencyMs, l.Source = r.Gbit, r.LatencyMs, r.Source
			}
			if probed || l.Gbit != v.reported.Gbit || l.LatencyMs != v.reported.LatencyMs || v.reported.Iface != l.Iface || now.Sub(v.reportedAt) >= every {
				links = append(links, l)
			}
		}
		if len(links) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := a.cluster.Apply(ctx, coordinator.LinkReportType|coordinator.IgnoreUnknownTypeFlag, coordinator.LinkReportRequest{Links: links})
		cancel()
		if err != nil {
			a.log.Debug("link report failed", zap.Error(err))
			for _, l := range links {
				views[l.To].probedAt = time.Time{} // measure it again next tick
			}
			continue
		}
		for _, l := range links {
			views[l.To].reported, views[l.To].reportedAt = l, now
		}
	}
}

// within says whether a is within a factor of 4 of b: readings that close
// are noise on a loaded host.
func within(a, b float64) bool { return a <= 4*b && b <= 4*a }
