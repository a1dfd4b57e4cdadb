package parallel

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/engine/synth"
	"shoal/placement"
	"shoal/serve"
	"shoal/serve/servetest"
)

// TestSplitPieces: a step's tokens cut at every size tokens, a chunk
// straddling a cut split at that position, every row in the piece holding
// its token; a cut sequence is cut by its first piece only.
func TestSplitPieces(t *testing.T) {
	chunks := []wireChunk{{Seq: 1, Pos: 10, N: 5}, {Seq: 2, Pos: 0, N: 9, Cut: true}, {Seq: 3, Pos: 4, N: 1}}
	tokens := make([]int32, 15)
	for i := range tokens {
		tokens[i] = int32(100 + i)
	}
	rows := []int{14, 0, 4, 5, 9}
	sreqs := make([]sample.Request, len(rows))
	for i := range sreqs {
		sreqs[i].Params.Seed = uint64(i)
	}
	ps := splitPieces(chunks, tokens, rows, sreqs, 4)
	want := [][]wireChunk{
		{{1, 10, 4, false}},
		{{1, 14, 1, false}, {2, 0, 3, true}},
		{{2, 3, 4, false}},
		{{2, 7, 2, false}, {3, 4, 1, false}},
	}
	if len(ps) != len(want) {
		t.Fatalf("%d pieces, want %d", len(ps), len(want))
	}
	seen := map[int]bool{}
	for k, pc := range ps {
		if !slices.Equal(pc.chunks, want[k]) {
			t.Errorf("piece %d: chunks %v, want %v", k, pc.chunks, want[k])
		}
		if n := len(pc.tokens); n != min(4, 15-4*k) || pc.tokens[0] != int32(100+4*k) {
			t.Errorf("piece %d: tokens %v", k, pc.tokens)
		}
		for j, r := range pc.rows {
			at := pc.at[j]
			if seen[at] || rows[at] != 4*k+r || pc.sreqs[j].Params.Seed != uint64(at) {
				t.Errorf("piece %d row %d (caller's row %d): token %d, want %d", k, r, at, 4*k+r, rows[at])
			}
			seen[at] = true
		}
	}
	if len(seen) != len(rows) {
		t.Errorf("rows placed: %v of %d", seen, len(rows))
	}
}

// TestPipelinedPrefill: a batch of several sequences' prompts through
// plans of two stages (and two stages of two members), run as one step and
// cut into pieces sent at once, gives a single node's logits for rows in
// every piece, leaves every sequence where the single node has it (the
// decode steps after it agree too), and did run as pieces. The step of 75
// tokens is long enough for a tensor-parallel group to run it in
// overlapped parts (model.MinOverlapTokens), over the transport: tp2 and
// pp2xtp2 check those logits too.
func TestPipelinedPrefill(t *testing.T) {
	ref, path := openRef(t)
	c := &ref.Config
	toks := enginetest.Tokens(78, ref.NVocab, 60)
	for _, name := range []string{"pp2", "pp2xtp2", "tp2"} {
		for _, piece := range []int{-1, 8, 0} {
			t.Run(name, func(t *testing.T) {
				single, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 128})
				if err != nil {
					t.Fatal(err)
				}
				defer single.Close()
				plan := shapeOf(c).Plans(denseQ8.Name).Get(name)
				cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second, Piece: piece})
				ctx := context.Background()
				s, err := cl.drv.Open(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close(ctx)
				chunks := []model.Chunk{{Seq: 1, N: 40}, {Seq: 2, N: 30}, {Seq: 3, N: 5}}
				steps := []struct {
					chunks []model.Chunk
					tokens []int32
					rows   []int
				}{
					{chunks, toks[:75], []int{0, 7, 8, 39, 40, 69, 74}},
					{[]model.Chunk{{Seq: 2, N: 1}, {Seq: 1, N: 1}, {Seq: 3, N: 1}}, toks[75:78], []int{0, 1, 2}},
				}
				for i, st := range steps {
					wb := model.Batch{Tokens: st.tokens, Chunks: slices.Clone(st.chunks)}
					want, err := single.Step(&wb, st.rows)
					if err != nil {
						t.Fatal(err)
					}
					want = slices.Clone(want)
					before := s.step
					gb := model.Batch{Tokens: st.tokens, Chunks: slices.Clone(st.chunks)}
					got, err := s.Step(ctx, &gb, st.rows)
					if err != nil {
						t.Fatal(err)
					}
					for j := range gb.Chunks {
						if gb.Chunks[j].Pos != wb.Chunks[j].Pos {
							t.Errorf("step %d chunk %d at position %d, single node %d", i, j, gb.Chunks[j].Pos, wb.Chunks[j].Pos)
						}
					}
					m := enginetest.Compare(want, got, c.NVocab)
					steps := s.step - before
					t.Logf("piece %d, step %d: %d member steps; %s", piece, i, steps, m)
					if err := m.Check(false); err != nil {
						t.Error(err)
					}
					if wantSteps := uint64(max(1, len(splitIf(cl.drv, len(st.tokens))))); steps != wantSteps {
						t.Errorf("step %d ran as %d member steps, want %d", i, steps, wantSteps)
					}
				}
				if piece == 8 && len(plan.Pools[0].Stages) > 1 && s.step < 10 {
					t.Errorf("the 75-token prompt of pieces of 8 ran as %d steps", s.step-1)
				}
			})
		}
	}
}

// splitIf is the pieces c cuts a step of n tokens into (nil: one step).
func splitIf(c *Cluster, n int) []int {
	size := c.pieceSize(n)
	if size == 0 {
		return nil
	}
	var out []int
	for lo := 0; lo < n; lo += size {
		out = append(out, min(size, n-lo))
	}
	return out
}

// TestPipelinedPrefillSampled: rows sampled on the output member come back
// in the caller's order from a cut step, the same tokens as the uncut one
// (seeded, deterministic samplers).
func TestPipelinedPrefillSampled(t *testing.T) {
	ref, path := openRef(t)
	toks := enginetest.Tokens(40, ref.NVocab, 5)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	var results [2][]sample.Result
	for k, piece := range []int{-1, 8} {
		cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second, Piece: piece})
		ctx := context.Background()
		s, err := cl.drv.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows := []int{39, 3, 17, 24}
		reqs := make([]sample.Request, len(rows))
		for i := range reqs {
			reqs[i].Params = sample.Params{Temperature: 0.8, TopK: 40, Seed: uint64(7 + i)}
		}
		b := model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: kv.SeqID(1), N: len(toks)}}}
		if results[k], err = s.StepSampled(ctx, &b, rows, reqs); err != nil {
			t.Fatal(err)
		}
		s.Close(ctx)
	}
	if len(results[0]) != 4 || !slices.EqualFunc(results[0], results[1], func(a, b sample.Result) bool { return a.Token == b.Token }) {
		t.Fatalf("sampled rows: one step %v, in pieces %v", results[0], results[1])
	}
}

// BenchmarkPipelinedPrefill prefills a 512-token prompt through a
// two-stage pipeline of one thread per stage, in process, as one step
// (pieces=1) and cut into pieces (auto), beside one node of one thread
// holding every layer: the tok/s of each. On a host with a core per stage
// the pieces let both stages compute at once (issue #39's target: 1.7x
// one node). Run: go test ./parallel -run '^$' -bench PipelinedPrefill
func BenchmarkPipelinedPrefill(b *testing.B) {
	spec := denseQ8
	spec.Name, spec.NEmbd, spec.NLayer, spec.NHead, spec.NHeadKV, spec.NFF = "prefill-bench", 512, 8, 8, 8, 1408
	path := enginetest.Write(b, "", spec)
	ref := enginetest.OpenPath(b, path)
	const n = 512
	toks := enginetest.Tokens(n, ref.NVocab, 3)
	plan := shapeOf(&ref.Config).Plans(spec.Name).Get("pp2")
	b.Run("one-node", func(b *testing.B) {
		r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: n})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		for b.Loop() {
			bt := model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: 1, N: n}}}
			if _, err := r.Step(&bt, []int{n - 1}); err != nil {
				b.Fatal(err)
			}
			r.Cache().Free(1)
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
	})
	tp := shapeOf(&ref.Config).Plans(spec.Name).Get("tp2")
	for _, c := range []struct {
		name  string
		plan  placement.Plan
		piece int
	}{{"pp2-one-step", plan, -1}, {"pp2-pieces", plan, 0}, {"tp2", tp, 0}} {
		b.Run(c.name, func(b *testing.B) {
			cl := startClusterCache(b, path, c.plan, Options{Timeout: time.Minute, Piece: c.piece}, n)
			ctx := context.Background()
			s, err := cl.drv.Open(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			for b.Loop() {
				bt := model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: 1, N: n}}}
				if _, err := s.Step(ctx, &bt, []int{n - 1}); err != nil {
					b.Fatal(err)
				}
				if err := s.Free(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkSpeculativeDecode: one greedy stream decoding through a 2-stage
// pipeline of one thread per stage, without speculation and with prompt
// lookup drafting up to 8 tokens a step (a random model's greedy text
// falls into loops that lookup predicts: the acceptance is reported), and
// one node alone for reference, and with a draft model of the same
// weights' first layers (pp2-draft, below). tok/s counts the tokens after
// the first.
// SHOAL_BENCH_SHAPE=tinyllama runs TinyLlama-1.1B's shapes in Q4_0 (issue
// #39's case; its file is 600 MiB), else a 512-wide 8-layer model;
// SHOAL_BENCH_STD sets the weights' standard deviation (synth's 0.02).
func BenchmarkSpeculativeDecode(b *testing.B) {
	spec := synth.Spec{Name: "spec-bench", Arch: "llama", NEmbd: 512, NLayer: 8, NHead: 8, NHeadKV: 4, NFF: 1408, Type: "q4_0", Seed: 1}
	if os.Getenv("SHOAL_BENCH_SHAPE") == "tinyllama" {
		spec.NEmbd, spec.NLayer, spec.NHead, spec.NHeadKV, spec.NFF = 2048, 22, 32, 4, 5632
	}
	if v, err := strconv.ParseFloat(os.Getenv("SHOAL_BENCH_STD"), 32); err == nil {
		// Larger weights make a random model's greedy text fall into
		// loops sooner: lookup's drafts are then accepted.
		spec.Std = float32(v)
	}
	path := enginetest.Write(b, "", spec)
	ref := enginetest.OpenPath(b, path)
	const gen, ctxTokens = 128, 512
	prompt := enginetest.Tokens(32, ref.NVocab, 5)
	plan := shapeOf(&ref.Config).Plans(spec.Name).Get("pp2")
	decode := func(b *testing.B, e serve.Engine, o serve.Options) {
		o.MaxSeqs = 1
		sc, err := serve.NewEngine(e, func(int32) bool { return false }, o)
		if err != nil {
			b.Fatal(err)
		}
		defer sc.Close()
		rate := servetest.StreamRate(b, gen, func() (<-chan serve.Event, error) {
			return sc.Submit(context.Background(), serve.Request{Prompt: prompt, MaxTokens: gen})
		}, func(ev serve.Event) error { return ev.Err })
		st := sc.Stats()
		b.ReportMetric(rate, "tok/s")
		if st.Drafted > 0 {
			b.ReportMetric(float64(st.Accepted)/float64(st.Drafted), "accepted/drafted")
			b.ReportMetric(float64(st.GeneratedTokens)/float64(st.Steps), "tokens/step")
			b.ReportMetric(float64(st.Drafted)/float64(st.Steps), "drafted/step")
		}
	}
	b.Run("one-node", func(b *testing.B) {
		r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: ctxTokens})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		decode(b, serve.RunnerEngine{R: r}, serve.Options{})
	})
	// The draft model: the same seed and shapes with fewer layers
	// (SHOAL_BENCH_DRAFT_LAYERS, default 1). synth draws every tensor from
	// its name, so the draft holds the model's own embedding, output and
	// first layers; how often it agrees with the whole model is reported
	// (accepted/drafted) and depends on how much the later layers change
	// the hidden states (SHOAL_BENCH_STD): with TinyLlama's shapes, 0 of the
	// drafts at synth's 0.02 and down to 0.001, 89% at 0.0003 (measured).
	dspec := spec
	dspec.Name, dspec.NLayer = spec.Name+"-draft", 1
	if v, err := strconv.Atoi(os.Getenv("SHOAL_BENCH_DRAFT_LAYERS")); err == nil && v > 0 && v < spec.NLayer {
		dspec.NLayer = v
	}
	dref := enginetest.OpenPath(b, enginetest.Write(b, "", dspec))
	for _, c := range []struct {
		name   string
		lookup int
		draft  bool
	}{{"pp2", 0, false}, {"pp2-lookup", 8, false}, {"pp2-draft", 0, true}} {
		b.Run(c.name, func(b *testing.B) {
			cl := startClusterCache(b, path, plan, Options{Timeout: time.Minute}, ctxTokens)
			s, err := cl.drv.Open(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			eng, err := NewEngine(s, ctxTokens, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close()
			o := serve.Options{Lookup: c.lookup}
			if c.draft {
				dr, err := model.NewRunner(dref, model.Options{Threads: 1, CacheTokens: ctxTokens})
				if err != nil {
					b.Fatal(err)
				}
				defer dr.Close()
				d, err := serve.NewModelDrafter(dr, dref.NVocab)
				if err != nil {
					b.Fatal(err)
				}
				o.Draft, o.DraftMax = d, 8
			}
			decode(b, eng, o)
		})
	}
}
