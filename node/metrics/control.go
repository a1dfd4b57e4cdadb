package metrics

import (
	"strings"
	"sync"
	"sync/atomic"

	gometrics "github.com/hashicorp/go-metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// Control-plane health: Raft and memberlist count their elections, leader
// changes and suspicions through go-metrics; a sink installed once per
// process keeps the counters that tell whether the control plane holds
// under load, and /metrics exports them. They count for the process (one
// agent per process outside tests).

// controlCounters are the go-metrics counters kept, by key.
var controlCounters = map[string]*atomic.Int64{
	"raft.state.candidate":                 {}, // elections this server started
	"raft.state.leader":                    {}, // times it became leader
	"raft.transition.heartbeat_timeout":    {}, // followers that lost the leader's heartbeat
	"raft.transition.leader_lease_timeout": {}, // leaders that stepped down
	"memberlist.msg.suspect":               {}, // suspicions raised or relayed
	"memberlist.msg.dead":                  {}, // members declared dead
	"memberlist.degraded.probe":            {}, // probes that needed indirect help
	"memberlist.degraded.timeout":          {}, // probes that timed out
}

var installSink sync.Once

// controlSink is a go-metrics sink that counts the keys above and drops the
// rest.
type controlSink struct{}

func (controlSink) count(key []string, val float32) {
	if c := controlCounters[strings.Join(key, ".")]; c != nil {
		c.Add(int64(val))
	}
}

func (controlSink) SetGauge([]string, float32)                              {}
func (controlSink) SetGaugeWithLabels([]string, float32, []gometrics.Label) {}
func (controlSink) EmitKey([]string, float32)                               {}
func (s controlSink) IncrCounter(key []string, val float32)                 { s.count(key, val) }
func (s controlSink) IncrCounterWithLabels(key []string, val float32, _ []gometrics.Label) {
	s.count(key, val)
}
func (controlSink) AddSample([]string, float32)                              {}
func (controlSink) AddSampleWithLabels([]string, float32, []gometrics.Label) {}

// installControlSink routes go-metrics to the control sink (once).
func installControlSink() {
	installSink.Do(func() {
		cfg := gometrics.DefaultConfig("")
		cfg.EnableHostname, cfg.EnableRuntimeMetrics, cfg.EnableServiceLabel = false, false, false
		cfg.EnableHostnameLabel, cfg.EnableTypePrefix = false, false
		_, _ = gometrics.NewGlobal(cfg, controlSink{})
	})
}

var descControl = prometheus.NewDesc("shoal_control_events_total",
	"Raft and gossip events of this process: elections started (raft.state.candidate), leaderships won, heartbeat and lease timeouts, suspicions, deaths and degraded probes of memberlist.",
	[]string{"event"}, nil)

// Control exports the counters of the process's control plane, routing
// go-metrics to them the first time it is called.
func Control() prometheus.Collector {
	installControlSink()
	return controlCollector{}
}

// controlCollector exports the counters.
type controlCollector struct{}

func (controlCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descControl }

func (controlCollector) Collect(ch chan<- prometheus.Metric) {
	for key, c := range controlCounters {
		ch <- prometheus.MustNewConstMetric(descControl, prometheus.CounterValue, float64(c.Load()), key)
	}
}
