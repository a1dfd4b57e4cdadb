package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"shoal/disagg"
	"shoal/parallel"
	"shoal/serve"
)

// The agent's collector reports what its Source says at scrape time, and
// leaves out the series of parts the agent does not run.
func TestAgentCollector(t *testing.T) {
	src := Source{
		Models:          func(func(string, *serve.Scheduler, *parallel.Engine)) {},
		KVLink:          func() (disagg.LinkStats, bool) { return disagg.LinkStats{SentPayload: 7, RecvFraming: 3}, true },
		Raft:            func() (bool, bool) { return false, true },
		Gossip:          func() (int, int, bool) { return 2, 1, true },
		Build:           Build{Version: "0.9.0+abc", Protocol: 2, MinProtocol: 1, Go: "go1.26"},
		ClusterProtocol: func() (int, bool) { return 2, true },
	}
	got := gather(t, src)
	for series, v := range map[string]float64{
		`shoal_gossip_members{state="alive"}`: 2, `shoal_gossip_members{state="other"}`: 1,
		`shoal_kv_link_bytes_total{direction="sent",kind="payload"}`: 7, `shoal_kv_link_bytes_total{direction="received",kind="framing"}`: 3,
		`shoal_raft_leader`: 0, `shoal_raft_leader_known`: 1,
		`shoal_build_info{go="go1.26",min_protocol="1",protocol="2",version="0.9.0+abc"}`: 1, `shoal_cluster_protocol`: 2,
	} {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (listed %v), want %v", series, g, ok, v)
		}
	}
	src.KVLink = func() (disagg.LinkStats, bool) { return disagg.LinkStats{}, false }
	src.Gossip = func() (int, int, bool) { return 0, 0, false }
	src.ClusterProtocol = func() (int, bool) { return 0, false }
	for series := range gather(t, src) {
		if strings.HasPrefix(series, "shoal_kv_link") || strings.HasPrefix(series, "shoal_gossip") || series == "shoal_cluster_protocol" {
			t.Errorf("%s reported without a KV link or gossip", series)
		}
	}
}

// gather scrapes the agent collector of src: each series (name and
// labels, in order) and its value.
func gather(t *testing.T, src Source) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(Agent(src))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"=\""+l.GetValue()+"\"")
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[name] = v
		}
	}
	return out
}
