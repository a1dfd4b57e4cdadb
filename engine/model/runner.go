package model

import (
	"fmt"
	"math"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/kv"
	"shoal/engine/quant"
)

// Options configure a Runner.
type Options struct {
	Threads int // worker threads (all cores if 0)
	// Lo, Hi is the layer range this runner executes and caches; Hi == 0
	// means all layers.
	Lo, Hi int
	// CacheTokens is the KV capacity in token positions over all sequences
	// (the model's context length if 0).
	CacheTokens int
	BlockSize   int // KV block size (kv.DefaultBlockSize if 0)
	// KVType is how the cache stores K and V: F16 (also for the zero
	// value), Q8_0 or Q4_0 (see kv.Config.Type).
	KVType quant.Type

	// Slice is the part of each layer this runner executes as a member of
	// a tensor-parallel group; nil means the slice the model's weights hold
	// (Model.Slice; the whole layer for a model loaded from a GGUF file).
	// When set, it must be the slice the weights hold.
	Slice *Slice
	// Collective connects the members of the group; nil for a single
	// member. Its rank and size must be the slice's. Every member must run
	// the same batches (Reserve, then Forward or Step) in the same order,
	// concurrently; the first Forward exchanges and checks the members'
	// slices.
	Collective Collective
	// NoOverlap runs every tensor-parallel step as one batch, its
	// all-reduces waited for in turn (by default a step of many tokens is
	// cut in two parts that overlap one's all-reduces with the other's
	// compute: forwardOverlapped).
	NoOverlap bool

	// Device runs the layers; nil is the CPU (cpu.Device).
	Device device.Device
}

// Chunk is a run of N consecutive tokens of one sequence starting at
// position Pos (set by Runner.Reserve).
type Chunk struct {
	Seq kv.SeqID
	Pos int
	N   int
}

// Batch is a set of chunks whose tokens are laid out chunk after chunk.
// Prefill chunks and single decode tokens mix freely.
type Batch struct {
	Tokens []int32 // needed for Embed; len = sum of N
	Chunks []Chunk
}

// Len is the number of tokens in the batch.
func (b *Batch) Len() int {
	n := 0
	for _, c := range b.Chunks {
		n += c.N
	}
	return n
}

// Runner executes a layer range of a model on batches: it orchestrates
// (reservations, the tensor-parallel handshake and all-reduces, the
// embedding) while a device runs the layers' arithmetic and holds their KV
// rows; the runner holds the KV block tables. Not safe for concurrent use.
type Runner struct {
	m      *Model
	dev    device.Range
	cache  *kv.Cache
	lo, hi int

	sl Slice    // what this runner executes (the whole layer on one member)
	tp *tpState // nil on a single member

	db device.Batch // the device's view of the batch in Forward
	o  []float32    // a half's output, composing halves (tensor parallel)

	// overlap: a tensor-parallel step of many tokens runs in parts whose
	// all-reduces travel while the next part computes (forwardOverlapped);
	// parts and partO are its batches and half outputs.
	overlap bool
	parts   []device.Batch
	partO   [][]float32

	x, logits []float32 // Step's hidden states and logits
	one       struct {  // Decode's batch, kept to avoid allocation
		tok   [1]int32
		chunk [1]Chunk
		rows  [1]int
		b     Batch
	}
}

// NewRunner prepares execution of layers [o.Lo, o.Hi) of m.
func NewRunner(m *Model, o Options) (*Runner, error) {
	lo, hi := o.Lo, o.Hi
	if hi == 0 {
		hi = m.NLayer
	}
	if lo < 0 || hi > m.NLayer || lo >= hi {
		return nil, fmt.Errorf("layer range [%d,%d) is not within [0,%d)", lo, hi, m.NLayer)
	}
	if lo < m.W.Lo || hi > m.W.Hi {
		return nil, fmt.Errorf("layer range [%d,%d) is not within the layers [%d,%d) the weights hold", lo, hi, m.W.Lo, m.W.Hi)
	}
	sl := m.Config.whole()
	if m.Slice != nil {
		sl = *m.Slice
	}
	if o.Slice != nil {
		want := o.Slice.normalize(&m.Config)
		if err := want.check(&m.Config); err != nil {
			return nil, err
		}
		if (want.Size > 1 || sl.Size > 1) && !want.equal(&sl) {
			return nil, fmt.Errorf("slice %+v is not the slice %+v the weights hold (load the member's weights with LoadSource)", want, sl)
		}
	}
	var tp *tpState
	if sl.Size > 1 {
		c := o.Collective
		if c == nil || c.Rank() != sl.Rank || c.Size() != sl.Size {
			return nil, fmt.Errorf("tensor-parallel rank %d of %d needs a collective of that rank and size", sl.Rank, sl.Size)
		}
		oc := &orderedColl{Collective: c}
		tp = &tpState{coll: oc, ordered: oc}
	} else if o.Collective != nil && o.Collective.Size() > 1 {
		return nil, fmt.Errorf("a collective of %d members needs weights holding a tensor-parallel slice", o.Collective.Size())
	}
	kvLo, kvHi := sl.KVHeads(&m.Config)
	ct := o.CacheTokens
	if ct <= 0 {
		ct = m.NCtx
	}
	bs := o.BlockSize
	if bs <= 0 {
		bs = kv.DefaultBlockSize
	}
	kt := o.KVType
	if kt == quant.F32 {
		kt = quant.F16
	}
	if err := kv.CheckType(kt, m.HeadDim); err != nil {
		return nil, err
	}
	kc := kv.Config{FirstLayer: lo, Layers: hi - lo, KVDim: (kvHi - kvLo) * m.HeadDim, BlockSize: bs, NumBlocks: (ct + bs - 1) / bs, Type: kt, VInK: m.MLA != nil}
	ld := device.Load{Spec: m.Config.spec(m.W.RopeFreqs), Layers: m.W.Layers[lo:hi], Lo: lo, Hi: hi,
		OutputNorm: m.W.OutputNorm, Output: m.W.Output,
		Part: device.Part{HeadLo: sl.HeadLo, HeadHi: sl.HeadHi, KVLo: kvLo, KVHi: kvHi}, KV: kc, Threads: o.Threads}
	if tp != nil {
		ld.Coll = tp.coll
	}
	d := o.Device
	if d == nil {
		d = cpu.Device{}
	}
	rng, err := d.Load(ld)
	if err != nil {
		return nil, err
	}
	cache, err := kv.NewWithStore(kc, rng.KV())
	if err != nil {
		rng.Close()
		return nil, err
	}
	// Overlapped steps for the dense layers whose halves end in one
	// all-reduce each (a MoE or latent-attention layer exchanges more).
	// Every member decides alike, whatever its device: they must make the
	// same collectives.
	overlap := tp != nil && !m.IsMoE() && m.MLA == nil && !o.NoOverlap
	return &Runner{m: m, dev: rng, cache: cache, lo: lo, hi: hi, sl: sl, tp: tp, overlap: overlap}, nil
}

// Close frees what the device holds (the CPU's threads).
func (r *Runner) Close() { r.dev.Close() }

// Cache is the runner's KV cache.
func (r *Runner) Cache() *kv.Cache { return r.cache }

// Model is the runner's model.
func (r *Runner) Model() *Model { return r.m }

// Device is the layer range as the device holds it.
func (r *Runner) Device() device.Range { return r.dev }

// Range is the layer range the runner holds.
func (r *Runner) Range() (lo, hi int) { return r.lo, r.hi }

// Slice is the part of each layer the runner executes.
func (r *Runner) Slice() Slice { return r.sl }

// KVHeadWords is the width of one KV head in the cache's rows, in the
// 16-bit words kv.Cache's ExportRange and ImportRange count: the head size
// with an F16 cache, its quantized blocks' words otherwise.
func (r *Runner) KVHeadWords() int { return kv.Words(r.cache.Config().Type, r.m.HeadDim) }

// Reserve allocates KV positions for every chunk of b, setting each Pos to
// the sequence's current length. On error nothing is reserved.
func (r *Runner) Reserve(b *Batch) error {
	for i := range b.Chunks {
		c := &b.Chunks[i]
		pos, err := r.cache.Reserve(c.Seq, c.N)
		if err != nil {
			for j := 0; j < i; j++ {
				r.cache.Truncate(b.Chunks[j].Seq, b.Chunks[j].Pos)
			}
			return err
		}
		c.Pos = pos
	}
	return nil
}

// Embed writes the embedding rows of tokens to x ([len(tokens)][NEmbd]).
func (r *Runner) Embed(tokens []int32, x []float32) error {
	E, emb := r.m.NEmbd, r.m.W.TokEmbd
	if emb == nil {
		return fmt.Errorf("the weights hold no token embedding")
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= emb.Rows {
			return fmt.Errorf("token id %d is outside the vocabulary [0,%d)", t, emb.Rows)
		}
		xi := x[i*E : (i+1)*E]
		quant.DequantizeRow(emb.Type, emb.Row(int(t)), xi)
		if r.m.Arch.Gemma {
			s := float32(math.Sqrt(float64(E)))
			for j := range xi {
				xi[j] *= s
			}
		}
	}
	return nil
}

// begin hands the device the batch's positions and block tables.
func (r *Runner) begin(b *Batch) error {
	bs := r.cache.Config().BlockSize
	r.db.Chunks = r.db.Chunks[:0]
	for ci, c := range b.Chunks {
		blocks := r.cache.Blocks(c.Seq)
		if c.N <= 0 || c.Pos < 0 || (c.Pos+c.N+bs-1)/bs > len(blocks) {
			return fmt.Errorf("chunk %d (sequence %d, positions [%d,%d)) has no reserved KV space", ci, c.Seq, c.Pos, c.Pos+c.N)
		}
		r.db.Chunks = append(r.db.Chunks, device.Chunk{Pos: c.Pos, N: c.N, Blocks: blocks})
	}
	return r.dev.Begin(&r.db)
}

// Forward runs layers [lo,hi) on the batch, x holding the hidden states of
// its tokens ([Len][NEmbd]) in and out. Chunks must have been reserved.
func (r *Runner) Forward(b *Batch, lo, hi int, x []float32) error {
	r.dev.Hold() // the layers' many short jobs: keep the workers awake
	defer r.dev.Release()
	if lo < r.lo || hi > r.hi || lo > hi {
		return fmt.Errorf("layers [%d,%d) are not within this runner's [%d,%d)", lo, hi, r.lo, r.hi)
	}
	if len(x) < b.Len()*r.m.NEmbd {
		return fmt.Errorf("hidden state holds %d values, batch needs %d", len(x), b.Len()*r.m.NEmbd)
	}
	if err := r.begin(b); err != nil {
		return err
	}
	if r.tp == nil {
		return r.dev.Forward(lo, hi, x)
	}
	if !r.tp.agreed {
		if err := r.handshake(); err != nil {
			return err
		}
		// The handshake reached every member: the group knows their builds.
		if o, ok := r.tp.ordered.Collective.(overlapper); ok && !o.Overlaps() {
			r.overlap = false
		}
	}
	if parts := r.overlapParts(b.Len()); parts > 0 {
		return r.forwardOverlapped(lo, hi, parts, x)
	}
	r.o = grow(r.o, b.Len()*r.m.NEmbd)
	for l := lo; l < hi; l++ {
		if err := r.layer(l, x); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

// layer runs layer l as a tensor-parallel member: each half on the device
// up to its collective point, the all-reduce, the residual.
func (r *Runner) layer(l int, x []float32) error {
	partial, err := r.dev.Attention(l, x, r.o)
	if err := r.reduce(partial, err); err != nil {
		return err
	}
	r.dev.Residual(l, device.AttnHalf, x, r.o)
	partial, err = r.dev.FFN(l, x, r.o)
	if err := r.reduce(partial, err); err != nil {
		return err
	}
	r.dev.Residual(l, device.FFNHalf, x, r.o)
	return nil
}

// reduce all-reduces a half's partial output over the group.
func (r *Runner) reduce(partial bool, err error) error {
	if err != nil || !partial {
		return err
	}
	return r.tp.coll.AllReduceSum(r.o)
}

// Logits applies the output norm and head to the hidden rows listed in rows
// (indexes into x, [*][NEmbd]), writing len(rows) x NVocab values to out.
func (r *Runner) Logits(x []float32, rows []int, out []float32) error {
	return r.dev.Logits(x, rows, out)
}

func grow[T any](s []T, n int) []T { return cpu.Grow(s, n) }
