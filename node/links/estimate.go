package links

import (
	"slices"
	"time"

	"shoal/coordinator"
)

// ProbeBulk is what one link probe pushes to measure bandwidth.
const ProbeBulk = 1 << 20

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

// Reading is one probe of a link: the bandwidth it achieved, half its
// least round trip, and when it ended; DirectGbit the bandwidth a direct
// link achieved (0: not probed).
type Reading struct {
	Gbit, LatMs float64
	DirectGbit  float64
	At          time.Time
}

// View is what the link loop knows of the link to one peer between ticks;
// the zero View knows nothing.
type View struct {
	probes                []Reading // the latest, oldest first
	probeGbit, probeLatMs float64   // the estimate from them
	directGbit            float64   // the most of the last linkProbesBandwidth direct probes
	probedAt              time.Time
	liveGbit              float64 // the most a busy tick achieved since the last probe
	lastTx                uint64
	lastAt                time.Time
	reported              coordinator.LinkStat
	reportedAt            time.Time
}

// Tick is what one tick of the link loop learned of a link.
type Tick struct {
	From, To string        // the nodes' IDs
	Now      time.Time     // when the tick read the counters
	Every    time.Duration // between probes of a link, and between reports of one that did not move
	Traffic  PeerTraffic   // the peer's counters now (zero when none)
	Probes   []Reading     // this tick's probes, in order (as many as Due said, fewer when one failed)
	// Counted says whether traffic counters run (eBPF or QUIC's), so that
	// the probes' own bytes show in Traffic; Telemetry names them.
	Counted   bool
	Telemetry string
}

// Due is how many probes the link needs at now: none before every has
// passed since the last, one after it, and linkProbesBandwidth in a row
// while fewer have been read (a link seen for the first time, so that its
// first report is no single reading). The loop stops at the first that
// fails.
func (v View) Due(now time.Time, every time.Duration) int {
	if now.Sub(v.probedAt) < every {
		return 0
	}
	return max(1, linkProbesBandwidth-len(v.probes))
}

// Estimate is the link estimator: from what the loop knew of a link (v) and
// what this tick brought (t) it returns what it knows now, the link's stat
// and whether to report it. The stat is the probes' estimate (the most
// bandwidth of the last linkProbesBandwidth, the least latency of the last
// linkProbesLatency), or real traffic's rate where a busy tick (at least
// liveBusyBytes sent) since the last probe achieved more; QUIC's least
// round trip on the open connection lowers the latency. What the planner
// reads moves only by a factor of 4: readings within it of what was
// reported keep the reported bandwidth, latency and source. A link is
// reported when probed, when that moved, when its interface changed, and
// at least every t.Every; never before its first probe.
func Estimate(v View, t Tick) (View, coordinator.LinkStat, bool) {
	tr, now := t.Traffic, t.Now
	if !v.lastAt.IsZero() && tr.TxBytes >= v.lastTx {
		if sent := tr.TxBytes - v.lastTx; sent >= liveBusyBytes {
			v.liveGbit = max(v.liveGbit, float64(sent)*8/now.Sub(v.lastAt).Seconds()/1e9)
		}
	}
	v.lastTx, v.lastAt = tr.TxBytes, now
	if len(t.Probes) > 0 {
		v.probes = slices.Clone(v.probes) // v's caller keeps its own
	}
	for _, r := range t.Probes {
		v.probes = append(v.probes, r)
		if len(v.probes) > linkProbesLatency {
			v.probes = v.probes[1:]
		}
		v.probeGbit, v.probeLatMs, v.directGbit = 0, 0, 0
		for i, p := range v.probes {
			if i >= len(v.probes)-linkProbesBandwidth {
				v.probeGbit = max(v.probeGbit, p.Gbit)
				v.directGbit = max(v.directGbit, p.DirectGbit)
			}
			if i == 0 || p.LatMs < v.probeLatMs {
				v.probeLatMs = p.LatMs
			}
		}
		v.probedAt = r.At
		v.liveGbit = 0
		// The probe's own bytes are no real traffic.
		if t.Counted {
			v.lastTx += 2 * ProbeBulk
			if r.DirectGbit > 0 { // ProbeDirect pushes its bulk twice
				v.lastTx += 4 * ProbeBulk
			}
		}
	}
	if v.probedAt.IsZero() {
		return v, coordinator.LinkStat{}, false // nothing measured yet
	}
	l := coordinator.LinkStat{From: t.From, To: t.To, Gbit: v.probeGbit, LatencyMs: v.probeLatMs, MeasuredAt: now.UTC(),
		ProbeGbit: v.probeGbit, LiveGbit: v.liveGbit, Source: "probe", Iface: tr.Iface, TxBytes: tr.TxBytes, RxBytes: tr.RxBytes,
		DirectGbit: v.directGbit}
	if v.liveGbit > v.probeGbit {
		l.Gbit, l.Source = v.liveGbit, "traffic"
	}
	if tr.SmoothedRTT > 0 {
		l.RTTMs = float64(tr.SmoothedRTT.Microseconds()) / 1000
	}
	// The least round trip QUIC saw on the open connection is a latency
	// observed on real traffic, between probes too.
	if ms := float64(tr.MinRTT.Microseconds()) / 2000; tr.MinRTT > 0 && ms < l.LatencyMs {
		l.LatencyMs = ms
	}
	if t.Counted {
		l.Telemetry = t.Telemetry
	}
	// What the planner reads moves only by a factor of 4: readings within
	// it are noise (on a loaded host the least round trip of a few probes
	// still varies by half), and each re-plan they caused could move a
	// model's driver.
	if r := v.reported; !r.MeasuredAt.IsZero() && within(l.Gbit, r.Gbit) && within(l.LatencyMs, r.LatencyMs) {
		l.Gbit, l.LatencyMs, l.Source = r.Gbit, r.LatencyMs, r.Source
	}
	if r := v.reported; !r.MeasuredAt.IsZero() && within(l.DirectGbit, r.DirectGbit) {
		l.DirectGbit = r.DirectGbit
	}
	report := len(t.Probes) > 0 || l.Gbit != v.reported.Gbit || l.LatencyMs != v.reported.LatencyMs || l.DirectGbit != v.reported.DirectGbit || v.reported.Iface != l.Iface || now.Sub(v.reportedAt) >= t.Every
	return v, l, report
}

// Reported is v once l went into the cluster state at now.
func (v View) Reported(l coordinator.LinkStat, now time.Time) View {
	v.reported, v.reportedAt = l, now
	return v
}

// Unreported is v once its report failed: it is probed again next tick.
func (v View) Unreported() View {
	v.probedAt = time.Time{}
	return v
}

// within says whether a is within a factor of 4 of b: readings that close
// are noise on a loaded host.
func within(a, b float64) bool { return a <= 4*b && b <= 4*a }
