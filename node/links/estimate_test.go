package links

import (
	"reflect"
	"testing"
	"time"

	"shoal/coordinator"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const every = time.Minute

// step is one tick of the link loop for one link: when (after t0), the
// peer's counters, the probes that succeeded, and whether the report of
// its stat (if any) fails.
type step struct {
	at          time.Duration
	tx          uint64
	probes      [][2]float64 // {gbit, latency ms}
	direct      []float64    // each probe's direct-link Gbit/s (missing: 0)
	minRTT      time.Duration
	srtt        time.Duration
	iface       string
	counted     bool // traffic counters run (eBPF or QUIC's)
	reportFails bool
}

func probes(gbit, latMs float64, n int) [][2]float64 {
	out := make([][2]float64, n)
	for i := range out {
		out[i] = [2]float64{gbit, latMs}
	}
	return out
}

// run applies steps from the zero View as the loop does, and returns the
// last step's stat and report decision with the View after it.
func run(steps []step) (View, coordinator.LinkStat, bool) {
	var v View
	var l coordinator.LinkStat
	var report bool
	for _, s := range steps {
		now := t0.Add(s.at)
		t := Tick{From: "a", To: "b", Now: now, Every: every, Counted: s.counted,
			Traffic: PeerTraffic{TxBytes: s.tx, RxBytes: s.tx / 2, MinRTT: s.minRTT, SmoothedRTT: s.srtt, Iface: s.iface}}
		if s.counted {
			t.Telemetry = "ebpf-tcx"
		}
		for i, p := range s.probes {
			r := Reading{Gbit: p[0], LatMs: p[1], At: now.Add(time.Duration(i+1) * time.Millisecond)}
			if i < len(s.direct) {
				r.DirectGbit = s.direct[i]
			}
			t.Probes = append(t.Probes, r)
		}
		v, l, report = Estimate(v, t)
		switch {
		case report && s.reportFails:
			v = v.Unreported()
		case report:
			v = v.Reported(l, now)
		}
	}
	return v, l, report
}

func TestEstimate(t *testing.T) {
	// ten probes: the first the fastest round trip, then nine slower
	var tenProbes []step
	tenProbes = append(tenProbes, step{probes: append(probes(1, 0.1, 1), probes(1, 1, 2)...)})
	for i := 1; i <= 7; i++ {
		tenProbes = append(tenProbes, step{at: time.Duration(i) * every, probes: probes(1, 2, 1)})
	}
	elevenProbes := append(append([]step{}, tenProbes...), step{at: 8 * every, probes: probes(1, 2, 1)})
	base := step{probes: probes(1, 0.5, 3), iface: "eth0"} // reported: 1 Gbit/s, 0.5 ms

	for _, tc := range []struct {
		name   string
		steps  []step
		report bool
		want   coordinator.LinkStat // the fields compared: Gbit, LatencyMs, Source, ProbeGbit, LiveGbit, RTTMs, Telemetry, Iface
	}{
		{"nothing probed yet: no stat", []step{{tx: 1 << 30}}, false, coordinator.LinkStat{}},
		{"first probes: the best bandwidth of three, the least latency",
			[]step{{probes: [][2]float64{{1, 0.5}, {3, 0.4}, {2, 0.6}}, iface: "eth0"}}, true,
			coordinator.LinkStat{Gbit: 3, LatencyMs: 0.4, Source: "probe", ProbeGbit: 3, Iface: "eth0"}},
		{"bandwidth: the best of the last three probes only",
			[]step{{probes: [][2]float64{{40, 1}, {1, 1}, {1, 1}}}, {at: every, probes: probes(2, 1, 1)}}, true,
			coordinator.LinkStat{Gbit: 2, LatencyMs: 1, Source: "probe", ProbeGbit: 2}},
		{"latency: the least of the last ten probes", tenProbes, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.1, Source: "probe", ProbeGbit: 1}},
		{"latency: the eleventh probe drops the first", elevenProbes, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 1, Source: "probe", ProbeGbit: 1}},
		{"a probe within 4x: reported (probed), the reported values kept",
			[]step{base, {at: every, probes: probes(3.9, 1.9, 1), iface: "eth0"}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 3.9, Iface: "eth0"}},
		{"live traffic at 4x the reported: held, not reported",
			[]step{base, {at: 2 * time.Second, tx: 1e9, iface: "eth0"}}, false,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1, LiveGbit: 4, Iface: "eth0"}},
		{"live traffic above 4x: traffic's rate, reported",
			[]step{base, {at: 2 * time.Second, tx: 2.5e9, iface: "eth0"}}, true,
			coordinator.LinkStat{Gbit: 10, LatencyMs: 0.5, Source: "traffic", ProbeGbit: 1, LiveGbit: 10, Iface: "eth0"}},
		{"live: the best busy tick since the last probe",
			[]step{base, {at: 2 * time.Second, tx: 2.5e9, iface: "eth0"}, {at: 4 * time.Second, tx: 2.5e9 + 5e8, iface: "eth0"}}, false,
			coordinator.LinkStat{Gbit: 10, LatencyMs: 0.5, Source: "traffic", ProbeGbit: 1, LiveGbit: 10, Iface: "eth0"}},
		{"a tick under 4 MiB sent is no rate",
			[]step{base, {at: time.Millisecond, tx: 4<<20 - 1, iface: "eth0"}}, false,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1, Iface: "eth0"}},
		{"counters that went back (a reset) are no rate",
			[]step{{probes: probes(1, 0.5, 3), tx: 1e10}, {at: 2 * time.Second, tx: 1}}, false,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1}},
		{"with counters, the probes' own bytes are not traffic",
			[]step{{probes: probes(0.01, 0.5, 3), counted: true}, {at: time.Second, tx: 7 << 20, counted: true}}, false,
			coordinator.LinkStat{Gbit: 0.01, LatencyMs: 0.5, Source: "probe", ProbeGbit: 0.01, Telemetry: "ebpf-tcx"}},
		{"without counters, the same bytes are traffic",
			[]step{{probes: probes(0.01, 0.5, 3)}, {at: time.Second, tx: 7 << 20}}, true,
			coordinator.LinkStat{Gbit: 7 << 20 * 8 / 1e9, LatencyMs: 0.5, Source: "traffic", ProbeGbit: 0.01, LiveGbit: 7 << 20 * 8 / 1e9}},
		{"a probe ends the live window",
			[]step{base, {at: 2 * time.Second, tx: 2.5e9, iface: "eth0"}, {at: every + time.Second, tx: 2.5e9, probes: probes(1, 0.5, 1), iface: "eth0"}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1, Iface: "eth0"}},
		{"QUIC's least round trip lowers the latency; its smoothed one is the RTT",
			[]step{{probes: probes(1, 0.5, 3), minRTT: 400 * time.Microsecond, srtt: 1500 * time.Microsecond}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.2, Source: "probe", ProbeGbit: 1, RTTMs: 1.5}},
		{"a longer QUIC round trip does not raise it",
			[]step{{probes: probes(1, 0.5, 3), minRTT: 2 * time.Millisecond}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1}},
		{"latency within 4x of the reported: held, not reported",
			[]step{base, {at: time.Second, minRTT: 250 * time.Microsecond, iface: "eth0"}}, false,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1, Iface: "eth0"}},
		{"latency beyond 4x: reported",
			[]step{base, {at: time.Second, minRTT: 200 * time.Microsecond, iface: "eth0"}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.1, Source: "probe", ProbeGbit: 1, Iface: "eth0"}},
		{"another interface: reported",
			[]step{base, {at: time.Second, iface: "eth1"}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1, Iface: "eth1"}},
		{"unchanged for Every (its probe failed): reported again",
			[]step{base, {at: every, iface: "eth0"}}, true,
			coordinator.LinkStat{Gbit: 1, LatencyMs: 0.5, Source: "probe", ProbeGbit: 1, Iface: "eth0"}},
		{"a failed report is no reference for the next",
			[]step{{probes: probes(1, 0.5, 3), reportFails: true}, {at: time.Second, probes: probes(3, 0.5, 1)}}, true,
			coordinator.LinkStat{Gbit: 3, LatencyMs: 0.5, Source: "probe", ProbeGbit: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, l, report := run(tc.steps)
			if report != tc.report {
				t.Errorf("report %v, want %v (%+v)", report, tc.report, l)
			}
			got := coordinator.LinkStat{Gbit: l.Gbit, LatencyMs: l.LatencyMs, Source: l.Source, ProbeGbit: l.ProbeGbit,
				LiveGbit: l.LiveGbit, RTTMs: l.RTTMs, Telemetry: l.Telemetry, Iface: l.Iface}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if l.Source != "" {
				last := tc.steps[len(tc.steps)-1]
				if l.From != "a" || l.To != "b" || !l.MeasuredAt.Equal(t0.Add(last.at)) || l.TxBytes != last.tx || l.RxBytes != last.tx/2 {
					t.Errorf("stat %+v: want a->b measured at the tick with its counters", l)
				}
			}
		})
	}
}

// TestEstimateDirect: a direct link's bandwidth is the most of the last
// three probes that measured one, reported beside the QUIC estimate, and
// moves what the planner reads only by a factor of 4 as the rest does.
func TestEstimateDirect(t *testing.T) {
	base := step{probes: probes(0.5, 0.5, 3), direct: []float64{2, 5, 3}}
	for _, tc := range []struct {
		name   string
		steps  []step
		report bool
		want   float64
	}{
		{"the most of three", []step{base}, true, 5},
		{"no direct probe: none", []step{{probes: probes(0.5, 0.5, 3)}}, true, 0},
		{"the last three only", []step{base, {at: every, probes: probes(0.5, 0.5, 3), direct: []float64{1, 1.2, 1.1}}}, true, 1.2},
		{"within 4x of the reported: kept, not reported without a probe", []step{base, {at: time.Second, probes: probes(0.5, 0.5, 1), direct: []float64{19}}}, true, 5},
		{"beyond 4x: the new value", []step{base, {at: time.Second, probes: probes(0.5, 0.5, 1), direct: []float64{25}}}, true, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, l, report := run(tc.steps)
			if report != tc.report || l.DirectGbit != tc.want {
				t.Fatalf("direct %v, report %v; want %v, %v", l.DirectGbit, report, tc.want, tc.report)
			}
			if l.Gbit != 0.5 || l.ProbeGbit != 0.5 {
				t.Fatalf("the QUIC estimate moved: %+v", l)
			}
		})
	}
}

func TestDue(t *testing.T) {
	var zero View
	v3, _, _ := run([]step{{probes: probes(1, 1, 3)}})
	v1, _, _ := run([]step{{probes: probes(1, 1, 1)}})
	failed, _, _ := run([]step{{probes: probes(1, 1, 1), reportFails: true}})
	for _, tc := range []struct {
		name string
		v    View
		at   time.Duration
		want int
	}{
		{"a link never probed: three in a row", zero, 0, 3},
		{"probed three times: none before Every", v3, every - time.Second, 0},
		{"probed three times: one after Every", v3, every + time.Second, 1},
		{"one of three probes succeeded: none before Every", v1, time.Second, 0},
		{"one of three probes succeeded: the two missing after Every", v1, every + time.Second, 2},
		{"its report failed: again at once", failed, time.Second, 2},
	} {
		if got := tc.v.Due(t0.Add(tc.at), every); got != tc.want {
			t.Errorf("%s: %d probes due, want %d", tc.name, got, tc.want)
		}
	}
}

// TestEstimateKeepsItsInput: Estimate returns a new View and leaves the
// one it was given as it was, so a caller may try it twice.
func TestEstimateKeepsItsInput(t *testing.T) {
	v, _, _ := run([]step{{probes: probes(1, 1, 3)}})
	tick := func(gbit float64) Tick {
		return Tick{From: "a", To: "b", Now: t0.Add(every), Every: every, Probes: []Reading{{Gbit: gbit, LatMs: 1, At: t0.Add(every)}}}
	}
	a, _, _ := Estimate(v, tick(5))
	aCopy := a
	aCopy.probes = append([]Reading{}, a.probes...)
	_, _, _ = Estimate(v, tick(7))
	if !reflect.DeepEqual(a, aCopy) {
		t.Fatalf("a second Estimate from the same View changed the first one's result: %+v, was %+v", a.probes, aCopy.probes)
	}
	if len(v.probes) != 3 {
		t.Fatalf("the input View changed: %+v", v.probes)
	}
}
