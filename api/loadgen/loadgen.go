package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// API is the endpoint the requests go to.
type API string

// The endpoints loadgen drives.
const (
	APIChat        API = "chat"        // POST /v1/chat/completions, one user message
	APICompletions API = "completions" // POST /v1/completions
)

func (a API) path() string {
	if a == APICompletions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// DefaultPrompt is the prompt of every request unless Options.Prompt is set.
const DefaultPrompt = "Write a long story about a shoal of fish crossing the ocean at night."

// Options configure a run.
type Options struct {
	// Endpoint is the server's base URL (the /v1 paths are appended); a
	// bare host:port means http.
	Endpoint string
	APIKey   string
	// Model to request; "" takes the first of GET /v1/models.
	Model string
	// API is chat (default) or completions.
	API    API
	Prompt string
	// MaxTokens per request (default 64).
	MaxTokens int
	// Temperature, if set, is sent; otherwise the server's default holds.
	Temperature *float64
	// IgnoreEOS sends "ignore_eos": true (vLLM and llama.cpp honour it) so
	// every request generates MaxTokens.
	IgnoreEOS bool
	// Concurrency lists the levels, run in order (default 1, 4, 16).
	Concurrency []int
	// Requests bounds the requests of each level; Duration bounds the time
	// in which a level starts new ones (requests in flight then finish).
	// With neither, a level runs max(8, 4×concurrency) requests.
	Requests int
	Duration time.Duration
	// Timeout bounds each request (default 5 min).
	Timeout time.Duration
	// Warmup requests run before the first level and are not counted
	// (default 1; negative for none).
	Warmup int
	// HTTP is the client (default: one with a connection per stream).
	HTTP *http.Client
	// OnLevel, if set, is called with each level as it finishes.
	OnLevel func(Level)
}

// Dist summarizes a distribution of durations, in milliseconds.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Level is the outcome of one concurrency level.
type Level struct {
	Concurrency int `json:"concurrency"`
	// Requests counts those that completed; Errors those that failed, by
	// kind ("HTTP 429", "timeout", "stream cut", "stream error",
	// "transport", ...).
	Requests   int            `json:"requests"`
	Errors     int            `json:"errors"`
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// FirstError is the message of the first failure, to see why.
	FirstError      string `json:"first_error,omitempty"`
	PromptTokens    int    `json:"prompt_tokens"`
	GeneratedTokens int    `json:"generated_tokens"`
	// WallSeconds runs from the level's start to its last answer.
	WallSeconds float64 `json:"wall_seconds"`
	// TokensPerSecond is the aggregate generation speed: the tokens of the
	// completed requests over the wall time.
	TokensPerSecond   float64 `json:"tokens_per_second"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	// TTFT runs from sending a request to its first text.
	TTFT Dist `json:"ttft"`
	// InterToken holds the gaps between successive streamed chunks of
	// text; a chunk carries one token unless the server held text back
	// (an incomplete UTF-8 character or a possible stop string).
	InterToken Dist `json:"inter_token"`
	// TPOT is each request's time per output token after the first:
	// (latency − TTFT) / (tokens − 1).
	TPOT Dist `json:"tpot"`
	// Latency is each request's time from sending to its last event.
	Latency Dist `json:"latency"`
	// PerStreamTokensPerSecond is the mean decode speed a single stream
	// saw (1000 / mean TPOT).
	PerStreamTokensPerSecond float64 `json:"per_stream_tokens_per_second"`
	// Finish counts the finish reasons of the completed requests.
	Finish map[string]int `json:"finish,omitempty"`
}

// Result is a whole run.
type Result struct {
	Endpoint  string    `json:"endpoint"`
	Model     string    `json:"model"`
	API       API       `json:"api"`
	Prompt    string    `json:"prompt"`
	MaxTokens int       `json:"max_tokens"`
	IgnoreEOS bool      `json:"ignore_eos,omitempty"`
	Requests  int       `json:"requests_per_level,omitempty"`
	Duration  string    `json:"duration_per_level,omitempty"`
	Started   time.Time `json:"started"`
	Levels    []Level   `json:"levels"`
}

// Bench is a prepared run.
type Bench struct {
	o    Options
	hc   *http.Client
	body []byte
}

// New checks the options and fills in the defaults.
func New(o Options) (*Bench, error) {
	if strings.TrimSpace(o.Endpoint) == "" {
		return nil, errors.New("an endpoint URL is required")
	}
	if o.API == "" {
		o.API = APIChat
	}
	if o.API != APIChat && o.API != APICompletions {
		return nil, fmt.Errorf("api %q: want chat or completions", o.API)
	}
	if o.Prompt == "" {
		o.Prompt = DefaultPrompt
	}
	if o.MaxTokens == 0 {
		o.MaxTokens = 64
	}
	if o.MaxTokens < 0 {
		return nil, fmt.Errorf("max tokens %d: want at least 1", o.MaxTokens)
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 4, 16}
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			return nil, fmt.Errorf("concurrency %d: want at least 1", c)
		}
	}
	if o.Requests < 0 || o.Duration < 0 {
		return nil, errors.New("requests and duration must not be negative")
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Warmup == 0 {
		o.Warmup = 1
	}
	b := &Bench{o: o, hc: o.HTTP}
	if b.hc == nil {
		conns := slices.Max(o.Concurrency)
		b.hc = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // streamed events must not wait in a gzip buffer
		}}
	}
	return b, nil
}

func (b *Bench) url(path string) string {
	base := strings.TrimRight(strings.TrimSpace(b.o.Endpoint), "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	base = strings.TrimSuffix(base, "/v1")
	return base + path
}

// Run measures every level in turn. It fails only when the model cannot
// be found or no request of a level succeeded; failed requests are counted
// in the levels.
func (b *Bench) Run(ctx context.Context) (*Result, error) {
	if b.o.Model == "" {
		m, err := b.firstModel(ctx)
		if err != nil {
			return nil, err
		}
		b.o.Model = m
	}
	body, err := b.o.body()
	if err != nil {
		return nil, err
	}
	b.body = body
	res := &Result{Endpoint: b.o.Endpoint, Model: b.o.Model, API: b.o.API, Prompt: b.o.Prompt, MaxTokens: b.o.MaxTokens,
		IgnoreEOS: b.o.IgnoreEOS, Requests: b.o.Requests, Started: time.Now().UTC()}
	if b.o.Duration > 0 {
		res.Duration = b.o.Duration.String()
	}
	for range max(b.o.Warmup, 0) {
		if s := b.stream(ctx); s.err != nil {
			return res, fmt.Errorf("warm-up request to %s: %w", b.url(b.o.API.path()), s.err)
		}
	}
	for _, c := range b.o.Concurrency {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		l := b.level(ctx, c)
		res.Levels = append(res.Levels, l)
		if b.o.OnLevel != nil {
			b.o.OnLevel(l)
		}
		if l.Requests == 0 && l.Errors > 0 {
			return res, fmt.Errorf("concurrency %d: all %d requests failed; first: %s", c, l.Errors, l.FirstError)
		}
	}
	return res, nil
}

// firstModel asks GET /v1/models for the first model served.
func (b *Bench) firstModel(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url("/v1/models"), nil)
	if err != nil {
		return "", err
	}
	if b.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.o.APIKey)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("listing models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("listing models at %s: %w", b.url("/v1/models"), readHTTPError(resp))
	}
	var l struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return "", fmt.Errorf("listing models: %w", err)
	}
	if len(l.Data) == 0 {
		return "", fmt.Errorf("%s serves no model", b.o.Endpoint)
	}
	return l.Data[0].ID, nil
}

// level keeps c requests in flight until the count or the time is spent.
func (b *Bench) level(ctx context.Context, c int) Level {
	limit := b.o.Requests
	if limit == 0 && b.o.Duration == 0 {
		limit = max(8, 4*c)
	}
	var (
		mu      sync.Mutex
		samples []sample
		issued  int
		wg      sync.WaitGroup
	)
	start := time.Now()
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil || (limit > 0 && issued >= limit) || (b.o.Duration > 0 && time.Since(start) >= b.o.Duration) {
			return false
		}
		issued++
		return true
	}
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for take() {
				s := b.stream(ctx)
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return summarize(c, start, samples)
}

// summarize turns a level's samples into figures.
func summarize(c int, start time.Time, samples []sample) Level {
	l := Level{Concurrency: c}
	var ttft, gaps, tpot, lat []time.Duration
	end := start
	for _, s := range samples {
		if s.end.After(end) {
			end = s.end
		}
		if s.err != nil {
			l.Errors++
			if l.ErrorKinds == nil {
				l.ErrorKinds = map[string]int{}
			}
			l.ErrorKinds[errorKind(s.err)]++
			if l.FirstError == "" {
				l.FirstError = s.err.Error()
			}
			continue
		}
		l.Requests++
		l.GeneratedTokens += s.tokens
		l.PromptTokens += s.promptTokens
		if l.Finish == nil {
			l.Finish = map[string]int{}
		}
		l.Finish[s.finish]++
		lat = append(lat, s.end.Sub(s.start))
		if s.chunks > 0 {
			ttft = append(ttft, s.ttft)
			gaps = append(gaps, s.gaps...)
		}
		if s.tokens > 1 && s.chunks > 0 {
			tpot = append(tpot, (s.end.Sub(s.start)-s.ttft)/time.Duration(s.tokens-1))
		}
	}
	wall := end.Sub(start)
	l.WallSeconds = round(wall.Seconds(), 4)
	if wall > 0 {
		l.TokensPerSecond = round(float64(l.GeneratedTokens)/wall.Seconds(), 2)
		l.RequestsPerSecond = round(float64(l.Requests)/wall.Seconds(), 3)
	}
	l.TTFT, l.InterToken, l.TPOT, l.Latency = dist(ttft), dist(gaps), dist(tpot), dist(lat)
	if l.TPOT.Mean > 0 {
		l.PerStreamTokensPerSecond = round(1000/l.TPOT.Mean, 2)
	}
	return l
}

// dist computes the summary; percentiles interpolate linearly between
// closest ranks.
func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	v := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		v[i] = float64(d) / float64(time.Millisecond)
		sum += v[i]
	}
	slices.Sort(v)
	return Dist{N: len(v), Mean: round(sum/float64(len(v)), 3), P50: round(Percentile(v, 50), 3),
		P90: round(Percentile(v, 90), 3), P99: round(Percentile(v, 99), 3), Max: round(v[len(v)-1], 3)}
}

// Percentile returns the p-th percentile (0..100) of sorted values,
// interpolating linearly between closest ranks (as numpy's default).
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[len(sorted)-1]
	}
	r := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(r))
	if lo+1 >= len(sorted) {
		return sorted[lo]
	}
	f := r - float64(lo)
	return sorted[lo] + f*(sorted[lo+1]-sorted[lo])
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// ParseLevels reads a list such as "1,4,16".
func ParseLevels(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("concurrency %q: want positive integers separated by commas, e.g. 1,4,16", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("concurrency %q: want at least one level, e.g. 1,4,16", s)
	}
	return out, nil
}
