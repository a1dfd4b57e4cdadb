package parallel

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/engine/sample"
	"shoal/engine/synth"
	"shoal/placement"
	"shoal/placement/placementtest"
	"shoal/shard"
	"shoal/transport"
	"shoal/transport/transporttest"
)

// denseQ8 is the model of the tests of one plan: 4 layers of Q8_0, 4 KV
// groups of 2 heads.
var denseQ8 = synth.Spec{Name: "dense-q8_0", Arch: "llama", NEmbd: 128, NLayer: 4, NHead: 8, NHeadKV: 4,
	NFF: 352, Type: "q8_0", Seed: 31, Std: 0.08}

// shapeOf is what placementtest needs of c.
func shapeOf(c *model.Config) placementtest.Shape {
	return placementtest.Shape{Layers: c.NLayer, Heads: c.NHead, KVHeads: c.NHeadKV, FFN: c.FFNDim(), Experts: c.NExpert}
}

// cluster is an in-process cluster: one endpoint, host and member per
// node of a plan, the driver on the first node's host.
type cluster struct {
	eps     []*transport.Endpoint
	hosts   []*Host
	members []*Member
	shards  []*shard.Shard
	drv     *Cluster
}

func startCluster(t *testing.T, path string, plan placement.Plan, opt Options) *cluster {
	t.Helper()
	return startClusterCache(t, path, plan, opt, 128)
}

// startClusterCache is startCluster with members of cacheTokens KV
// positions.
func startClusterCache(t testing.TB, path string, plan placement.Plan, opt Options, cacheTokens int) *cluster {
	t.Helper()
	var nodes []string
	for _, st := range plan.Pools[0].Stages {
		for _, m := range st.Members {
			nodes = append(nodes, m.Node)
		}
	}
	cl := &cluster{}
	t.Cleanup(cl.close)
	addrs := map[string]string{}
	for _, n := range nodes {
		ep := listen(t, n)
		cl.eps = append(cl.eps, ep)
		cl.hosts = append(cl.hosts, NewHost(ep, nil, nil))
		addrs[n] = ep.Addr().String()
	}
	for i, n := range nodes {
		for _, spec := range shard.SpecsFor(plan, n, "") {
			sh, err := shard.Open(path, spec)
			if err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			cl.shards = append(cl.shards, sh)
			m, err := sh.Model()
			if err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			mb, err := cl.hosts[i].AddMember(MemberConfig{Plan: plan, Node: n, Addrs: addrs, Spec: spec, Model: m, Threads: 1, CacheTokens: cacheTokens})
			if err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			cl.members = append(cl.members, mb)
		}
	}
	var err error
	cl.drv, err = cl.hosts[0].NewCluster(plan, addrs, opt)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// addrs maps the plan's nodes to their endpoints.
func (cl *cluster) addrs() map[string]string {
	out := map[string]string{}
	for _, m := range cl.members {
		out[m.me.Node] = m.me.Addr
	}
	return out
}

// extraHost starts a host on a new endpoint that is not in the plan.
func (cl *cluster) extraHost(t *testing.T) *Host {
	t.Helper()
	ep := listen(t, "driver")
	cl.eps = append(cl.eps, ep)
	h := NewHost(ep, nil, nil)
	cl.hosts = append(cl.hosts, h)
	return h
}

var testCA = sync.OnceValue(func() *transport.CA { return transporttest.CA("dist-test-secret-0123456789") })

// listen opens an endpoint on loopback with a certificate for node.
func listen(t testing.TB, node string) *transport.Endpoint {
	t.Helper()
	return transporttest.Listen(t, testCA(), node)
}

func (cl *cluster) close() {
	for _, h := range cl.hosts {
		h.Close()
	}
	for _, ep := range cl.eps {
		ep.Close()
	}
	for _, sh := range cl.shards {
		sh.Close()
	}
}

func allRows(n int) []int {
	rows := make([]int, n)
	for i := range rows {
		rows[i] = i
	}
	return rows
}

// generate runs the prompt (logits of every row) and then one decode
// step per token of decode through s, returning all logits and the
// cluster's counters after the prompt.
func generate(t *testing.T, cl *Cluster, s *Session, seq kv.SeqID, prompt, decode []int32) ([]float32, Stats) {
	t.Helper()
	ctx := context.Background()
	b := model.Batch{Tokens: prompt, Chunks: []model.Chunk{{Seq: seq, N: len(prompt)}}}
	l, err := s.Step(ctx, &b, allRows(len(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	got := append([]float32(nil), l...)
	afterPrompt := cl.Stats()
	for i, tok := range decode {
		b := model.Batch{Tokens: []int32{tok}, Chunks: []model.Chunk{{Seq: seq, N: 1}}}
		l, err := s.Step(ctx, &b, []int{0})
		if err != nil {
			t.Fatal(err)
		}
		if b.Chunks[0].Pos != len(prompt)+i {
			t.Fatalf("decode step %d went to position %d, want %d", i, b.Chunks[0].Pos, len(prompt)+i)
		}
		got = append(got, l...)
	}
	return got, afterPrompt
}

// TestPlans runs synthetic models (and the oracle's when ../shared is
// there) through pipeline, tensor-, pipeline x tensor- and
// expert-parallel plans on an in-process cluster over QUIC: the prompt
// (a pipelined prefill where the plan has several stages), then a few
// decode steps, compared with a single node. A perturbed weight
// under the last plan must not pass.
func TestPlans(t *testing.T) {
	for _, c := range enginetest.Cases(t) {
		t.Run(c.Name, func(t *testing.T) {
			ref := enginetest.OpenPath(t, c.Path)
			want := enginetest.Reference(t, ref, &c)
			ps := shapeOf(&ref.Config).Plans(c.Name)
			dt := wireOf(ref)
			for _, p := range ps {
				t.Run(p.Name, func(t *testing.T) {
					m, wire, err := runPlan(t, c.Path, p.Plan, &c, want, ref.NVocab, dt)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("DIST %-16s %-15s %s", c.Name, p.Name, m)
					t.Logf("WIRE %-16s %-15s %s", c.Name, p.Name, wire)
					if err := m.Check(c.Float); err != nil {
						t.Error(err)
					}
				})
			}
			p := ps[len(ps)-1]
			perturbed := enginetest.Perturb(t, c.Path, fmt.Sprintf("blk.%d.attn_output.weight", ref.NLayer-1))
			m, _, err := runPlan(t, perturbed, p.Plan, &c, want, ref.NVocab, dt)
			if err == nil {
				if err = m.Check(c.Float); err == nil {
					t.Errorf("%s on a perturbed attn_output gives a single node's logits (%s)", p.Name, m)
				}
			}
			t.Logf("MUTANT %-16s %-15s perturbed attn_output: %v", c.Name, p.Name, err)
		})
	}
}

// runPlan runs the case through plan on an in-process cluster serving the
// model at path and compares the logits with want; wire describes the
// bytes sent.
func runPlan(t *testing.T, path string, plan placement.Plan, c *enginetest.Case, want []float32, nVocab int, dt transport.DType) (m enginetest.Metrics, wire string, err error) {
	// Pieces of 3 tokens: every prompt through a plan of several stages is
	// a pipelined prefill (issue #39: logits unchanged with it on).
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second, Activations: dt, Collectives: dt, Piece: 3})
	ctx := context.Background()
	s, err := cl.drv.Open(ctx)
	if err != nil {
		return m, "", err
	}
	defer s.Close(ctx)
	const seq = 3
	got, pst := generate(t, cl.drv, s, seq, c.Prompt, c.Decode)
	wire = fmt.Sprintf("prompt %s; decode %s", describeStats(pst), describeStats(cl.drv.Stats().Sub(pst)))
	return enginetest.Compare(want, got, nVocab), wire, s.Free(ctx, seq)
}

// wireOf is the wire encoding a node serves m with (node.wireFor): the
// default (f16; 0 here), but f32 for f32 weights, whose logits are held to
// the float tolerance.
func wireOf(m *model.Model) transport.DType {
	for _, ly := range m.W.Layers {
		if ly.Wq != nil {
			if ly.Wq.Type == quant.F32 {
				return transport.F32
			}
			return 0
		}
	}
	return 0
}

// openRef writes denseQ8 and opens it (closed with the test); it returns
// the model with its path.
func openRef(t *testing.T) (*model.Model, string) {
	t.Helper()
	path := enginetest.Write(t, "", denseQ8)
	return enginetest.OpenPath(t, path), path
}

func describeStats(st Stats) string {
	return fmt.Sprintf("%.0f B/token (%d tokens: control %d, activations %d, collectives %d, logits %d)",
		st.BytesPerToken(), st.Tokens, st.Control, st.Activations, st.Collectives, st.Logits)
}

// TestWireDTypes runs a pipeline x tensor plan with hidden states and
// all-reduces encoded as f16 and as q8_0 on the wire: fewer bytes, logits
// still within the quantized-model tolerances of a single node.
func TestWireDTypes(t *testing.T) {
	ref, path := openRef(t)
	c := &ref.Config
	toks := enginetest.Tokens(9, ref.NVocab, 5)
	tc := enginetest.Case{Prompt: toks[:6], Decode: toks[6:]}
	want := enginetest.Reference(t, ref, &tc)
	plan := shapeOf(c).Plans(denseQ8.Name).Get("pp2xtp2")
	for _, dt := range []transport.DType{transport.F32, transport.F16, transport.Q8_0} {
		t.Run(dt.String(), func(t *testing.T) {
			cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second, Activations: dt, Collectives: dt})
			s, err := cl.drv.Open(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			got, pst := generate(t, cl.drv, s, 1, tc.Prompt, tc.Decode)
			m := enginetest.Compare(want, got, ref.NVocab)
			t.Logf("%v: %s; decode %s", dt, m, describeStats(cl.drv.Stats().Sub(pst)))
			if err := m.Check(false); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestBatchedSequences steps several sequences through one session:
// prefill chunks and decode tokens of different sequences in one batch,
// a sequence freed on every member and started again, compared with a
// single node running the same batches.
func TestBatchedSequences(t *testing.T) {
	ref, path := openRef(t)
	c := &ref.Config
	single, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	plan := shapeOf(c).Plans(denseQ8.Name).Get("pp2xtp2")
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second})
	ctx := context.Background()
	s, err := cl.drv.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	type step struct {
		chunks []model.Chunk
		tokens []int32
		rows   []int
		free   []kv.SeqID // freed before the step
		pos    []int      // the chunks' positions
	}
	steps := []step{
		{chunks: []model.Chunk{{Seq: 1, N: 5}}, tokens: []int32{1, 450, 496, 173, 170}, rows: []int{4}, pos: []int{0}},
		{chunks: []model.Chunk{{Seq: 2, N: 4}, {Seq: 1, N: 1}}, tokens: []int32{1, 299, 432, 172, 97}, rows: []int{3, 4}, pos: []int{0, 5}},
		{chunks: []model.Chunk{{Seq: 1, N: 1}, {Seq: 2, N: 1}, {Seq: 3, N: 2}}, tokens: []int32{278, 112, 1, 51}, rows: []int{0, 1, 2, 3}, pos: []int{6, 4, 0}},
		{free: []kv.SeqID{1}, chunks: []model.Chunk{{Seq: 1, N: 3}, {Seq: 3, N: 1}}, tokens: []int32{1, 298, 287, 296}, rows: []int{2, 3}, pos: []int{0, 2}},
	}
	for i, st := range steps {
		if len(st.free) > 0 {
			if err := s.Free(ctx, st.free...); err != nil {
				t.Fatal(err)
			}
			for _, q := range st.free {
				single.Cache().Free(q)
			}
		}
		wb := model.Batch{Tokens: st.tokens, Chunks: slices.Clone(st.chunks)}
		want, err := single.Step(&wb, st.rows)
		if err != nil {
			t.Fatal(err)
		}
		gb := model.Batch{Tokens: st.tokens, Chunks: slices.Clone(st.chunks)}
		got, err := s.Step(ctx, &gb, st.rows)
		if err != nil {
			t.Fatal(err)
		}
		for j, ch := range gb.Chunks {
			if ch.Pos != st.pos[j] || wb.Chunks[j].Pos != st.pos[j] {
				t.Errorf("step %d chunk %d at position %d (single node %d), want %d", i, j, ch.Pos, wb.Chunks[j].Pos, st.pos[j])
			}
		}
		m := enginetest.Compare(want, got, c.NVocab)
		t.Logf("step %d: %s", i, m)
		if err := m.Check(false); err != nil {
			t.Error(err)
		}
	}
}

// TestSampledSteps generates two sequences of seeded samples through a
// pipeline whose last stage is on another node: one from the logits the
// driver receives, one sampled by the last stage (StepSampled, the way a
// driver serves). The tokens are the same, and the sampled steps send no
// logits: a few hundred bytes of request and token instead of a
// vocabulary row (128 KB for a 32,000-token vocabulary).
func TestSampledSteps(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	cl := startCluster(t, path, plan, Options{Timeout: 10 * time.Second, Activations: transport.F32, Collectives: transport.F32})
	ctx := context.Background()
	s, err := cl.drv.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if !s.SamplesRemotely() {
		t.Fatal("the pipeline's last stage is on another node, yet SamplesRemotely is false")
	}
	p := sample.Params{Temperature: 0.9, TopK: 20, TopP: 0.95, RepeatPenalty: 1.2, RepeatLastN: 8, Seed: 42}
	prompt := []int32{1, 450, 496, 173, 170}
	run := func(seq kv.SeqID, remote bool) ([]int32, Stats) {
		sm := sample.New(p, ref.NVocab)
		toks := slices.Clone(prompt)
		b := model.Batch{Tokens: prompt, Chunks: []model.Chunk{{Seq: seq, N: len(prompt)}}}
		row := []int{len(prompt) - 1}
		before := cl.drv.Stats()
		for range 16 {
			var tok int32
			if remote {
				res, err := s.StepSampled(ctx, &b, row, []sample.Request{sm.Request(toks, true, 2)})
				if err != nil {
					t.Fatal(err)
				}
				if err := sm.Adopt(&res[0]); err != nil {
					t.Fatal(err)
				}
				if len(res[0].Top) != 2 || res[0].Logprob > 0 {
					t.Fatalf("log-probabilities %v %v", res[0].Logprob, res[0].Top)
				}
				tok = res[0].Token
			} else {
				l, err := s.Step(ctx, &b, row)
				if err != nil {
					t.Fatal(err)
				}
				tok = sm.Sample(l, toks)
			}
			toks = append(toks, tok)
			b = model.Batch{Tokens: []int32{tok}, Chunks: []model.Chunk{{Seq: seq, N: 1}}}
			row = []int{0}
		}
		return toks[len(prompt):], cl.drv.Stats().Sub(before)
	}
	want, viaLogits := run(1, false)
	got, sampled := run(2, true)
	t.Logf("logits to the driver: %s", describeStats(viaLogits))
	t.Logf("sampled on the last stage: %s", describeStats(sampled))
	if !slices.Equal(got, want) {
		t.Fatalf("sampled on the last stage %v, from the driver's logits %v", got, want)
	}
	if sampled.Logits != 0 || viaLogits.Logits == 0 {
		t.Fatalf("logits bytes: %d sampling remotely, %d not", sampled.Logits, viaLogits.Logits)
	}
	// This model's rows are 2 KB (512 tokens); a request and its token
	// cost a few hundred bytes of control, whatever the vocabulary.
	if extra := (sampled.Control - viaLogits.Control) / 16; sampled.Bytes() >= viaLogits.Bytes() || extra > 1024 {
		t.Fatalf("sampling remotely sent %d bytes (%d more control a step), logits %d", sampled.Bytes(), extra, viaLogits.Bytes())
	}
}

// TestMemberDies closes one member's endpoint between the decode steps of
// a generation: the next step fails within the timeout naming that
// member, the session stays unusable, and the surviving members finish
// their part of the step and release the session without leaking
// goroutines.
func TestMemberDies(t *testing.T) {
	ref, path := openRef(t)
	c := ref.Config
	ps := shapeOf(&c).Plans(denseQ8.Name)
	for _, tc := range []struct {
		name   string
		plan   string
		victim int // index of the member (node) closed
		piece  int // Options.Piece: 1 cuts every step of several tokens into steps of one
	}{
		{"pp3, middle stage", "pp3", 1, 0},
		{"pp2xtp2, stage 1 rank 1", "pp2xtp2", 3, 0},
		{"pp2xtp2, stage 0 rank 0", "pp2xtp2", 0, 0},
		{"pp3, middle stage, pipelined prefill", "pp3", 1, 1},
		{"pp2xtp2, stage 1 rank 1, pipelined prefill", "pp2xtp2", 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Members give up at 3/4 of it, so that their error, which
			// names the dead peer, reaches the driver first. With 2 s, the
			// 0.5 s margin was once not enough while CI ran other packages
			// beside this one: the driver's own deadline hit first and its
			// error named a survivor.
			const timeout = 3 * time.Second
			plan := ps.Get(tc.plan)
			cl := startCluster(t, path, plan, Options{Timeout: timeout})
			// Drive from a host that is not in the plan, so any member
			// may die.
			drvHost := cl.extraHost(t)
			drv, err := drvHost.NewCluster(plan, cl.addrs(), Options{Timeout: timeout, Piece: tc.piece})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			toks := enginetest.Tokens(9, c.NVocab, 5)
			var s *Session
			step := func(tok []int32) error {
				b := model.Batch{Tokens: tok, Chunks: []model.Chunk{{Seq: 1, N: len(tok)}}}
				_, err := s.Step(ctx, &b, []int{len(tok) - 1})
				return err
			}
			// A first session opens the connections and streams between
			// the nodes, which outlive it.
			if s, err = drv.Open(ctx); err != nil {
				t.Fatal(err)
			}
			if err := step(toks[:5]); err != nil {
				t.Fatal(err)
			}
			s.Close(ctx)
			time.Sleep(50 * time.Millisecond)
			baseline := runtime.NumGoroutine()
			if s, err = drv.Open(ctx); err != nil {
				t.Fatal(err)
			}
			if err := step(toks[:5]); err != nil {
				t.Fatal(err)
			}
			for _, tok := range toks[5:7] {
				if err := step([]int32{tok}); err != nil {
					t.Fatal(err)
				}
			}
			victim := cl.members[tc.victim]
			cl.eps[tc.victim].Close()
			start := time.Now()
			if tc.piece > 0 {
				err = step(toks[7:9]) // two pieces of one token, sent at once
			} else {
				err = step(toks[7:8])
			}
			elapsed := time.Since(start)
			t.Logf("step after closing %v failed after %v: %v", victim.me, elapsed.Round(time.Millisecond), err)
			if err == nil {
				t.Fatal("a step with a dead member succeeded")
			}
			if elapsed >= 2*timeout {
				t.Errorf("the step failed after %v, want < %v", elapsed, 2*timeout)
			}
			if !strings.Contains(err.Error(), victim.me.Node) {
				t.Errorf("the error does not name node %s", victim.me.Node)
			}
			if err2 := step(toks[8:9]); err2 == nil || s.Err() == nil {
				t.Error("the session is usable after a failed step")
			}
			// The survivors give up on the step at once (the driver
			// aborts it), not at their timeout, and stay up.
			deadline := time.Now().Add(timeout)
			for i, m := range cl.members {
				if i == tc.victim {
					continue
				}
				for m.Busy() > 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if m.Busy() > 0 {
					t.Errorf("%v still runs the failed step after %v", m.me, timeout)
				}
			}
			s.Close(ctx)
			for i, m := range cl.members {
				if i != tc.victim && m.Sessions() != 0 {
					t.Errorf("%v keeps %d sessions after close", m.me, m.Sessions())
				}
			}
			// Goroutines: back to where they were before the session
			// (fewer: the connections to the dead node end).
			var n int
			for end := time.Now().Add(3 * timeout); ; time.Sleep(20 * time.Millisecond) {
				if n = runtime.NumGoroutine(); n <= baseline || time.Now().After(end) {
					break
				}
			}
			t.Logf("goroutines: %d before the session, %d after", baseline, n)
			if n > baseline {
				t.Errorf("%d goroutines leaked", n-baseline)
			}
			// The surviving hosts still serve: a new session reaches
			// them (and fails on the dead member only).
			if s2, err := drv.Open(ctx); err == nil {
				s2.Close(ctx)
				t.Error("a session opened with a dead member")
			} else if !strings.Contains(err.Error(), victim.me.Node) {
				t.Errorf("opening a session with a dead member: %v (does not name %s)", err, victim.me.Node)
			}
		})
	}
}
