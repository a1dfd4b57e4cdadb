package openai

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Record describes one finished request for an Observer.
type Record struct {
	Endpoint string // "chat.completions", "completions", "models"
	Model    string
	Status   int // HTTP status answered (200 for streams that started)
	Stream   bool
	// FinishReason is "stop", "length", "cancelled" (the client went
	// away), "error", or "" when no generation ran.
	FinishReason string
	PromptTokens int
	// GeneratedTokens counts the tokens the model produced.
	GeneratedTokens int
	// TTFT is the time from the request's arrival to its first token (0
	// when none was produced).
	TTFT time.Duration
	// InterToken holds the gaps between consecutive tokens.
	InterToken []time.Duration
	Duration   time.Duration
}

// Observer receives a Record for every request the handler answers. It is
// called on the request's goroutine and must not block.
type Observer interface {
	RequestDone(Record)
}

// PrometheusObserver records requests into Prometheus metrics.
type PrometheusObserver struct {
	ttft       prometheus.Histogram
	interToken prometheus.Histogram
	prompt     prometheus.Counter
	generated  prometheus.Counter
	requests   *prometheus.CounterVec
}

// NewPrometheusObserver registers shoal_ttft_seconds,
// shoal_inter_token_seconds, shoal_prompt_tokens_total,
// shoal_generated_tokens_total and shoal_requests_total{status} with reg.
func NewPrometheusObserver(reg prometheus.Registerer) (*PrometheusObserver, error) {
	o := &PrometheusObserver{
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_ttft_seconds",
			Help:    "Time from a request's arrival to its first generated token.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		interToken: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_inter_token_seconds",
			Help:    "Time between consecutive generated tokens of a request.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		prompt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_prompt_tokens_total",
			Help: "Prompt tokens of the requests served by the OpenAI-compatible endpoint.",
		}),
		generated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_generated_tokens_total",
			Help: "Tokens generated for the requests of the OpenAI-compatible endpoint.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_requests_total",
			Help: "Requests to the OpenAI-compatible endpoint, by HTTP status.",
		}, []string{"status"}),
	}
	for _, c := range []prometheus.Collector{o.ttft, o.interToken, o.prompt, o.generated, o.requests} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// RequestDone implements Observer.
func (o *PrometheusObserver) RequestDone(r Record) {
	o.requests.WithLabelValues(strconv.Itoa(r.Status)).Inc()
	if r.TTFT > 0 {
		o.ttft.Observe(r.TTFT.Seconds())
	}
	for _, d := range r.InterToken {
		o.interToken.Observe(d.Seconds())
	}
	if r.PromptTokens > 0 {
		o.prompt.Add(float64(r.PromptTokens))
	}
	if r.GeneratedTokens > 0 {
		o.generated.Add(float64(r.GeneratedTokens))
	}
}
