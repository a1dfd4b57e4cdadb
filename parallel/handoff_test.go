package parallel

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"shoal/engine/enginetest"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/placement"
	"shoal/placement/placementtest"
	"shoal/serve"
	"shoal/serve/servetest"
	"shoal/shard"
	"shoal/transport"
)

// memNet is an in-process KVLink network for the tests of the runtime's
// side of a handoff (package disagg tests the link on kv streams).
type memNet struct {
	mu      sync.Mutex
	inboxes map[string]map[uint64]*memInbox // host address -> transfer -> inbox
	pieces  int
	bytes   int64
	// corrupt, when it returns true for a piece, makes the receiving
	// inbox fail as on a corrupt frame; stall makes its Send block until
	// the sender's context ends (a link that stopped moving), and tells
	// stalled of it.
	corrupt func(p *KVPiece) bool
	stall   func(p *KVPiece) bool
	stalled chan struct{}
}

type memLink struct {
	net  *memNet
	addr string
}

type memInbox struct {
	net  *memNet
	addr string
	id   uint64
	ch   chan *KVPiece
	bad  chan error
}

type memSender struct {
	net *memNet
	id  uint64
}

func (n *memNet) link(addr string) KVLink { return &memLink{net: n, addr: addr} }

func (l *memLink) Sender(id uint64) KVSender { return &memSender{net: l.net, id: id} }

func (l *memLink) Receive(id uint64) KVInbox {
	in := &memInbox{net: l.net, addr: l.addr, id: id, ch: make(chan *KVPiece, 4096), bad: make(chan error, 1)}
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	if l.net.inboxes == nil {
		l.net.inboxes = map[string]map[uint64]*memInbox{}
	}
	if l.net.inboxes[l.addr] == nil {
		l.net.inboxes[l.addr] = map[uint64]*memInbox{}
	}
	l.net.inboxes[l.addr][id] = in
	return in
}

func (s *memSender) Send(ctx context.Context, addr string, p *KVPiece) error {
	s.net.mu.Lock()
	in := s.net.inboxes[addr][s.id]
	if in != nil {
		s.net.pieces++
		s.net.bytes += int64(2 * (len(p.K) + len(p.V)))
	}
	s.net.mu.Unlock()
	if in == nil {
		return fmt.Errorf("kv transfer %d is not expected at %s", s.id, addr)
	}
	if s.net.stall != nil && s.net.stall(p) {
		if s.net.stalled != nil {
			select {
			case s.net.stalled <- struct{}{}:
			default:
			}
		}
		<-ctx.Done()
		return ctx.Err()
	}
	if s.net.corrupt != nil && s.net.corrupt(p) {
		select {
		case in.bad <- fmt.Errorf("kv frame: checksum mismatch (layer %d)", p.Layer):
		default:
		}
		return nil
	}
	select {
	case in.ch <- p:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *memSender) Close(ctx context.Context) error { return nil }

func (in *memInbox) Next(ctx context.Context) (*KVPiece, error) {
	select {
	case err := <-in.bad:
		return nil, err
	case p := <-in.ch:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (in *memInbox) Close() {
	in.net.mu.Lock()
	defer in.net.mu.Unlock()
	delete(in.net.inboxes[in.addr], in.id)
}

// pools is an in-process cluster running every pool of a plan, every host
// on the same in-process KV network; the driver is the first host.
type pools struct {
	*cluster
	net   *memNet
	addrs map[string]string
	wire  transport.DType // as the node serves the model (wireOf)
}

func startPools(t *testing.T, path string, plan placement.Plan) *pools {
	t.Helper()
	cl := &cluster{}
	t.Cleanup(cl.close)
	p := &pools{cluster: cl, net: &memNet{}, addrs: map[string]string{}}
	var nodes []string
	for _, pool := range plan.Pools {
		for _, st := range pool.Stages {
			for _, m := range st.Members {
				if p.addrs[m.Node] == "" {
					ep := listen(t, m.Node)
					cl.eps = append(cl.eps, ep)
					h := NewHost(ep, nil, nil)
					h.SetKVLink(p.net.link(ep.Addr().String()))
					cl.hosts = append(cl.hosts, h)
					p.addrs[m.Node] = ep.Addr().String()
					nodes = append(nodes, m.Node)
				}
			}
		}
	}
	for i, n := range nodes {
		for _, pool := range plan.Pools {
			only := plan
			only.Pools = []placement.Pool{pool}
			for _, spec := range shard.SpecsFor(only, n, "") {
				sh, err := shard.Open(path, spec)
				if err != nil {
					t.Fatalf("%s: %v", n, err)
				}
				cl.shards = append(cl.shards, sh)
				m, err := sh.Model()
				if err != nil {
					t.Fatalf("%s: %v", n, err)
				}
				p.wire = wireOf(m)
				mb, err := cl.hosts[i].AddMember(MemberConfig{Plan: plan, Pool: pool.Role, Node: n, Addrs: p.addrs, Spec: spec, Model: m, Threads: 1, CacheTokens: 128})
				if err != nil {
					t.Fatalf("%s (%s pool): %v", n, pool.Role, err)
				}
				cl.members = append(cl.members, mb)
			}
		}
	}
	return p
}

// open opens a session over the plan's pool role, driven from the first
// host.
func (p *pools) open(t *testing.T, plan placement.Plan, role string) (*Cluster, *Session) {
	return p.openTimeout(t, plan, role, 10*time.Second)
}

// openTimeout is open with the given step timeout.
func (p *pools) openTimeout(t *testing.T, plan placement.Plan, role string, timeout time.Duration) (*Cluster, *Session) {
	t.Helper()
	c, err := p.hosts[0].NewCluster(plan, p.addrs, Options{Pool: role, Timeout: timeout, Activations: p.wire, Collectives: p.wire})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return c, s
}

// TestHandoff (issue 22, must-show 1): every case's prompt is prefilled on
// a prefill pool, in two chunks, while its KV streams layer by layer to a
// decode pool that splits layers and KV heads differently; the decode pool
// then decodes. The prompt's logits (from the prefill pool) and every
// decode step's (from the decode pool) match a single node's within the
// case's tolerances, and the pieces carried exactly the KV of the decode
// pool's layers and heads. A perturbed weight on the decode side must not
// pass.
func TestHandoff(t *testing.T) {
	for _, c := range enginetest.Cases(t) {
		t.Run(c.Name, func(t *testing.T) {
			ref := enginetest.OpenPath(t, c.Path)
			want := enginetest.Reference(t, ref, &c)
			ps := shapeOf(&ref.Config).Plans(c.Name)
			combos := [][2]string{{"pp2", "tp3"}, {"tp2", "pp2xtp2"}}
			for _, combo := range combos {
				plan := placementtest.Disagg(ps.Get(combo[0]), ps.Get(combo[1]))
				t.Run(combo[0]+"->"+combo[1], func(t *testing.T) {
					m, moved, err := runHandoff(t, c.Path, plan, &c, want, ref.NVocab)
					if err != nil {
						t.Fatal(err)
					}
					kvBytes := decodeKV(plan, &ref.Config, len(c.Prompt), quant.F16)
					t.Logf("HANDOFF %-16s %-15s %s; KV moved %d bytes for %d prompt tokens (%.0f B/token, the model's KV is %d B/token)",
						c.Name, combo[0]+"->"+combo[1], m, moved, len(c.Prompt), float64(moved)/float64(len(c.Prompt)), ref.NLayer*ref.KVDim()*4)
					if moved != kvBytes {
						t.Errorf("the handoff moved %d bytes of KV, the decode members hold %d of the prompt's", moved, kvBytes)
					}
					if err := m.Check(c.Float); err != nil {
						t.Error(err)
					}
				})
			}
			plan := placementtest.Disagg(ps.Get("pp2"), ps.Get("tp3"))
			perturbed := enginetest.Perturb(t, c.Path, fmt.Sprintf("blk.%d.attn_output.weight", ref.NLayer-1))
			m, _, err := runHandoff(t, perturbed, plan, &c, want, ref.NVocab)
			if err == nil {
				if err = m.Check(c.Float); err == nil {
					t.Errorf("a handoff on a perturbed attn_output gives a single node's logits (%s)", m)
				}
			}
		})
	}
}

// TestHandoffQuantizedKV: with the plan's KV cache in Q8_0 or Q4_0, a
// prompt prefilled on the prefill pool hands its quantized rows to a decode
// pool that splits layers and heads differently, unchanged: the logits
// are a single node's with that cache (within the quantized tolerances), and
// the pieces carry the quantized bytes (34 or 18 bytes per 32 values, not
// F16's 64).
func TestHandoffQuantizedKV(t *testing.T) {
	for _, c := range enginetest.Cases(t) {
		ref := enginetest.OpenPath(t, c.Path)
		if ref.HeadDim%32 != 0 {
			continue // a quantized cache needs heads of a multiple of 32
		}
		ps := shapeOf(&ref.Config).Plans(c.Name)
		for _, kt := range []quant.Type{quant.Q8_0, quant.Q4_0} {
			t.Run(c.Name+"/"+strings.ToLower(kt.String()), func(t *testing.T) {
				want := enginetest.ReferenceKV(t, ref, &c, kt)
				plan := placementtest.Disagg(ps.Get("pp2"), ps.Get("tp3"))
				plan.KVType = strings.ToLower(kt.String())
				m, moved, err := runHandoff(t, c.Path, plan, &c, want, ref.NVocab)
				if err != nil {
					t.Fatal(err)
				}
				kvBytes := decodeKV(plan, &ref.Config, len(c.Prompt), kt)
				t.Logf("HANDOFF %-16s %s cache: %s; KV moved %d bytes", c.Name, kt, m, moved)
				if moved != kvBytes {
					t.Errorf("the handoff moved %d bytes of KV, the decode members hold %d of the prompt's in %s", moved, kvBytes, kt)
				}
				// A quantized cache rounds K and V to 8 or 4 bits: the
				// members' partial sums' order moves a value across a
				// rounding step now and then, so the quantized
				// tolerances apply whatever the weights.
				if err := m.Check(false); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

// decodeKV is the bytes of K and V for n positions that plan's decode
// members hold, in cache type kt: each gets the KV heads it holds (all of
// them once, plus a copy per member replicating a head, for a model of
// fewer KV heads than members).
func decodeKV(plan placement.Plan, c *model.Config, n int, kt quant.Type) int64 {
	var b int64
	for _, st := range plan.Pool(placement.RoleDecode).Stages {
		for _, dm := range st.Members {
			lo, hi := 0, c.NHeadKV
			if dm.TPSize > 1 {
				lo, hi = (&model.Slice{HeadLo: dm.HeadLo, HeadHi: dm.HeadHi}).KVHeads(c)
			}
			b += int64(n) * int64(st.Hi-st.Lo) * int64(kt.RowSize((hi-lo)*c.HeadDim)) * 2
		}
	}
	return b
}

// runHandoff prefills c's prompt on plan's prefill pool in two chunks,
// handing the KV to its decode pool, decodes there, and compares with
// want; moved is the KV payload the pieces carried.
func runHandoff(t *testing.T, path string, plan placement.Plan, c *enginetest.Case, want []float32, nVocab int) (enginetest.Metrics, int64, error) {
	p := startPools(t, path, plan)
	_, pre := p.open(t, plan, placement.RolePrefill)
	_, dec := p.open(t, plan, placement.RoleDecode)
	ctx := context.Background()
	const seq = kv.SeqID(5)
	var got []float32
	half := max(1, len(c.Prompt)/2)
	for _, part := range [][]int32{c.Prompt[:half], c.Prompt[half:]} {
		if len(part) == 0 {
			continue
		}
		b := model.Batch{Tokens: part, Chunks: []model.Chunk{{Seq: seq, N: len(part)}}}
		l, err := pre.Handoff(ctx, dec, &b, allRows(len(part)))
		if err != nil {
			return enginetest.Metrics{}, 0, err
		}
		got = append(got, l...)
	}
	if err := pre.Free(ctx, seq); err != nil {
		return enginetest.Metrics{}, 0, err
	}
	for i, tok := range c.Decode {
		b := model.Batch{Tokens: []int32{tok}, Chunks: []model.Chunk{{Seq: seq, N: 1}}}
		l, err := dec.Step(ctx, &b, []int{0})
		if err != nil {
			return enginetest.Metrics{}, 0, err
		}
		if b.Chunks[0].Pos != len(c.Prompt)+i {
			t.Fatalf("decode step %d went to position %d, want %d", i, b.Chunks[0].Pos, len(c.Prompt)+i)
		}
		got = append(got, l...)
	}
	p.net.mu.Lock()
	moved := p.net.bytes
	p.net.mu.Unlock()
	return enginetest.Compare(want, got, nVocab), moved, dec.Free(ctx, seq)
}

// TestHandoffFailure: a KV frame of the last layer arrives corrupt at a
// decode member. The handoff fails with the member's error, every decode
// member gives the positions back, the decode session stays usable, and
// the same prompt handed off again decodes as a single node does.
func TestHandoffFailure(t *testing.T) {
	ref, path := openRef(t)
	sh := shapeOf(&ref.Config)
	ps := sh.Plans("dense")
	plan := placementtest.Disagg(ps.Get("pp2"), ps.Get("tp2"))
	p := startPools(t, path, plan)
	_, pre := p.open(t, plan, placement.RolePrefill)
	_, dec := p.open(t, plan, placement.RoleDecode)
	ctx := context.Background()
	prompt := []int32{1, 5, 9, 13, 17, 21, 25}
	p.net.corrupt = func(pc *KVPiece) bool { return pc.Layer == ref.NLayer-1 }
	const seq = kv.SeqID(2)
	b := model.Batch{Tokens: prompt, Chunks: []model.Chunk{{Seq: seq, N: len(prompt)}}}
	_, err := pre.Handoff(ctx, dec, &b, []int{len(prompt) - 1})
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("a handoff with a corrupt frame: %v", err)
	}
	t.Logf("the failed handoff: %v", err)
	for _, m := range p.members {
		if m.lay.Pool != placement.RoleDecode {
			continue
		}
		m.mu.Lock()
		for _, s := range m.sessions {
			if n := s.runner.Cache().Len(seq); n != 0 {
				t.Errorf("%v holds %d positions of the failed handoff", m.me, n)
			}
		}
		m.mu.Unlock()
	}
	if err := dec.Err(); err != nil {
		t.Fatalf("the decode session after a failed handoff: %v", err)
	}
	// Again, on a sound link: the prefill session starts the sequence over.
	p.net.corrupt = nil
	if err := pre.Free(ctx, seq); err != nil {
		t.Fatal(err)
	}
	b = model.Batch{Tokens: prompt, Chunks: []model.Chunk{{Seq: seq, N: len(prompt)}}}
	got, err := pre.Handoff(ctx, dec, &b, []int{len(prompt) - 1})
	if err != nil {
		t.Fatal(err)
	}
	got = append([]float32(nil), got...)
	next := []int32{30, 31, 32}
	for _, tok := range next {
		b := model.Batch{Tokens: []int32{tok}, Chunks: []model.Chunk{{Seq: seq, N: 1}}}
		l, err := dec.Step(ctx, &b, []int{0})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l...)
	}
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want, err := r.Prompt(0, prompt, []int{len(prompt) - 1})
	if err != nil {
		t.Fatal(err)
	}
	want = append([]float32(nil), want...)
	for _, tok := range next {
		l, err := r.Decode(0, tok)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l...)
	}
	if m := enginetest.Compare(want, got, ref.NVocab); m.Check(false) != nil {
		t.Fatalf("after a failed handoff and a good one: %s", m)
	}
}

// drain reads a scheduler's events to the end.
func drain(t *testing.T, ch <-chan serve.Event) ([]int32, serve.Event) {
	t.Helper()
	return servetest.Until(t, ch, func(ev serve.Event) bool { return ev.Done }, func(ev serve.Event) int32 { return ev.Token })
}

// TestRemotePrefillScheduler: a scheduler over an engine on a decode pool
// sends the long prompts (8 tokens or more) to the prefill pool and
// prefills the short ones itself, while it decodes; the greedy answers
// equal a single node's. A prompt whose KV arrives corrupt is prefilled
// locally instead, with the same answer. At the end no KV block is held,
// in the engine's cache or on any member.
func TestRemotePrefillScheduler(t *testing.T) {
	ref, path := openRef(t)
	ps := shapeOf(&ref.Config).Plans("dense")
	plan := placementtest.Disagg(ps.Get("pp2"), ps.Get("tp2"))
	p := startPools(t, path, plan)
	_, pre := p.open(t, plan, placement.RolePrefill)
	_, dec := p.open(t, plan, placement.RoleDecode)
	eng, err := NewEngine(dec, 128, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	var mu sync.Mutex
	var observed []error
	eng.SetRemotePrefill(&RemotePrefill{Session: pre, Remote: func(n int, _ Load) bool { return n >= 8 }, Chunk: 5,
		Observe: func(n int, took time.Duration, err error) {
			mu.Lock()
			observed = append(observed, err)
			mu.Unlock()
		}})
	sch, single := schedulers(t, eng, ref)
	prompts := [][]int32{{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 7, 1}, {9, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12}}
	run := func(s *serve.Scheduler) [][]int32 {
		chans := make([]<-chan serve.Event, len(prompts))
		for i, pr := range prompts {
			ch, err := s.Submit(context.Background(), serve.Request{Prompt: pr, MaxTokens: 6})
			if err != nil {
				t.Fatal(err)
			}
			chans[i] = ch
		}
		out := make([][]int32, len(prompts))
		for i, ch := range chans {
			toks, ev := drain(t, ch)
			if ev.Err != nil || ev.Reason != "length" {
				t.Fatalf("prompt %d ended with %q: %v", i, ev.Reason, ev.Err)
			}
			out[i] = toks
		}
		return out
	}
	want := run(single)
	got := run(sch)
	st := sch.Stats()
	t.Logf("remote prefills %d (failed %d), single node %v, disaggregated %v", st.RemotePrefills, st.RemoteFailed, want, got)
	for i := range want {
		if !slices.Equal(want[i], got[i]) {
			t.Errorf("prompt %d: disaggregated %v, single node %v", i, got[i], want[i])
		}
	}
	if st.RemotePrefills != 2 || st.RemoteFailed != 0 {
		t.Errorf("remote prefills %d (failed %d), want 2 (0)", st.RemotePrefills, st.RemoteFailed)
	}

	// The KV of the second chunk of every prompt arrives corrupt.
	p.net.corrupt = func(pc *KVPiece) bool { return pc.Pos > 0 }
	got = run(sch)
	st = sch.Stats()
	for i := range want {
		if !slices.Equal(want[i], got[i]) {
			t.Errorf("prompt %d after a failed handoff: %v, single node %v", i, got[i], want[i])
		}
	}
	if st.RemotePrefills != 2 || st.RemoteFailed != 2 {
		t.Errorf("remote prefills %d (failed %d), want 2 (2)", st.RemotePrefills, st.RemoteFailed)
	}
	mu.Lock()
	if len(observed) != 4 || observed[2] == nil || observed[3] == nil {
		t.Errorf("observed remote prefills: %v", observed)
	}
	mu.Unlock()
	tc := 0
	for ; eng.Cache().FreeBlocks() != eng.Cache().Config().NumBlocks && tc < 100; tc++ {
		time.Sleep(10 * time.Millisecond)
	}
	if free, all := eng.Cache().FreeBlocks(), eng.Cache().Config().NumBlocks; free != all {
		t.Errorf("the engine's cache holds %d of %d blocks after every request ended", all-free, all)
	}
	for _, m := range p.members {
		m.mu.Lock()
		for _, s := range m.sessions {
			if c := s.runner.Cache(); c.FreeBlocks() != c.Config().NumBlocks {
				t.Errorf("%v (%s pool) holds %d blocks after every request ended", m.me, m.lay.Pool, c.Config().NumBlocks-c.FreeBlocks())
			}
		}
		m.mu.Unlock()
	}
}

// TestRemotePrefillFaults (issue 22, must-show 3): the KV stream stalls
// past the step deadline, then the prefill pool's node goes away in the
// middle of a transfer. Each time the request completes with a single
// node's answer (the decode pool prefills it instead), nothing waits past
// the deadlines, and no KV block stays held on any member or in the
// engine's cache.
func TestRemotePrefillFaults(t *testing.T) {
	ref, path := openRef(t)
	ps := shapeOf(&ref.Config).Plans("dense")
	plan := placementtest.Disagg(ps.Get("pp2"), ps.Get("tp2"))
	p := startPools(t, path, plan)
	const timeout = 2 * time.Second // a step; short, so the stalls end soon, and enough for -race under load
	_, pre := p.openTimeout(t, plan, placement.RolePrefill, timeout)
	_, dec := p.openTimeout(t, plan, placement.RoleDecode, timeout)
	eng, err := NewEngine(dec, 128, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	eng.SetRemotePrefill(&RemotePrefill{Session: pre, Chunk: 4})
	sch, single := schedulers(t, eng, ref)
	prompt := []int32{4, 8, 15, 16, 23, 42, 7, 9, 11, 13}
	ask := func(s *serve.Scheduler) ([]int32, time.Duration) {
		t0 := time.Now()
		ch, err := s.Submit(context.Background(), serve.Request{Prompt: prompt, MaxTokens: 5})
		if err != nil {
			t.Fatal(err)
		}
		toks, ev := drain(t, ch)
		if ev.Err != nil || ev.Reason != "length" {
			t.Fatalf("ended with %q: %v", ev.Reason, ev.Err)
		}
		return toks, time.Since(t0)
	}
	want, _ := ask(single)
	held := func(when string) {
		t.Helper()
		for range 100 {
			if eng.Cache().FreeBlocks() == eng.Cache().Config().NumBlocks {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if free, all := eng.Cache().FreeBlocks(), eng.Cache().Config().NumBlocks; free != all {
			t.Errorf("%s: the engine's cache holds %d of %d blocks", when, all-free, all)
		}
		// A closed session leaves its members within a bound (Close is
		// best effort, a member first finishes the step it runs).
		var problems []string
		for range 300 {
			problems = memberBlocks(p)
			if len(problems) == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		for _, pr := range problems {
			t.Errorf("%s: %s", when, pr)
		}
	}

	// The KV of the second chunk stops moving.
	p.net.stall = func(pc *KVPiece) bool { return pc.Pos > 0 }
	got, took := ask(sch)
	st := sch.Stats()
	t.Logf("stalled KV stream: answered in %v, remote prefills %d failed %d", took.Round(time.Millisecond), st.RemotePrefills, st.RemoteFailed)
	if !slices.Equal(got, want) {
		t.Errorf("after a stalled transfer: %v, single node %v", got, want)
	}
	if st.RemoteFailed != 1 || took > 5*timeout {
		t.Errorf("a stalled transfer: %d failed remote prefills, answered in %v", st.RemoteFailed, took)
	}
	if err := pre.Err(); err != nil {
		t.Errorf("a stalled transfer made the prefill session unusable: %v", err)
	}
	held("after a stalled transfer")

	// The prefill pool's last stage goes away in the middle of a transfer.
	p.net.stall = func(pc *KVPiece) bool { return pc.Pos > 0 }
	p.net.stalled = make(chan struct{}, 1)
	var victim *Member
	for _, m := range p.members {
		if m.lay.Pool == placement.RolePrefill && m.me.Stage == 1 {
			victim = m
		}
	}
	go func() {
		<-p.net.stalled
		victim.Close()
	}()
	got, took = ask(sch)
	st = sch.Stats()
	t.Logf("prefill member gone mid-transfer: answered in %v, remote prefills %d failed %d; prefill session: %v", took.Round(time.Millisecond), st.RemotePrefills, st.RemoteFailed, pre.Err())
	if !slices.Equal(got, want) {
		t.Errorf("after the prefill member died: %v, single node %v", got, want)
	}
	if st.RemoteFailed != 2 || took > 5*timeout {
		t.Errorf("a dead prefill member: %d failed remote prefills, answered in %v", st.RemoteFailed, took)
	}
	// The prefill session is unusable now: its owner closes it (the
	// driver opens another at its next reconcile), which frees what the
	// surviving prefill member held; prompts are prefilled locally
	// meanwhile.
	if err := pre.Err(); err == nil {
		t.Error("the prefill session is usable after its member died")
	}
	_ = pre.Close(context.Background())
	held("after the prefill member died")
	p.net.stall = nil
	got, _ = ask(sch)
	if !slices.Equal(got, want) || sch.Stats().RemoteFailed != 2 || sch.Stats().RemotePrefills != 0 {
		t.Errorf("with the prefill pool gone: %v (want %v), stats %+v", got, want, sch.Stats())
	}
	held("at the end")
}

// TestRemotePrefillFailPolicy: with RemotePrefill.Fail a request whose KV
// arrives corrupt ends with a clear error instead of being prefilled by
// the decode pool; another request goes on, and no block stays held.
func TestRemotePrefillFailPolicy(t *testing.T) {
	ref, path := openRef(t)
	ps := shapeOf(&ref.Config).Plans("dense")
	plan := placementtest.Disagg(ps.Get("pp2"), ps.Get("tp2"))
	p := startPools(t, path, plan)
	_, pre := p.open(t, plan, placement.RolePrefill)
	_, dec := p.open(t, plan, placement.RoleDecode)
	eng, err := NewEngine(dec, 128, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	eng.SetRemotePrefill(&RemotePrefill{Session: pre, Remote: func(n int, _ Load) bool { return n >= 8 }, Fail: true})
	sch, err := serve.NewEngine(eng, func(int32) bool { return false }, serve.Options{MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sch.Close()
	p.net.corrupt = func(pc *KVPiece) bool { return true }
	long, err := sch.Submit(context.Background(), serve.Request{Prompt: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	short, err := sch.Submit(context.Background(), serve.Request{Prompt: []int32{1, 2, 3}, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	toks, ev := drain(t, long)
	if ev.Reason != "error" || ev.Err == nil || !strings.Contains(ev.Err.Error(), "prefill pool failed") || !strings.Contains(ev.Err.Error(), "checksum") || len(toks) != 0 {
		t.Errorf("the long prompt under the fail policy: %d tokens, %q: %v", len(toks), ev.Reason, ev.Err)
	}
	t.Logf("the failed request: %v", ev.Err)
	if toks, ev := drain(t, short); ev.Err != nil || len(toks) != 4 {
		t.Errorf("the short prompt beside it: %d tokens, %v", len(toks), ev.Err)
	}
	for range 100 {
		if eng.Cache().FreeBlocks() == eng.Cache().Config().NumBlocks {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if free, all := eng.Cache().FreeBlocks(), eng.Cache().Config().NumBlocks; free != all {
		t.Errorf("the engine's cache holds %d of %d blocks", all-free, all)
	}
}

// schedulers starts a scheduler over eng and one over a single-node runner
// of ref, both closed with the test.
func schedulers(t *testing.T, eng *Engine, ref *model.Model) (sch, single *serve.Scheduler) {
	t.Helper()
	eog := func(int32) bool { return false }
	sch, err := serve.NewEngine(eng, eog, serve.Options{MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sch.Close)
	r, err := model.NewRunner(ref, model.Options{Threads: 1, CacheTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	single, err = serve.New(r, eog, serve.Options{MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(single.Close)
	return sch, single
}

// memberBlocks lists the members of p's sessions that hold KV blocks.
func memberBlocks(p *pools) []string {
	var out []string
	for _, m := range p.members {
		m.mu.Lock()
		ss := make([]*memberSession, 0, len(m.sessions))
		for _, s := range m.sessions {
			ss = append(ss, s)
		}
		m.mu.Unlock()
		for _, s := range ss {
			if !s.stepMu.TryLock() {
				out = append(out, fmt.Sprintf("%v (%s pool) is inside a step", m.me, m.lay.Pool))
				continue
			}
			if s.runner != nil {
				if c := s.runner.Cache(); c.FreeBlocks() != c.Config().NumBlocks {
					out = append(out, fmt.Sprintf("%v (%s pool) holds %d blocks", m.me, m.lay.Pool, c.Config().NumBlocks-c.FreeBlocks()))
				}
			}
			s.stepMu.Unlock()
		}
	}
	return out
}
