package dashboard_test

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestMetricsParse scrapes a serving agent's /metrics with Prometheus' own
// text parser and checks the shoal_ families and what they counted.
func TestMetricsParse(t *testing.T) {
	_, base := startAgent(t)
	gen := complete(t, base, "The quick brown fox", 12) + complete(t, base, "jumps over", 8)

	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(getText(t, base+"/metrics")))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	want := map[string]dto.MetricType{
		"shoal_ttft_seconds":           dto.MetricType_HISTOGRAM,
		"shoal_inter_token_seconds":    dto.MetricType_HISTOGRAM,
		"shoal_generated_tokens_total": dto.MetricType_COUNTER,
		"shoal_prompt_tokens_total":    dto.MetricType_COUNTER,
		"shoal_requests_total":         dto.MetricType_COUNTER,
		"shoal_queue_depth":            dto.MetricType_GAUGE,
		"shoal_running_sequences":      dto.MetricType_GAUGE,
		"shoal_kv_blocks_used":         dto.MetricType_GAUGE,
		"shoal_kv_blocks_free":         dto.MetricType_GAUGE,
		"shoal_batch_tokens":           dto.MetricType_GAUGE,
		"shoal_raft_leader":            dto.MetricType_GAUGE,
		"shoal_gossip_members":         dto.MetricType_GAUGE,
	}
	for name, typ := range want {
		f, ok := fams[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s is a %v, want %v", name, f.GetType(), typ)
		}
		if len(f.GetMetric()) == 0 {
			t.Errorf("%s has no samples", name)
		}
	}
	if t.Failed() {
		return
	}
	value := func(name string) float64 {
		m := fams[name].GetMetric()[0]
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
		return -1
	}
	if got := value("shoal_generated_tokens_total"); got != float64(gen) {
		t.Errorf("shoal_generated_tokens_total = %v, want %d (the completions' usage)", got, gen)
	}
	if value("shoal_prompt_tokens_total") <= 0 {
		t.Errorf("shoal_prompt_tokens_total = %v", value("shoal_prompt_tokens_total"))
	}
	if value("shoal_raft_leader") != 1 {
		t.Errorf("shoal_raft_leader = %v on the only server", value("shoal_raft_leader"))
	}
	if h := fams["shoal_ttft_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 2 || h.GetSampleSum() <= 0 {
		t.Errorf("shoal_ttft_seconds count %d sum %v, want 2 requests", h.GetSampleCount(), h.GetSampleSum())
	}
	var ok200 float64
	for _, m := range fams["shoal_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "status" && l.GetValue() == "200" {
				ok200 += m.GetCounter().GetValue()
			}
		}
	}
	if ok200 != 2 {
		t.Errorf(`shoal_requests_total{status="200"} = %v, want 2`, ok200)
	}
	for _, name := range []string{"shoal_queue_depth", "shoal_kv_blocks_free"} {
		m := fams[name].GetMetric()[0]
		if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "model" || m.GetLabel()[0].GetValue() != modelName {
			t.Errorf("%s labels %v, want model=%q", name, m.GetLabel(), modelName)
		}
	}
	if value("shoal_kv_blocks_free") <= 0 {
		t.Errorf("shoal_kv_blocks_free = %v", value("shoal_kv_blocks_free"))
	}
}
