package dashboard

import (
	"slices"
	"strings"
	"sync"
	"time"

	"shoal/api/openai"
)

// DefaultRecent is how many requests NewRecent(0) keeps.
const DefaultRecent = 50

// RequestRecord is one finished request as the dashboard shows it.
type RequestRecord struct {
	Seq             uint64    `json:"seq"` // 1 for the first request observed, then counting up
	Time            time.Time `json:"time"`
	Endpoint        string    `json:"endpoint"`
	Model           string    `json:"model"`
	Status          int       `json:"status"`
	Stream          bool      `json:"stream"`
	FinishReason    string    `json:"finish_reason"`
	PromptTokens    int       `json:"prompt_tokens"`
	GeneratedTokens int       `json:"generated_tokens"`
	TTFTMs          float64   `json:"ttft_ms"`
	DurationMs      float64   `json:"duration_ms"`
	// MeanInterTokenMs is the mean gap between tokens (0 with fewer than
	// two tokens).
	MeanInterTokenMs float64 `json:"mean_inter_token_ms"`
	// TokensPerSecond is the decode speed: tokens after the first over the
	// time after the first (0 with fewer than two tokens).
	TokensPerSecond float64 `json:"tokens_per_second"`
}

// Recent keeps the last requests of the OpenAI-compatible endpoint in a ring
// buffer. It is an openai.Observer; calls to /v1/models are not kept (the
// dashboard itself polls them).
type Recent struct {
	mu      sync.Mutex
	buf     []RequestRecord
	next    int // where the next record goes
	n       int // records held
	seq     uint64
	now     func() time.Time
	traffic map[string]*ModelTraffic // every request since start, by model
}

// Traffic is every request observed since start, by model (in name order).
func (r *Recent) Traffic() []ModelTraffic {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []ModelTraffic{}
	for _, t := range r.traffic {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b ModelTraffic) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// NewRecent keeps the last n requests (DefaultRecent when n <= 0).
func NewRecent(n int) *Recent {
	if n <= 0 {
		n = DefaultRecent
	}
	return &Recent{buf: make([]RequestRecord, n), now: time.Now}
}

// RequestDone implements openai.Observer.
func (r *Recent) RequestDone(rec openai.Record) {
	if rec.Endpoint == "models" {
		return
	}
	out := RequestRecord{
		Endpoint: rec.Endpoint, Model: rec.Model, Status: rec.Status, Stream: rec.Stream,
		FinishReason: rec.FinishReason, PromptTokens: rec.PromptTokens, GeneratedTokens: rec.GeneratedTokens,
		TTFTMs: ms(rec.TTFT), DurationMs: ms(rec.Duration),
	}
	if len(rec.InterToken) > 0 {
		var sum time.Duration
		for _, d := range rec.InterToken {
			sum += d
		}
		out.MeanInterTokenMs = ms(sum) / float64(len(rec.InterToken))
		if sum > 0 {
			out.TokensPerSecond = float64(len(rec.InterToken)) / sum.Seconds()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.traffic == nil {
		r.traffic = map[string]*ModelTraffic{}
	}
	t := r.traffic[rec.Model]
	if t == nil {
		t = &ModelTraffic{Model: rec.Model}
		r.traffic[rec.Model] = t
	}
	t.add(out, len(rec.InterToken))
	r.seq++
	out.Seq = r.seq
	out.Time = r.now().UTC()
	r.buf[r.next] = out
	r.next = (r.next + 1) % len(r.buf)
	if r.n < len(r.buf) {
		r.n++
	}
}

// Records returns the kept requests, newest first.
func (r *Recent) Records() []RequestRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]RequestRecord, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// MultiObserver hands every record to each of its observers in turn (nil
// entries are skipped).
type MultiObserver []openai.Observer

// RequestDone implements openai.Observer.
func (m MultiObserver) RequestDone(rec openai.Record) {
	for _, o := range m {
		if o != nil {
			o.RequestDone(rec)
		}
	}
}
