package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"shoal/engine/device"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/quant"
)

// Options select the tests, as llama-bench's -t, -p, -n, -r and -d.
type Options struct {
	Threads []int
	Prompt  []int // pp sizes
	Gen     []int // tg sizes
	Reps    int
	// Depth is the context each run starts from: that many tokens are
	// prompted (untimed) before the timed tokens, so that attention reads a
	// cache of that length; 0 = an empty context.
	Depth int
	// BandwidthMB is the triad array size (MB per array); 0 = 256.
	BandwidthMB int
	// Device runs the layers (the CPU if nil); Bandwidth, when set, is the
	// roofline's bandwidth in bytes per second in place of the CPU triad
	// (a GPU's measured rate).
	Device    device.Device
	Bandwidth func() float64
	// KVType is the cache's type (F16 if 0).
	KVType quant.Type
}

// Result is one row: a test at a thread count.
type Result struct {
	Test         string    `json:"test"` // "pp512", "tg64"; "tg64 @ d1024" with a depth
	Threads      int       `json:"threads"`
	TokPerSec    float64   `json:"tok_per_sec"`
	StdDev       float64   `json:"stddev"`
	Samples      []float64 `json:"samples"`
	BandwidthGBs float64   `json:"bandwidth_gb_s,omitempty"` // triad, measured just before (tg rows)
	Roofline     float64   `json:"roofline_fraction,omitempty"`
}

// BytesPerToken is the weight bytes one decode step reads: every matrix
// except the embedding table (read one row per token) unless the embedding
// doubles as the output matrix, and of a MoE model's stacked routed experts
// the share of the experts a token uses (expert_used_count of
// expert_count).
func BytesPerToken(m *model.Model) int64 {
	var n int64
	tied := m.W.Output == m.W.TokEmbd
	for _, t := range m.File.Tensors {
		if t.Name == "token_embd.weight" && !tied {
			continue
		}
		if m.NExpert > 0 && strings.HasSuffix(t.Name, "_exps.weight") {
			n += int64(t.Size) * int64(m.NExpertUsed) / int64(m.NExpert)
			continue
		}
		n += int64(t.Size)
	}
	return n
}

// ModelBytes is the size of all tensors.
func ModelBytes(m *model.Model) int64 {
	var n int64
	for _, t := range m.File.Tensors {
		n += int64(t.Size)
	}
	return n
}

// MeanSD is the mean and the sample standard deviation of xs (0, 0 for
// none; the deviation is 0 for one sample).
func MeanSD(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	mean := s / float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	if len(xs) > 1 {
		v /= float64(len(xs) - 1)
	}
	return mean, math.Sqrt(v)
}

// Run runs every test, calling report after each row.
func Run(m *model.Model, o Options, report func(Result)) ([]Result, error) {
	if o.Reps <= 0 {
		o.Reps = 3
	}
	if o.BandwidthMB <= 0 {
		o.BandwidthMB = 256
	}
	if o.Depth < 0 {
		return nil, fmt.Errorf("depth %d is negative", o.Depth)
	}
	maxCtx := 16
	for _, p := range o.Prompt {
		maxCtx = max(maxCtx, o.Depth+p)
	}
	for _, g := range o.Gen {
		maxCtx = max(maxCtx, o.Depth+g+1)
	}
	at := ""
	if o.Depth > 0 {
		at = fmt.Sprintf(" @ d%d", o.Depth)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, maxCtx)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(m.NVocab))
	}
	bpt := float64(BytesPerToken(m))
	var out []Result
	for _, th := range o.Threads {
		r, err := model.NewRunner(m, model.Options{Threads: th, CacheTokens: maxCtx, Device: o.Device, KVType: o.KVType})
		if err != nil {
			return nil, err
		}
		const seq kv.SeqID = 0
		d := o.Depth
		// start empties the sequence and prompts the depth's tokens.
		start := func() error {
			r.Cache().Free(seq)
			if d == 0 {
				return nil
			}
			_, err := r.Prompt(seq, tokens[:d], []int{d - 1})
			return err
		}
		for _, p := range o.Prompt {
			run := func() (float64, error) {
				if err := start(); err != nil {
					return 0, err
				}
				t0 := time.Now()
				if _, err := r.Prompt(seq, tokens[d:d+p], []int{p - 1}); err != nil {
					return 0, err
				}
				return float64(p) / time.Since(t0).Seconds(), nil
			}
			res, err := repeat(run, o.Reps)
			if err != nil {
				r.Close()
				return nil, err
			}
			res.Test, res.Threads = fmt.Sprintf("pp%d%s", p, at), th
			out = append(out, res)
			if report != nil {
				report(res)
			}
		}
		for _, g := range o.Gen {
			var bw float64
			if o.Bandwidth != nil {
				bw = o.Bandwidth()
			} else {
				bw = MemBandwidth(th, o.BandwidthMB, 5)
			}
			run := func() (float64, error) {
				if err := start(); err != nil {
					return 0, err
				}
				t0 := time.Now()
				for i := 0; i < g; i++ {
					if _, err := r.Decode(seq, tokens[d+i]); err != nil {
						return 0, err
					}
				}
				return float64(g) / time.Since(t0).Seconds(), nil
			}
			res, err := repeat(run, o.Reps)
			if err != nil {
				r.Close()
				return nil, err
			}
			res.Test, res.Threads = fmt.Sprintf("tg%d%s", g, at), th
			res.BandwidthGBs = bw / 1e9
			res.Roofline = res.TokPerSec * bpt / bw
			out = append(out, res)
			if report != nil {
				report(res)
			}
		}
		r.Cache().Free(seq)
		r.Close()
	}
	return out, nil
}

// repeat runs one warm-up and reps measured runs.
func repeat(run func() (float64, error), reps int) (Result, error) {
	if _, err := run(); err != nil {
		return Result{}, err
	}
	var xs []float64
	for i := 0; i < reps; i++ {
		x, err := run()
		if err != nil {
			return Result{}, err
		}
		xs = append(xs, x)
	}
	mean, sd := MeanSD(xs)
	return Result{TokPerSec: mean, StdDev: sd, Samples: xs}, nil
}
