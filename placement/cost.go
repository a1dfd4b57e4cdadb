package placement

import (
	"math"
)

// actBytes is the size of one hidden-state element on the wire (float32).
const actBytes = 4

// bytesPerMsPerGbit converts Gbit/s to bytes per millisecond.
const bytesPerMsPerGbit = 1e9 / 8 / 1e3

// env is one planning problem: the model, the eligible nodes and the
// options, with per-layer prefix sums so a layer range costs O(1).
type env struct {
	p      *ModelProfile
	o      Options
	nodes  []Node    // eligible, sorted by ID, unmeasured numbers defaulted
	usable []float64 // per node: free × (1 − margin) − overhead, bytes
	links  LinkMatrix

	batch   float64 // sequences per step (tokens per piece in a prefill env)
	seqs    float64 // sequences the KV cache holds (Options.Batch)
	prefill bool    // a prefill piece: KV read once for all its tokens, logits of one row
	ctxAvg  float64 // average attended positions per decode token
	hidden  float64 // bytes of one step's hidden states (batch × n_embd × 4)
	touched float64 // probability a given expert is used by some token of the step

	attnB, ffnB, expB, fixB []float64 // prefix sums over layers
	attnF, ffnF, expF, fixF []float64
}

func newEnv(p *ModelProfile, nodes []Node, links LinkMatrix, o Options) *env {
	if o.KVType != "" {
		q := *p // the KV bytes of the cache's type
		q.KVBytesPerToken = KVBytes(p.KVBytesPerToken, o.KVType)
		p = &q
	}
	e := &env{p: p, o: o, nodes: nodes, links: links}
	e.batch = float64(o.Batch)
	e.seqs = e.batch
	e.ctxAvg = float64(o.Context) / 2
	e.hidden = e.batch * float64(p.NEmbd) * actBytes
	if p.NExpert > 0 {
		e.touched = 1 - math.Pow(1-float64(p.NExpertUsed)/float64(p.NExpert), e.batch)
	}
	e.usable = make([]float64, len(nodes))
	for i, n := range nodes {
		e.usable[i] = float64(n.MemFree)*(1-o.SafetyMargin) - float64(o.Overhead)
		if n.GPUMem > 0 && !n.GPUShared {
			e.usable[i] += float64(n.GPUMem) * (1 - o.SafetyMargin)
		}
	}
	L := p.NLayer
	for _, s := range []*[]float64{&e.attnB, &e.ffnB, &e.expB, &e.fixB, &e.attnF, &e.ffnF, &e.expF, &e.fixF} {
		*s = make([]float64, L+1)
	}
	for i, l := range p.Layers {
		e.attnB[i+1] = e.attnB[i] + float64(l.AttnBytes)
		e.ffnB[i+1] = e.ffnB[i] + float64(l.FFNBytes)
		e.expB[i+1] = e.expB[i] + float64(l.ExpertBytes)
		e.fixB[i+1] = e.fixB[i] + float64(l.FixedBytes)
		e.attnF[i+1] = e.attnF[i] + l.AttnFLOPs
		e.ffnF[i+1] = e.ffnF[i] + l.FFNFLOPs
		e.expF[i+1] = e.expF[i] + l.ExpertFLOPs
		e.fixF[i+1] = e.fixF[i] + l.FixedFLOPs
	}
	return e
}

// work is an amount of memory held, bytes read per step and FLOPs per step.
type work struct{ mem, read, flops float64 }

func (w work) add(o work) work      { return work{w.mem + o.mem, w.read + o.read, w.flops + o.flops} }
func (w work) scale(f float64) work { return work{w.mem * f, w.read * f, w.flops * f} }

// parts is a stage's work split by how it divides among TP members.
type parts struct {
	attn, ffn, exp work // the whole of each splittable part
	fixed          work // on every member
}

// stageParts is the work of layers [lo,hi) for one decode step.
func (e *env) stageParts(lo, hi int) parts {
	p := e.p
	nl := float64(hi - lo)
	kv := float64(p.KVBytesPerToken)
	attnB := e.attnB[hi] - e.attnB[lo]
	var s parts
	s.attn = work{
		mem:   attnB + e.kvBytes(lo, hi),
		read:  attnB + nl*e.rowsOut()*e.ctxAvg*kv,
		flops: e.batch * (e.attnF[hi] - e.attnF[lo] + nl*4*float64(p.NHead*p.HeadDim)*e.ctxAvg*e.attnCost()),
	}
	ffnB := e.ffnB[hi] - e.ffnB[lo]
	s.ffn = work{mem: ffnB, read: ffnB, flops: e.batch * (e.ffnF[hi] - e.ffnF[lo])}
	if p.NExpert > 0 {
		expB := (e.expB[hi] - e.expB[lo]) * float64(p.NExpert)
		s.exp = work{mem: expB, read: expB * e.touched, flops: e.batch * float64(p.NExpertUsed) * (e.expF[hi] - e.expF[lo])}
	}
	fixB := e.fixB[hi] - e.fixB[lo]
	s.fixed = work{mem: fixB + float64(p.GlobalBytes), read: fixB, flops: e.batch * (e.fixF[hi] - e.fixF[lo])}
	return s
}

// attnCost weighs the FLOPs of attention over the context against the
// node's GFLOPS, which are measured through the quantized matrix kernel:
// attention runs in float (F16 keys and values widened, scores, softmax),
// several times slower a FLOP, less so the more query heads share a key
// and value head. Fitted to prefill on an AVX-512 Xeon, one thread,
// prompts of 512 and 2,048 tokens: 6.3 with 2 query heads a KV head (a
// 512-wide 8-layer model), 3.1 with 8 (TinyLlama's shapes); the matrix
// products ran at 1.04-1.10x the measured GFLOPS' time. A decode step's
// attention is bound by reading the KV cache (its bytes are counted), so
// only prefill takes the factor.
func (e *env) attnCost() float64 {
	if !e.prefill {
		return 1
	}
	return 2 + 8.5*float64(e.p.NHeadKV)/float64(max(e.p.NHead, 1))
}

// kvBytes is the KV cache of layers [lo,hi) (all heads) for Context tokens
// of each of Batch sequences.
func (e *env) kvBytes(lo, hi int) float64 {
	return float64(hi-lo) * float64(e.o.Context) * e.seqs * float64(e.p.KVBytesPerToken)
}

// rowsOut is the step's sequences as its attention and logits see them:
// each decode sequence reads its KV and gets a logits row; a prefill piece
// reads the KV once for all its tokens and gets its last row only.
func (e *env) rowsOut() float64 {
	if e.prefill {
		return 1
	}
	return e.batch
}

// extras is the work of the embedding and output a member may hold.
func (e *env) extras(embed, out bool) work {
	p := e.p
	var w work
	if embed {
		w.mem += float64(p.EmbedBytes) + e.driverMem()
		w.read += e.batch * float64(p.EmbedBytes) / float64(max(p.NVocab, 1)) // one row per token
	}
	if out {
		w.mem += float64(p.OutputBytes)
		w.read += float64(p.OutputBytes)
		w.flops += e.rowsOut() * p.OutputFLOPs()
		if p.Tied {
			w.read += float64(p.EmbedBytes)
			if !embed {
				w.mem += float64(p.EmbedBytes)
			}
		}
	}
	return w
}

// driverMem is what the driver holds beyond its share (Options.DriverBytes
// and its KV cache).
func (e *env) driverMem() float64 {
	return float64(e.o.DriverBytes) + float64(e.o.DriverKVBytesPerToken)*float64(e.o.Context)*float64(e.o.Batch)
}

// times is the compute and memory time of w on node i, in ms. On a node
// with a GPU the share of w's bytes its memory holds is read at the GPU's
// measured rate (which, measured through the decode kernel, covers its
// arithmetic too) and the rest on the CPU as elsewhere.
func (e *env) times(i int, w work) (compute, memory float64) {
	n := &e.nodes[i]
	f := e.gpuShare(i, w.mem)
	compute, memory = (1-f)*w.flops/(n.GFLOPS*1e6), (1-f)*w.read/(n.MemGBps*1e6)
	if f > 0 {
		memory += f * w.read / (n.GPUGBps * 1e6)
	}
	return compute, memory
}

// gpuShare is the fraction of mem bytes node i's GPU holds.
func (e *env) gpuShare(i int, mem float64) float64 {
	n := &e.nodes[i]
	if n.GPUMem == 0 || n.GPUGBps <= 0 {
		return 0
	}
	if mem <= float64(n.GPUMem) {
		return 1
	}
	return float64(n.GPUMem) / mem
}

func (e *env) time(i int, w work) float64 {
	c, m := e.times(i, w)
	return math.Max(c, m)
}

// sendMs is the time for node a to send b bytes to node b.
func (e *env) sendMs(a, b int, bytes float64) float64 {
	if a == b {
		return 0
	}
	l := e.links.Get(e.nodes[a].ID, e.nodes[b].ID)
	return e.o.MessageMs + l.LatencyMs + bytes/(l.Gbit*bytesPerMsPerGbit)
}

// collectiveMs is sendMs for a message of a TP group's all-reduce: over
// the direct link when one was measured.
func (e *env) collectiveMs(a, b int, bytes float64) float64 {
	if a == b {
		return 0
	}
	l := e.links.Get(e.nodes[a].ID, e.nodes[b].ID)
	if l.DirectGbit <= 0 {
		return e.sendMs(a, b, bytes)
	}
	return min(e.o.MessageMs, DirectMessageMs) + l.LatencyMs + bytes/(l.DirectGbit*bytesPerMsPerGbit)
}

// fanoutMs is node src sending the step's hidden states to every member of
// group (itself excluded): the sends share src's uplink, the latencies overlap.
func (e *env) fanoutMs(src int, group []int) float64 {
	lat, xfer := 0.0, 0.0
	for _, m := range group {
		if m == src {
			continue
		}
		l := e.links.Get(e.nodes[src].ID, e.nodes[m].ID)
		lat = math.Max(lat, l.LatencyMs)
		xfer += e.o.MessageMs + e.hidden/(l.Gbit*bytesPerMsPerGbit)
	}
	return lat + xfer
}

// allReduceMs is one ring all-reduce of the step's hidden states over group
// (in rank order): 2(g−1) steps, each moving 1/g of the vector over the
// slowest link of the ring.
func (e *env) allReduceMs(group []int) float64 {
	g := len(group)
	if g < 2 {
		return 0
	}
	step := 0.0
	for r := range group {
		step = math.Max(step, e.collectiveMs(group[r], group[(r+1)%g], e.hidden/float64(g)))
	}
	return float64(2*(g-1)) * step
}

// shares divides a stage's splittable work among the members of group so
// that their step times are equal (members with more fixed work get less),
// without passing any member's memory. It returns nil when the members
// cannot hold the stage.
func (e *env) shares(group []int, sp parts, fixed []work) []float64 {
	g := len(group)
	split := sp.attn.add(sp.ffn).add(sp.exp)
	if g == 1 {
		if fixed[0].mem+split.mem > e.usable[group[0]] {
			return nil
		}
		return []float64{1}
	}
	f := make([]float64, g)  // fixed time
	u := make([]float64, g)  // time of the whole split part
	cp := make([]float64, g) // share that fills memory
	total := 0.0
	for r, m := range group {
		f[r] = e.time(m, fixed[r])
		u[r] = math.Max(e.time(m, split), 1e-12)
		room := e.usable[m] - fixed[r].mem
		if room < 0 {
			return nil
		}
		cp[r] = 1
		if split.mem > 0 {
			cp[r] = math.Min(1, room/split.mem)
		}
		total += cp[r]
	}
	if total < 1 {
		return nil
	}
	sum := func(T float64) float64 {
		s := 0.0
		for r := range f {
			s += math.Min(cp[r], math.Max(0, (T-f[r])/u[r]))
		}
		return s
	}
	lo, hi := 0.0, 0.0
	for r := range f {
		hi = math.Max(hi, f[r]+u[r])
	}
	for range 60 {
		mid := (lo + hi) / 2
		if sum(mid) >= 1 {
			hi = mid
		} else {
			lo = mid
		}
	}
	s := make([]float64, g)
	t := 0.0
	for r := range f {
		s[r] = math.Min(cp[r], math.Max(0, (hi-f[r])/u[r]))
		t += s[r]
	}
	for r := range s { // remove the bisection's residue
		s[r] /= t
	}
	return s
}

// stageFixed is the per-member replicated work of a stage: layers' fixed
// parts plus the embedding (first stage) and output (last stage) on rank 0.
func (e *env) stageFixed(group []int, sp parts, first, last bool) []work {
	fx := make([]work, len(group))
	for r := range group {
		fx[r] = sp.fixed.add(e.extras(first && r == 0, last && r == 0))
	}
	return fx
}

// stageEstimate is the continuous-share time of layers [lo,hi) on group
// (all-reduces and the entry hop included) and whether it fits in memory.
func (e *env) stageEstimate(group []int, lo, hi int, first, last bool, entry float64) (float64, bool) {
	sp := e.stageParts(lo, hi)
	fixed := e.stageFixed(group, sp, first, last)
	s := e.shares(group, sp, fixed)
	if s == nil {
		return 0, false
	}
	split := sp.attn.add(sp.ffn).add(sp.exp)
	t := 0.0
	for r, m := range group {
		t = math.Max(t, e.time(m, fixed[r].add(split.scale(s[r]))))
	}
	return t + entry + float64(2*(hi-lo))*e.allReduceMs(group), true
}
