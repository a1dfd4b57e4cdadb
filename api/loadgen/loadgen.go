package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
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
	// JSONSchema, if set, asks each chat request for output valid against
	// it (response_format json_schema), to measure constrained decoding.
	JSONSchema json.RawMessage
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
	// PromptTokens, if > 0, replaces Prompt with that many token ids drawn
	// at random in [100, Vocab), a fresh draw for each request (so no
	// request finds another's prefix in a prefix cache, nor one of an
	// earlier run: the draws are seeded at random). Completions only
	// (chat takes text).
	PromptTokens int
	// Vocab bounds the random token ids (default 32000, llama's
	// SentencePiece vocabulary).
	Vocab int
	// Steady makes each level last exactly Duration (which it needs):
	// requests still streaming then are cut, and what they streamed until
	// then counts (Level.Cut), so a level measures a steady load rather
	// than its ramp-down. With Periodic, the cut waits for the periodic
	// requests to finish.
	Steady bool
	// Periodic, if set, adds an open-loop client to each level: one more
	// request every Periodic.Every while the level's streams run,
	// reported apart (Level.Periodic). It needs Duration.
	Periodic *Periodic
	// HTTP is the client (default: one with a connection per stream).
	HTTP *http.Client
	// OnLevel, if set, is called with each level as it finishes.
	OnLevel func(Level)
	// Trace, if set, receives a JSON line per request as each level
	// finishes (TraceRecord): when it started, its first token and every
	// gap after, to see when a level's slow tokens happened.
	Trace io.Writer
}

// TraceRecord is one request of a level, as Options.Trace writes it.
// Times are milliseconds from the level's start.
type TraceRecord struct {
	Concurrency int       `json:"concurrency"`
	Periodic    bool      `json:"periodic,omitempty"`
	StartMs     float64   `json:"start_ms"`
	TTFTMs      float64   `json:"ttft_ms,omitempty"`
	GapsMs      []float64 `json:"gaps_ms,omitempty"`
	Tokens      int       `json:"tokens"`
	Cut         bool      `json:"cut,omitempty"`
	Error       string    `json:"error,omitempty"`
}

// trace writes the samples of a level to Options.Trace.
func (b *Bench) trace(c int, periodic bool, start time.Time, samples []sample) {
	if b.o.Trace == nil {
		return
	}
	enc := json.NewEncoder(b.o.Trace)
	for _, s := range samples {
		r := TraceRecord{Concurrency: c, Periodic: periodic, StartMs: msOf(s.start.Sub(start)), Tokens: s.tokens, Cut: s.cut}
		if s.err != nil {
			r.Error = s.err.Error()
		}
		if s.chunks > 0 {
			r.TTFTMs = msOf(s.ttft)
			r.GapsMs = make([]float64, len(s.gaps))
			for i, g := range s.gaps {
				r.GapsMs[i] = msOf(g)
			}
		}
		_ = enc.Encode(&r)
	}
}

func msOf(d time.Duration) float64 { return round(float64(d)/1e6, 3) }

// Periodic is a request that arrives at a fixed interval during a level,
// e.g. a long prompt arriving while decode streams run.
type Periodic struct {
	// Every is the interval; the first request leaves one interval after
	// the level starts, the last before Duration has passed. Requests do
	// not wait for each other.
	Every time.Duration `json:"-"`
	// PromptTokens, if > 0, makes each prompt that many random token ids
	// (as Options.PromptTokens); otherwise Options.Prompt is sent.
	PromptTokens int `json:"prompt_tokens,omitempty"`
	// MaxTokens per request (default 16).
	MaxTokens int `json:"max_tokens"`
	// EveryText is Every as text, for the result.
	EveryText string `json:"every"`
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
	// Cut counts the requests a steady level stopped at its end; their
	// chunks count in TTFT, inter-token and generated tokens, not in
	// Requests, TPOT or Latency.
	Cut int `json:"cut,omitempty"`
	// Periodic is the group of periodic requests sent during the level
	// (Options.Periodic); its Concurrency is 0.
	Periodic *Level `json:"periodic,omitempty"`
}

// Result is a whole run.
type Result struct {
	Endpoint string `json:"endpoint"`
	Model    string `json:"model"`
	API      API    `json:"api"`
	Prompt   string `json:"prompt"`
	// PromptTokens is the length of the random token prompts, if used.
	PromptTokens int       `json:"prompt_tokens,omitempty"`
	MaxTokens    int       `json:"max_tokens"`
	Steady       bool      `json:"steady,omitempty"`
	Periodic     *Periodic `json:"periodic,omitempty"`
	IgnoreEOS    bool      `json:"ignore_eos,omitempty"`
	Requests     int       `json:"requests_per_level,omitempty"`
	Duration     string    `json:"duration_per_level,omitempty"`
	Started      time.Time `json:"started"`
	Levels       []Level   `json:"levels"`
}

// Bench is a prepared run.
type Bench struct {
	o    Options
	hc   *http.Client
	body []byte // of the level's requests when their prompt is fixed
	seed uint64 // of the random prompts
	seq  uint64 // random prompts drawn (under mu)
	mu   sync.Mutex
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
	if o.Vocab == 0 {
		o.Vocab = 32000
	}
	if o.PromptTokens < 0 || o.Vocab <= 100 {
		return nil, fmt.Errorf("prompt tokens %d, vocabulary %d: want >= 0 and > 100", o.PromptTokens, o.Vocab)
	}
	if o.Steady && o.Duration == 0 {
		return nil, errors.New("a steady run needs a duration")
	}
	if p := o.Periodic; p != nil {
		if o.Duration == 0 || p.Every <= 0 || p.PromptTokens < 0 || p.MaxTokens < 0 {
			return nil, fmt.Errorf("periodic requests need a duration and a positive interval (every %v, duration %v)", p.Every, o.Duration)
		}
		q := *p
		if q.MaxTokens == 0 {
			q.MaxTokens = 16
		}
		q.EveryText = q.Every.String()
		o.Periodic = &q
	}
	if (o.PromptTokens > 0 || (o.Periodic != nil && o.Periodic.PromptTokens > 0)) && o.API != APICompletions {
		return nil, errors.New("prompts of random token ids need the completions api")
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Warmup == 0 {
		o.Warmup = 1
	}
	b := &Bench{o: o, hc: o.HTTP, seed: rand.Uint64()}
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
	body, err := b.o.body(b.o.Prompt, b.o.MaxTokens)
	if err != nil {
		return nil, err
	}
	b.body = body
	res := &Result{Endpoint: b.o.Endpoint, Model: b.o.Model, API: b.o.API, Prompt: b.o.Prompt, PromptTokens: b.o.PromptTokens,
		MaxTokens: b.o.MaxTokens, Steady: b.o.Steady, Periodic: b.o.Periodic,
		IgnoreEOS: b.o.IgnoreEOS, Requests: b.o.Requests, Started: time.Now().UTC()}
	if b.o.PromptTokens > 0 {
		res.Prompt = ""
	}
	if b.o.Duration > 0 {
		res.Duration = b.o.Duration.String()
	}
	for range max(b.o.Warmup, 0) {
		if s := b.stream(ctx, b.mainBody()); s.err != nil {
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

// randomPrompt returns n token ids for the next random prompt.
func (b *Bench) randomPrompt(n int) []int32 {
	b.mu.Lock()
	b.seq++
	k := b.seq
	b.mu.Unlock()
	r := rand.New(rand.NewPCG(b.seed, k))
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(100 + r.IntN(b.o.Vocab-100))
	}
	return ids
}

// mainBody is the body of the next request of a level.
func (b *Bench) mainBody() []byte {
	if b.o.PromptTokens == 0 {
		return b.body
	}
	body, _ := b.o.body(b.randomPrompt(b.o.PromptTokens), b.o.MaxTokens) // ids marshal without error
	return body
}

// periodic sends Options.Periodic's requests from start until the
// duration has passed, and returns when they have all finished.
func (b *Bench) periodic(ctx context.Context, start time.Time) []sample {
	p := b.o.Periodic
	var (
		mu      sync.Mutex
		samples []sample
		wg      sync.WaitGroup
	)
	t := time.NewTimer(0)
	defer t.Stop()
	for k := 1; time.Duration(k)*p.Every < b.o.Duration; k++ {
		t.Reset(time.Until(start.Add(time.Duration(k) * p.Every)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
		var prompt any = b.o.Prompt
		if p.PromptTokens > 0 {
			prompt = b.randomPrompt(p.PromptTokens)
		}
		body, _ := b.o.body(prompt, p.MaxTokens)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := b.stream(ctx, body)
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return samples
}

// level keeps c requests in flight until the count or the time is spent
// (a steady level: until the time is spent and its periodic requests are
// done, then it cuts those in flight).
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
		pw      sync.WaitGroup
		psamp   []sample
	)
	start := time.Now()
	sctx, cut := context.WithCancel(ctx)
	defer cut()
	if b.o.Periodic != nil {
		pw.Add(1)
		go func() {
			defer pw.Done()
			psamp = b.periodic(ctx, start)
		}()
	}
	var cutting bool // under mu
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		// A steady level keeps its streams running until the cut.
		if ctx.Err() != nil || cutting || (limit > 0 && issued >= limit) || (!b.o.Steady && b.o.Duration > 0 && time.Since(start) >= b.o.Duration) {
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
				s := b.stream(sctx, b.mainBody())
				mu.Lock()
				if cutting && ctx.Err() == nil && errors.Is(s.err, context.Canceled) {
					s.err, s.cut, s.tokens = nil, true, s.chunks
				}
				samples = append(samples, s)
				mu.Unlock()
			}
		}()
	}
	if b.o.Steady {
		t := time.NewTimer(time.Until(start.Add(b.o.Duration)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pw.Wait()
		mu.Lock()
		cutting = true
		mu.Unlock()
		cut()
	}
	wg.Wait()
	pw.Wait()
	l := summarize(c, start, samples)
	b.trace(c, false, start, samples)
	b.trace(c, true, start, psamp)
	if b.o.Periodic != nil {
		p := summarize(0, start, psamp)
		l.Periodic = &p
	}
	return l
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
		if s.cut {
			l.Cut++
			l.GeneratedTokens += s.tokens
			if s.chunks > 0 {
				ttft = append(ttft, s.ttft)
				gaps = append(gaps, s.gaps...)
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
