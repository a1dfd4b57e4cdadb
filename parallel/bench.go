package parallel

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"shoal/engine/bench"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/transport"
)

// PrefillStep is the longest prefill step of a prompt alone: a cluster
// benchmark's ppN runs in steps of this many tokens, as a served prompt
// with no stream decoding beside it does (each step pipelined in pieces
// through the stages: placement.PredictPrefill's prediction).
const PrefillStep = 2048

// Logits is one step's logits through a plan: NTokens rows of NVocab.
type Logits struct {
	NTokens, NVocab int
	Data            []float32
}

// BenchRequest selects a cluster benchmark's tests: ppN for each Prompt
// size, tgN for each Gen size, Reps measured runs each (3 if 0), hidden
// states sent as Activations (the model's wire encoding if 0).
type BenchRequest struct {
	Prompt, Gen []int
	Reps        int
	Activations transport.DType
}

// BenchRow is one test's rate; BytesPerToken is the payload the plan's
// nodes sent per token over the measured runs.
type BenchRow struct {
	Test                      string
	Tokens                    int // the row's N: prompt tokens (ppN) or generated (tgN)
	TokPerSec, StdDev         float64
	Samples                   []float64
	MsPerToken, BytesPerToken float64
	// ComputeMs is the compute on the critical path per token (Stats);
	// MsPerToken less it is the network, the waits and the driver.
	ComputeMs float64
}

// BenchResult is a cluster benchmark's answer. Activations is the wire
// dtype the hidden states travelled in.
type BenchResult struct {
	Model               string
	PlanVersion         uint64
	Strategy            string
	Nodes               int
	Stages              []string // "[0,11) node-a", "[11,22) node-b+node-c (tp)"
	Activations         string
	PredictedMsPerToken float64
	Results             []BenchRow
}

func invalidf(format string, args ...any) error {
	return transport.Errorf(http.StatusBadRequest, format, args...)
}

// openRun opens a session of its own for a logits or benchmark run, so the
// counters and KV caches of served requests stay apart.
func (r *Reconciler) openRun(ctx context.Context, d *driver, act transport.DType) (*Cluster, *Session, error) {
	v := d.view()
	if act == 0 {
		act = v.wire // the model's (DefaultWire if 0)
	}
	c, err := r.cfg.Host.NewCluster(v.plan, v.addrs, Options{Timeout: RunTimeout, Activations: act, Collectives: v.wire})
	if err != nil {
		return nil, nil, err
	}
	s, err := c.Open(ctx)
	if err != nil {
		return nil, nil, transport.Errorf(http.StatusServiceUnavailable, "%v", err)
	}
	return c, s, nil
}

// Logits runs the tokens as one prompt, one step through the plan of
// model (driven here), and returns every row's logits.
func (r *Reconciler) Logits(ctx context.Context, name string, tokens []int32) (*Logits, error) {
	d, err := r.localDriver(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(tokens) > d.ctx {
		return nil, invalidf("%d tokens do not fit the model's KV cache of %d positions (load it with a larger --ctx)", len(tokens), d.ctx)
	}
	d.run.Lock()
	defer d.run.Unlock()
	_, s, err := r.openRun(ctx, d, 0)
	if err != nil {
		return nil, err
	}
	defer s.Close(context.Background())
	for _, t := range tokens {
		if t < 0 || int(t) >= s.NVocab() {
			return nil, invalidf("token id %d is outside the vocabulary (0..%d)", t, s.NVocab()-1)
		}
	}
	rows := make([]int, len(tokens))
	for i := range rows {
		rows[i] = i
	}
	b := &model.Batch{Tokens: tokens, Chunks: []model.Chunk{{Seq: 0, N: len(tokens)}}}
	l, err := s.Step(ctx, b, rows)
	if err != nil {
		return nil, err
	}
	return &Logits{NTokens: len(tokens), NVocab: s.NVocab(), Data: append([]float32(nil), l...)}, nil
}

// Bench runs ppN (N random tokens of one sequence from an empty cache, in
// steps of at most PrefillStep) and tgN (N one-token steps) through the plan
// of model (driven here): one warm-up and Reps measured runs each, with the
// payload bytes the plan's nodes sent per token.
func (r *Reconciler) Bench(ctx context.Context, name string, req BenchRequest) (*BenchResult, error) {
	d, err := r.localDriver(ctx, name)
	if err != nil {
		return nil, err
	}
	if req.Reps <= 0 {
		req.Reps = 3
	}
	for _, p := range req.Prompt {
		if p > d.ctx {
			return nil, invalidf("pp%d does not fit the model's KV cache of %d positions (load it with a larger --ctx)", p, d.ctx)
		}
	}
	for _, g := range req.Gen {
		if g+1 > d.ctx {
			return nil, invalidf("tg%d does not fit the model's KV cache of %d positions (load it with a larger --ctx)", g, d.ctx)
		}
	}
	d.run.Lock()
	defer d.run.Unlock()
	c, s, err := r.openRun(ctx, d, req.Activations)
	if err != nil {
		return nil, err
	}
	defer s.Close(context.Background())
	b := &benchRun{c: c, s: s, ctx: ctx, reps: req.Reps}
	v := d.view()
	b.out = &BenchResult{Model: name, PlanVersion: v.version, Strategy: v.plan.Strategy, Nodes: len(v.addrs),
		Activations: c.opt.Activations.String(), PredictedMsPerToken: v.plan.Cost.MsPerToken, Stages: v.describeStages()}
	rng := rand.New(rand.NewPCG(1, 2))
	b.tokens = make([]int32, d.ctx)
	for i := range b.tokens {
		b.tokens[i] = int32(rng.IntN(s.NVocab()))
	}
	for _, p := range req.Prompt {
		if err := b.measure(fmt.Sprintf("pp%d", p), p, func() error { return b.prefill(p) }); err != nil {
			return nil, err
		}
	}
	for _, g := range req.Gen {
		if err := b.measure(fmt.Sprintf("tg%d", g), g, func() error { return b.generate(g) }); err != nil {
			return nil, err
		}
	}
	return b.out, nil
}

// benchRun is one benchmark's session, its random tokens and its rows.
type benchRun struct {
	c      *Cluster
	s      *Session
	ctx    context.Context
	reps   int
	tokens []int32
	batch  model.Batch
	out    *BenchResult
}

const benchSeq kv.SeqID = 0

// step runs toks; the listed rows are sampled (greedy) the way a driver
// serving the model has them sampled: where the logits are computed.
func (b *benchRun) step(toks []int32, rows []int) error {
	b.batch.Tokens = toks
	b.batch.Chunks = append(b.batch.Chunks[:0], model.Chunk{Seq: benchSeq, N: len(toks)})
	if len(rows) > 0 && b.s.SamplesRemotely() {
		_, err := b.s.StepSampled(b.ctx, &b.batch, rows, make([]sample.Request, len(rows)))
		return err
	}
	_, err := b.s.Step(b.ctx, &b.batch, rows)
	return err
}

func (b *benchRun) prefill(p int) error {
	for off := 0; off < p; off += PrefillStep {
		n := min(PrefillStep, p-off)
		var rows []int
		if off+n == p {
			rows = []int{n - 1}
		}
		if err := b.step(b.tokens[off:off+n], rows); err != nil {
			return err
		}
	}
	return nil
}

func (b *benchRun) generate(g int) error {
	for i := 0; i < g; i++ {
		if err := b.step(b.tokens[i:i+1], []int{0}); err != nil {
			return err
		}
	}
	return nil
}

// measure runs one warm-up and reps measured runs of a test of n tokens
// from an empty sequence and appends its row.
func (b *benchRun) measure(test string, n int, run func() error) error {
	var xs []float64
	var sent, stepped, computeUs int64
	for rep := 0; rep <= b.reps; rep++ {
		if err := b.s.Free(b.ctx, benchSeq); err != nil {
			return err
		}
		before := b.c.Stats()
		t0 := time.Now()
		if err := run(); err != nil {
			return fmt.Errorf("%s: %w", test, err)
		}
		el := time.Since(t0)
		if rep == 0 {
			continue // warm-up
		}
		xs = append(xs, float64(n)/el.Seconds())
		st := b.c.Stats().Sub(before)
		stepped += st.Tokens
		sent += st.Bytes()
		computeUs += st.ComputeUs
	}
	mean, sd := bench.MeanSD(xs)
	row := BenchRow{Test: test, Tokens: n, TokPerSec: mean, StdDev: sd, Samples: xs}
	if mean > 0 {
		row.MsPerToken = 1000 / mean
	}
	if stepped > 0 {
		row.BytesPerToken = float64(sent) / float64(stepped)
		row.ComputeMs = float64(computeUs) / 1000 / float64(stepped)
	}
	b.out.Results = append(b.out.Results, row)
	return nil
}

// describeStages writes the plan's stages as "[0,11) node-a".
func (v planView) describeStages() []string {
	var out []string
	for _, pool := range v.plan.Pools {
		for _, st := range pool.Stages {
			var ms []string
			for _, m := range st.Members {
				n := v.names[m.Node]
				if n == "" {
					n = m.Node
				}
				ms = append(ms, n)
			}
			s := fmt.Sprintf("[%d,%d) %s", st.Lo, st.Hi, strings.Join(ms, "+"))
			if len(ms) > 1 {
				s += " (tp)"
			}
			out = append(out, s)
		}
	}
	return out
}
