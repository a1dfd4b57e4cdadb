package model_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"shoal/engine/device"
	"shoal/engine/device/vulkan"
	"shoal/engine/enginetest"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/placement"
	"shoal/placement/placementtest"
	"shoal/shard"
)

// memGroup is an in-memory Collective: the members are goroutines that
// meet at a barrier, publish their buffers and read each other's. Sums run
// in rank order, so every member gets bitwise the same result.
type memGroup struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	gen     int
	arrived int
	op      []string
	in      [][]float32
}

type memMember struct {
	g    *memGroup
	rank int
	tmp  []float32
}

func newGroup(n int) []model.Collective {
	g := &memGroup{n: n, op: make([]string, n), in: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	out := make([]model.Collective, n)
	for r := range out {
		out[r] = &memMember{g: g, rank: r}
	}
	return out
}

func (g *memGroup) barrier() {
	g.mu.Lock()
	defer g.mu.Unlock()
	gen := g.gen
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return
	}
	for gen == g.gen {
		g.cond.Wait()
	}
}

// check reports a mismatch between what the members called.
func (g *memGroup) check(op string) error {
	for p := range g.n {
		if g.op[p] != op {
			return fmt.Errorf("member %d called %s while member %s", p, g.op[p], op)
		}
	}
	return nil
}

func (m *memMember) Rank() int { return m.rank }
func (m *memMember) Size() int { return m.g.n }

func (m *memMember) AllReduceSum(x []float32) error {
	g := m.g
	g.op[m.rank], g.in[m.rank] = "AllReduceSum", x
	g.barrier()
	err := g.check("AllReduceSum")
	for p := 0; err == nil && p < g.n; p++ {
		if len(g.in[p]) != len(x) {
			err = fmt.Errorf("AllReduceSum of %d values on member %d, %d on member %d", len(g.in[p]), p, len(x), m.rank)
		}
	}
	if err == nil {
		if cap(m.tmp) < len(x) {
			m.tmp = make([]float32, len(x))
		}
		sum := m.tmp[:len(x)]
		copy(sum, g.in[0])
		for p := 1; p < g.n; p++ {
			for i, v := range g.in[p] {
				sum[i] += v
			}
		}
	}
	g.barrier() // everyone has read every x
	if err == nil {
		copy(x, m.tmp[:len(x)])
	}
	return err
}

func (m *memMember) AllGather(part, out []float32) error {
	g := m.g
	g.op[m.rank], g.in[m.rank] = "AllGather", part
	g.barrier()
	err := g.check("AllGather")
	if err == nil {
		total := 0
		for p := range g.n {
			total += len(g.in[p])
		}
		if total != len(out) {
			err = fmt.Errorf("AllGather of %d values into %d on member %d", total, len(out), m.rank)
		}
	}
	if err == nil {
		at := 0
		for p := range g.n {
			at += copy(out[at:], g.in[p])
		}
	}
	g.barrier()
	return err
}

type member struct {
	sh *shard.Shard
	r  *model.Runner
}

type stage struct {
	lo, hi  int
	members []*member
}

// group is a plan's runners, built from the shards of a model file.
type group struct{ stages []stage }

// build opens every member's shard of plan (its one pool) with
// shard.Open and binds a runner to it. With all, every member holds the
// embedding and the output (so it can run Step); else the plan says which.
func build(t *testing.T, path string, plan placement.Plan, all bool) *group {
	t.Helper()
	g, err := tryBuild(t, path, plan, all)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// tryBuild is build returning the error of a member that does not open.
// dev, when given, picks the device of each stage's member by rank (the
// CPU where it returns nil).
func tryBuild(t *testing.T, path string, plan placement.Plan, all bool, dev ...func(stage, rank int) device.Device) (*group, error) {
	g := &group{}
	t.Cleanup(func() {
		for _, st := range g.stages {
			for _, mb := range st.members {
				mb.r.Close()
				mb.sh.Close()
			}
		}
	})
	for si, ps := range plan.Pools[0].Stages {
		g.stages = append(g.stages, stage{lo: ps.Lo, hi: ps.Hi})
		st := &g.stages[si]
		colls := newGroup(len(ps.Members))
		for r, pm := range ps.Members {
			spec := shard.SpecsFor(plan, pm.Node, "")[0]
			spec.Embedding, spec.Output = spec.Embedding || all, spec.Output || all
			var coll model.Collective
			if len(ps.Members) > 1 {
				coll = colls[r]
			}
			o := model.Options{Threads: 1, Lo: ps.Lo, Hi: ps.Hi, CacheTokens: 128, Collective: coll}
			if len(dev) > 0 {
				o.Device = dev[0](si, r)
			}
			mb, err := openMember(path, spec, o)
			if err != nil {
				return g, fmt.Errorf("stage %d member %d: %w", si, r, err)
			}
			st.members = append(st.members, mb)
		}
	}
	return g, nil
}

// openMember opens the shard spec of the model at path and a runner on it.
func openMember(path string, spec shard.ShardSpec, o model.Options) (*member, error) {
	sh, err := shard.Open(path, spec)
	if err != nil {
		return nil, err
	}
	m, err := sh.Model()
	if err == nil {
		var run *model.Runner
		if run, err = model.NewRunner(m, o); err == nil {
			return &member{sh: sh, r: run}, nil
		}
	}
	sh.Close()
	return nil, err
}

// concurrently runs fn for every member of st, each in its own goroutine,
// and fails the test on an error or if they do not finish (a member waiting
// in a collective the others never reach).
func concurrently(t *testing.T, st *stage, fn func(rank int, mb *member) error) {
	t.Helper()
	if err := tryConcurrently(st, fn); err != nil {
		t.Fatal(err)
	}
}

// tryConcurrently is concurrently returning the first member's error.
func tryConcurrently(st *stage, fn func(rank int, mb *member) error) error {
	errs := make([]error, len(st.members))
	var wg sync.WaitGroup
	for r, mb := range st.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r, mb)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("tensor-parallel members did not finish (stuck in a collective)")
	}
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("member %d: %w", r, err)
		}
	}
	return nil
}

// step runs toks of seq through the stages (Reserve, then Forward on every
// member of a stage at once, hidden states handed from stage to stage) and
// returns the logits of every token.
func (g *group) step(seq kv.SeqID, toks []int32, nEmbd, nVocab int) ([]float32, error) {
	n := len(toks)
	x := make([]float32, n*nEmbd)
	if err := g.stages[0].members[0].r.Embed(toks, x); err != nil {
		return nil, err
	}
	for si := range g.stages {
		st := &g.stages[si]
		xs := make([][]float32, len(st.members))
		batches := make([]model.Batch, len(st.members))
		for r, mb := range st.members {
			xs[r] = slices.Clone(x)
			batches[r] = model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: seq, N: n}}}
			if err := mb.r.Reserve(&batches[r]); err != nil {
				return nil, err
			}
		}
		err := tryConcurrently(st, func(r int, mb *member) error {
			return mb.r.Forward(&batches[r], st.lo, st.hi, xs[r])
		})
		if err != nil {
			return nil, fmt.Errorf("stage %d: %w", si, err)
		}
		for r := 1; r < len(xs); r++ {
			if !slices.Equal(xs[r], xs[0]) {
				return nil, fmt.Errorf("stage %d: member %d's hidden states differ from member 0's", si, r)
			}
		}
		x = xs[0]
	}
	rows := make([]int, n)
	for i := range rows {
		rows[i] = i
	}
	out := make([]float32, n*nVocab)
	last := g.stages[len(g.stages)-1].members[0].r
	if err := last.Logits(x, rows, out); err != nil {
		return nil, err
	}
	return out, nil
}

// generate runs the prompt, then each decode token, through plan on the
// model at path and returns the logits of every position.
func generate(t *testing.T, path string, plan placement.Plan, c *enginetest.Case, cfg *model.Config) ([]float32, error) {
	g, err := tryBuild(t, path, plan, false)
	if err != nil {
		return nil, err
	}
	const seq = 7
	got, err := g.step(seq, c.Prompt, cfg.NEmbd, cfg.NVocab)
	for _, tok := range c.Decode {
		if err != nil {
			return nil, err
		}
		var l []float32
		l, err = g.step(seq, []int32{tok}, cfg.NEmbd, cfg.NVocab)
		got = append(got, l...)
	}
	return got, err
}

// shapeOf is what placementtest needs of c.
func shapeOf(c *model.Config) placementtest.Shape {
	return placementtest.Shape{Layers: c.NLayer, Heads: c.NHead, KVHeads: c.NHeadKV, FFN: c.FFNDim(), Experts: c.NExpert}
}

// TestParallelPlans runs synthetic models (and the oracle's when
// ../shared is there) through each plan: a prompt, then a few decode
// steps, and compares the logits of every position with a single node's
// by the tolerances TestOracle holds the engine to against llama.cpp. The
// comparison can fail: the same plans on a perturbed weight, and plans
// that skip a layer, a KV group or an expert, must all fall outside.
func TestParallelPlans(t *testing.T) {
	for _, c := range enginetest.Cases(t) {
		t.Run(c.Name, func(t *testing.T) {
			ref := enginetest.OpenPath(t, c.Path)
			want := enginetest.Reference(t, ref, &c)
			plans := shapeOf(&ref.Config).Plans(c.Name)
			for _, p := range plans {
				t.Run(p.Name, func(t *testing.T) {
					got, err := generate(t, c.Path, p.Plan, &c, &ref.Config)
					if err != nil {
						t.Fatal(err)
					}
					m := enginetest.Compare(want, got, ref.NVocab)
					t.Logf("PARALLEL %-16s %-16s %s %s", c.Name, p.Name, m, describe(p.Plan))
					if err := m.Check(c.Float); err != nil {
						t.Error(err)
					}
				})
			}
			perturbed := enginetest.Perturb(t, c.Path, fmt.Sprintf("blk.%d.attn_output.weight", ref.NLayer-1))
			for _, p := range wrongPlans(&ref.Config, plans) {
				path := c.Path
				if p.Name == perturbedName {
					path = perturbed
				}
				got, err := generate(t, path, p.Plan, &c, &ref.Config)
				if err == nil {
					m := enginetest.Compare(want, got, ref.NVocab)
					if err = m.Check(c.Float); err == nil {
						t.Errorf("%s: the logits agree with a single node's (%s)", p.Name, m)
					}
				}
				t.Logf("MUTANT %-16s %-24s %v", c.Name, p.Name, err)
			}
		})
	}
}

const perturbedName = "perturbed attn_output"

// wrongPlans are plans that must not give a single node's logits: the
// first of plans on a perturbed weight, a pipeline that skips the first
// layer, a tensor-parallel group that leaves out a KV group, and for MoE
// models a group in which no member holds expert 3.
func wrongPlans(c *model.Config, plans placementtest.Plans) placementtest.Plans {
	s := shapeOf(c)
	L, G, F := c.NLayer, c.NHeadKV, c.FFNDim()
	noGroup0 := s.Plan("", placementtest.Stage{Lo: 0, Hi: L, Parts: s.TP([]int{1, G - 1}, []int{F / 2}, placementtest.SplitEven(c.NExpert, 2))})
	noGroup0.Pools[0].Stages[0].Members[0].HeadHi = 0
	ps := placementtest.Plans{
		{Name: perturbedName, Plan: plans[0].Plan},
		{Name: "layer 0 skipped", Plan: s.Plan("", placementtest.Stage{Lo: 1, Hi: L, Parts: placementtest.Whole()})},
		{Name: "KV group 0 left out", Plan: noGroup0},
	}
	if c.NExpert == 4 {
		ps = append(ps, placementtest.Named{Name: "expert 3 held by nobody", Plan: s.Plan("", placementtest.Stage{Lo: 0, Hi: L, Parts: []placementtest.Part{
			{Groups: G, FFNHi: F, Experts: []int{0, 1}},
			{FFNLo: F, FFNHi: F, Experts: []int{2}},
		}})})
	}
	return ps
}

// describe prints a plan's stages and members.
func describe(plan placement.Plan) string {
	s := ""
	for _, st := range plan.Pools[0].Stages {
		s += fmt.Sprintf(" [%d,%d)", st.Lo, st.Hi)
		if len(st.Members) > 1 {
			for _, m := range st.Members {
				s += fmt.Sprintf(" h%d-%d", m.HeadLo, m.HeadHi)
				if m.FFNHi > m.FFNLo {
					s += fmt.Sprintf("/f%d-%d", m.FFNLo, m.FFNHi)
				}
				if m.Experts != nil {
					s += fmt.Sprintf("/e%v", m.Experts)
				}
			}
		}
	}
	return s
}

// TestParallelStepDecode runs a TP group whose members all hold the
// embedding and the output through the runner's own Prompt and Decode,
// concurrently: every member returns the same logits, those of a single
// node; and once warm, a decode step of the group allocates nothing.
func TestParallelStepDecode(t *testing.T) {
	for name, spec := range map[string]synth.Spec{"dense-q4_k_m": denseQ4K, "moe-q4_0": moeQ40, "qwen2-f16": qwenF16} {
		t.Run(name, func(t *testing.T) {
			path := enginetest.Write(t, "", spec)
			ref := enginetest.OpenPath(t, path)
			c := &ref.Config
			single, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer single.Close()
			toks := enginetest.Tokens(9, c.NVocab, 3)
			prompt, decode := toks[:5], toks[5:]
			g := build(t, path, shapeOf(c).Plans("").Get("tp2"), true)
			st := &g.stages[0]
			got := make([][]float32, len(st.members))
			concurrently(t, st, func(r int, mb *member) error {
				l, err := mb.r.Prompt(1, prompt, []int{len(prompt) - 1})
				got[r] = l
				return err
			})
			want, err := single.Prompt(1, prompt, []int{len(prompt) - 1})
			if err != nil {
				t.Fatal(err)
			}
			check := func(step int) {
				t.Helper()
				for r := range got {
					if !slices.Equal(got[r], got[0]) {
						t.Fatalf("step %d: member %d's logits differ from member 0's", step, r)
					}
				}
				m := enginetest.Compare(want, got[0], c.NVocab)
				t.Logf("step %d: %s", step, m)
				if err := m.Check(enginetest.IsFloat(ref.File)); err != nil {
					t.Error(err)
				}
			}
			check(0)
			for i, tok := range decode {
				concurrently(t, st, func(r int, mb *member) error {
					l, err := mb.r.Decode(1, tok)
					got[r] = slices.Clone(l)
					return err
				})
				if want, err = single.Decode(1, tok); err != nil {
					t.Fatal(err)
				}
				check(i + 1)
			}

			// Allocation: members wait on channels, so a step is only
			// channel operations, the engine and the collective.
			type result struct{ err error }
			in := make([]chan int32, len(st.members))
			out := make([]chan result, len(st.members))
			for r, mb := range st.members {
				in[r], out[r] = make(chan int32), make(chan result)
				go func() {
					for tok := range in[r] {
						_, err := mb.r.Decode(2, tok)
						out[r] <- result{err}
					}
				}()
			}
			defer func() {
				for _, ch := range in {
					close(ch)
				}
			}()
			tok := int32(100)
			stepAll := func() {
				tok++
				for _, ch := range in {
					ch <- tok
				}
				for r, ch := range out {
					if res := <-ch; res.err != nil {
						t.Fatalf("member %d: %v", r, res.err)
					}
				}
			}
			stepAll()
			stepAll()
			if allocs := testing.AllocsPerRun(20, stepAll); allocs != 0 && !model.RaceEnabled {
				t.Errorf("a tensor-parallel decode step allocates %v times", allocs)
			}
		})
	}
}

// TestParallelRejectsMixedSplit builds a group whose members disagree on
// how attn_output is split (rank 0 holds no heads, a block-aligned empty
// column range; the others split a Q4_K block): every member's first
// Forward fails instead of waiting for collectives the others never make.
func TestParallelRejectsMixedSplit(t *testing.T) {
	path := enginetest.Write(t, "", denseQ4K)
	ref := enginetest.OpenPath(t, path)
	c := &ref.Config
	F := c.FFNDim()
	plan := shapeOf(c).Plan("", placementtest.Stage{Lo: 0, Hi: c.NLayer, Parts: []placementtest.Part{
		{Groups: 0, FFNLo: 0, FFNHi: F / 2},
		{Groups: 2, FFNLo: F / 2, FFNHi: F / 2},
		{Groups: 2, FFNLo: F / 2, FFNHi: F},
	}})
	g := build(t, path, plan, false)
	st := &g.stages[0]
	toks := []int32{1, 45, 499}
	errs := make([]error, len(st.members))
	x := make([]float32, len(toks)*c.NEmbd)
	if err := st.members[0].r.Embed(toks, x); err != nil {
		t.Fatal(err)
	}
	concurrently(t, st, func(r int, mb *member) error {
		b := model.Batch{Tokens: toks, Chunks: []model.Chunk{{Seq: 1, N: len(toks)}}}
		if err := mb.r.Reserve(&b); err != nil {
			return err
		}
		errs[r] = mb.r.Forward(&b, 0, c.NLayer, slices.Clone(x))
		return nil
	})
	for r, err := range errs {
		if err == nil {
			t.Errorf("member %d accepted a group that mixes column-split and gathered attn_output", r)
		} else if r == 0 {
			t.Logf("member 0: %v", err)
		}
	}
}

// TestParallelOverlap (issue #39): a tensor-parallel step of many tokens
// runs in two parts whose all-reduces overlap the other part's compute.
// Two sequences' prompts in one batch (the cut falls inside the first),
// then one more of each: the overlapped members give the logits of the
// same members run without overlap (Options.NoOverlap), which are a
// single node's within the tolerances (bitwise, but for the last place of
// a few rows); and a decode step after them too
// (the parts wrote the KV cache the later steps read).
func TestParallelOverlap(t *testing.T) {
	for name, spec := range map[string]synth.Spec{"dense-q4_k_m": denseQ4K, "qwen2-f16": qwenF16} {
		t.Run(name, func(t *testing.T) {
			path := enginetest.Write(t, "", spec)
			ref := enginetest.OpenPath(t, path)
			c := &ref.Config
			plan := shapeOf(c).Plans("").Get("tp2")
			toks := enginetest.Tokens(113, c.NVocab, 5)
			steps := []model.Batch{
				{Tokens: toks[:111], Chunks: []model.Chunk{{Seq: 1, N: 70}, {Seq: 2, N: 41}}},
				{Tokens: toks[111:113], Chunks: []model.Chunk{{Seq: 1, N: 1}, {Seq: 2, N: 1}}},
			}
			rows := [][]int{{69, 110}, {0, 1}}
			// dev is rank 1's device (the CPU when nil): every member cuts
			// its steps alike, whatever runs it.
			var dev device.Device
			run := func(t *testing.T, noOverlap bool, single bool) [][]float32 {
				var out [][]float32
				if single {
					r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 256})
					if err != nil {
						t.Fatal(err)
					}
					defer r.Close()
					for i := range steps {
						b := steps[i]
						b.Chunks = slices.Clone(b.Chunks)
						l, err := r.Step(&b, rows[i])
						if err != nil {
							t.Fatal(err)
						}
						out = append(out, slices.Clone(l))
					}
					return out
				}
				st := stage{lo: 0, hi: c.NLayer}
				colls := newGroup(2)
				for r, pm := range plan.Pools[0].Stages[0].Members {
					spec := shard.SpecsFor(plan, pm.Node, "")[0]
					spec.Embedding, spec.Output = true, true
					o := model.Options{Threads: 1, CacheTokens: 256, Collective: colls[r], NoOverlap: noOverlap}
					if r == 1 {
						o.Device = dev
					}
					mb, err := openMember(path, spec, o)
					if err != nil {
						t.Fatal(err)
					}
					defer func() { mb.r.Close(); mb.sh.Close() }()
					st.members = append(st.members, mb)
				}
				for i := range steps {
					got := make([][]float32, 2)
					concurrently(t, &st, func(r int, mb *member) error {
						b := steps[i]
						b.Chunks = slices.Clone(b.Chunks)
						l, err := mb.r.Step(&b, rows[i])
						got[r] = slices.Clone(l)
						return err
					})
					// Members on one kind of device compute the same logits
					// (on different devices, each its own output matrix's).
					if dev == nil && !slices.Equal(got[0], got[1]) {
						t.Fatalf("step %d: the members' logits differ", i)
					}
					out = append(out, got[1])
				}
				return out
			}
			over, plain, one := run(t, false, false), run(t, true, false), run(t, false, true)
			t.Run("rank 1 on vulkan", func(t *testing.T) {
				dev = vulkan.Device{GPU: enginetest.VulkanOrSkip(t)}
				mixed := run(t, false, false)
				for i := range steps {
					m := enginetest.Compare(one[i], mixed[i], c.NVocab)
					t.Logf("step %d: overlapped, rank 1 on Vulkan, vs one node: %s", i, m)
					if err := m.Check(enginetest.IsFloat(ref.File)); err != nil {
						t.Error(err)
					}
				}
			})
			for i := range steps {
				// The matrix kernels round a row alike in batches of any
				// size up to their tiles' tails, so parts give the same
				// logits to a few units in the last place.
				if m := enginetest.Compare(plain[i], over[i], c.NVocab); m.NRMSE > 1e-5 {
					t.Errorf("step %d: overlapped logits are not those without overlap: %s", i, m)
				}
				m := enginetest.Compare(one[i], over[i], c.NVocab)
				t.Logf("step %d: overlapped vs one node: %s", i, m)
				if err := m.Check(enginetest.IsFloat(ref.File)); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
