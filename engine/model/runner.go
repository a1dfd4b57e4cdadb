package model

import (
	"fmt"
	"math"

	"shoal/engine/kernels"
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

// Runner executes a layer range of a model on batches, holding the KV cache
// of that range and the scratch space. Not safe for concurrent use.
type Runner struct {
	m      *Model
	pool   *kernels.Pool
	cache  *kv.Cache
	lo, hi int

	sl      Slice    // what this runner executes (the whole layer on one member)
	nh, nkv int      // query and KV heads held
	kvLo    int      // the model's KV head the first held one is
	qd, kvd int      // their widths: nh·HeadDim, nkv·HeadDim
	tp      *tpState // nil on a single member

	s scratch

	// Parallel sections are built once so Run does not allocate.
	cur      int // layer being executed
	prepFn   func(lo, hi int)
	attnFn   func(w, lo, hi int)
	attnWork []attnScratch
	// attnParts: attention jobs split each KV head's query heads in this
	// many parts (see attention).
	attnParts int

	x, logits []float32 // Step's hidden states and logits
	one       struct {  // Decode's batch, kept to avoid allocation
		tok   [1]int32
		chunk [1]Chunk
		rows  [1]int
		b     Batch
	}
}

// attnScratch is one worker's space for the query heads of a KV head:
// head j's scores at j·ctx, its query and sums at j·HeadDim.
type attnScratch struct {
	ctx    int
	scores []float32
	qh     []float32
	acc    []float32
}

type scratch struct {
	n                int
	xn, q, k, v, att []float32
	g, u, o          []float32
	acts             []byte
	cos, sin         []float32 // per token, RopeDim/2 each
	tokSeq, tokPos   []int32
	blocks           [][]int32 // per chunk
	route            []float32 // per token, NExpert router logits
	expW             []float32 // per token, NExpertUsed weights
	expID            []int32
	expRows          []int32
	expIdx           []int
	eg, eu, eo, ex   []float32
	shgate           []float32
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
		tp = &tpState{coll: c}
	} else if o.Collective != nil && o.Collective.Size() > 1 {
		return nil, fmt.Errorf("a collective of %d members needs weights holding a tensor-parallel slice", o.Collective.Size())
	}
	nh := sl.HeadHi - sl.HeadLo
	kvLo, kvHi := sl.KVHeads(&m.Config)
	nkv := kvHi - kvLo
	ct := o.CacheTokens
	if ct <= 0 {
		ct = m.NCtx
	}
	bs := o.BlockSize
	if bs <= 0 {
		bs = kv.DefaultBlockSize
	}
	cache, err := kv.New(kv.Config{FirstLayer: lo, Layers: hi - lo, KVDim: nkv * m.HeadDim, BlockSize: bs, NumBlocks: (ct + bs - 1) / bs})
	if err != nil {
		return nil, err
	}
	r := &Runner{m: m, pool: kernels.NewPool(o.Threads), cache: cache, lo: lo, hi: hi,
		sl: sl, nh: nh, nkv: nkv, kvLo: kvLo, qd: nh * m.HeadDim, kvd: nkv * m.HeadDim, tp: tp}
	r.prepFn = r.prepRange
	r.attnFn = r.attnRange
	r.attnWork = make([]attnScratch, r.pool.Threads())
	ctx := cache.Config().NumBlocks * cache.Config().BlockSize
	group := m.NHead / m.NHeadKV
	for i := range r.attnWork {
		r.attnWork[i] = attnScratch{ctx: ctx, scores: make([]float32, group*ctx), qh: make([]float32, group*m.HeadDim), acc: make([]float32, group*m.HeadDim)}
	}
	return r, nil
}

// Close stops the runner's threads.
func (r *Runner) Close() { r.pool.Close() }

// Cache is the runner's KV cache.
func (r *Runner) Cache() *kv.Cache { return r.cache }

// Model is the runner's model.
func (r *Runner) Model() *Model { return r.m }

// Range is the layer range the runner holds.
func (r *Runner) Range() (lo, hi int) { return r.lo, r.hi }

// Slice is the part of each layer the runner executes.
func (r *Runner) Slice() Slice { return r.sl }

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
		quant.DequantizeRow(emb.Type, emb.Row(int(t)), x[i*E:(i+1)*E])
	}
	return nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (r *Runner) prepare(b *Batch) error {
	m := r.m
	n := b.Len()
	s := &r.s
	s.n = n
	maxF := max(m.NFF, m.NFFExpert, m.NFFShared)
	maxCols := max(m.NEmbd, m.QDim(), maxF)
	s.xn = grow(s.xn, n*m.NEmbd)
	s.q = grow(s.q, n*r.qd)
	s.k = grow(s.k, n*r.kvd)
	s.v = grow(s.v, n*r.kvd)
	s.att = grow(s.att, n*r.qd)
	s.o = grow(s.o, n*m.NEmbd)
	s.g = grow(s.g, n*maxF)
	s.u = grow(s.u, n*maxF)
	s.acts = grow(s.acts, n*quant.F32.RowSize(maxCols))
	half := m.RopeDim / 2
	s.cos = grow(s.cos, n*half)
	s.sin = grow(s.sin, n*half)
	s.tokSeq = grow(s.tokSeq, n)
	s.tokPos = grow(s.tokPos, n)
	s.blocks = s.blocks[:0]
	i := 0
	for ci, c := range b.Chunks {
		blocks := r.cache.Blocks(c.Seq)
		if c.N <= 0 || c.Pos < 0 || (c.Pos+c.N+r.cache.Config().BlockSize-1)/r.cache.Config().BlockSize > len(blocks) {
			return fmt.Errorf("chunk %d (sequence %d, positions [%d,%d)) has no reserved KV space", ci, c.Seq, c.Pos, c.Pos+c.N)
		}
		s.blocks = append(s.blocks, blocks)
		for j := 0; j < c.N; j++ {
			s.tokSeq[i] = int32(ci)
			s.tokPos[i] = int32(c.Pos + j)
			ropeTable(s.cos[i*half:(i+1)*half], s.sin[i*half:(i+1)*half], c.Pos+j, &m.Config, m.W.RopeFreqs)
			i++
		}
	}
	if m.IsMoE() {
		s.route = grow(s.route, n*m.NExpert)
		s.expW = grow(s.expW, n*m.NExpertUsed)
		s.expID = grow(s.expID, n*m.NExpertUsed)
		s.expRows = grow(s.expRows, n)
		s.eg = grow(s.eg, n*m.NFFExpert)
		s.eu = grow(s.eu, n*m.NFFExpert)
		s.eo = grow(s.eo, n*m.NEmbd)
		s.ex = grow(s.ex, n*m.NEmbd)
		s.shgate = grow(s.shgate, n)
		s.expIdx = grow(s.expIdx, m.NExpert)
	}
	return nil
}

// matmul computes out[i] = W · x[i] for n rows of x (cols = W.Cols),
// quantizing x once to W's activation format.
func (r *Runner) matmul(w *kernels.Matrix, x []float32, n int, out []float32) {
	t := w.ActType()
	kernels.QuantizeActs(r.pool, t, x, n, w.Cols, r.s.acts)
	kernels.MatMul(r.pool, w, r.s.acts, n, out, w.Rows)
}

// matmulQ is matmul reusing activations already quantized by a previous
// call for a matrix with the same activation format.
func (r *Runner) matmulQ(w *kernels.Matrix, n int, out []float32) {
	kernels.MatMul(r.pool, w, r.s.acts, n, out, w.Rows)
}

// Forward runs layers [lo,hi) on the batch, x holding the hidden states of
// its tokens ([Len][NEmbd]) in and out. Chunks must have been reserved.
func (r *Runner) Forward(b *Batch, lo, hi int, x []float32) error {
	r.pool.Hold() // the layers' many short jobs: keep the workers awake
	defer r.pool.Release()
	if lo < r.lo || hi > r.hi || lo > hi {
		return fmt.Errorf("layers [%d,%d) are not within this runner's [%d,%d)", lo, hi, r.lo, r.hi)
	}
	if len(x) < b.Len()*r.m.NEmbd {
		return fmt.Errorf("hidden state holds %d values, batch needs %d", len(x), b.Len()*r.m.NEmbd)
	}
	if err := r.prepare(b); err != nil {
		return err
	}
	if r.tp != nil && !r.tp.agreed {
		if err := r.handshake(); err != nil {
			return err
		}
	}
	for l := lo; l < hi; l++ {
		if err := r.layer(l, x); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

func (r *Runner) layer(l int, x []float32) error {
	m, s := r.m, &r.s
	ly := &m.W.Layers[l]
	n, E := s.n, m.NEmbd
	for i := 0; i < n; i++ {
		rmsNorm(s.xn[i*E:(i+1)*E], x[i*E:(i+1)*E], ly.AttnNorm, m.RMSEps)
	}
	if r.nh > 0 {
		if t := ly.Wq.ActType(); ly.Wk.ActType() == t && ly.Wv.ActType() == t {
			kernels.QuantizeActs(r.pool, t, s.xn, n, ly.Wq.Cols, s.acts)
			kernels.MatMuls(r.pool, s.acts, n, []*kernels.Matrix{ly.Wq, ly.Wk, ly.Wv}, [][]float32{s.q, s.k, s.v})
		} else {
			r.qkvApart(ly, n)
		}
		r.cur = l
		r.pool.Run(n, 1, r.prepFn)
		r.attention(n)
	}
	if err := r.project(ly.Wo, ly.WoGather, s.att, n, r.tpCols(false), s.o); err != nil {
		return err
	}
	if ly.Bo != nil { // once, on the reduced product every member holds
		for i := 0; i < n; i++ {
			addBias(s.o[i*E:(i+1)*E], ly.Bo)
		}
	}
	for i := range s.o[:n*E] {
		x[i] += s.o[i]
	}
	for i := 0; i < n; i++ {
		rmsNorm(s.xn[i*E:(i+1)*E], x[i*E:(i+1)*E], ly.FFNNorm, m.RMSEps)
	}
	var err error
	if m.IsMoE() {
		err = r.moe(ly, s.o)
	} else {
		r.swiglu(ly.Gate, ly.Up, s.xn, n, s.g, s.u)
		err = r.project(ly.Down, ly.DownGather, s.g, n, r.tpCols(true), s.o)
	}
	if err != nil {
		return err
	}
	for i := range s.o[:n*E] {
		x[i] += s.o[i]
	}
	return nil
}

// qkvApart computes a layer's q, k and v projections one at a time, for
// matrices that take different activation formats (sharing the quantized
// activations where they agree).
func (r *Runner) qkvApart(ly *Layer, n int) {
	s := &r.s
	r.matmul(ly.Wq, s.xn, n, s.q)
	if ly.Wk.ActType() == ly.Wq.ActType() {
		r.matmulQ(ly.Wk, n, s.k)
	} else {
		r.matmul(ly.Wk, s.xn, n, s.k)
	}
	if ly.Wv.ActType() == ly.Wk.ActType() {
		r.matmulQ(ly.Wv, n, s.v)
	} else {
		r.matmul(ly.Wv, s.xn, n, s.v)
	}
}

// tpCols is the per-rank input widths of attn_output (or of ffn_down) for
// gathering; nil on a single member.
func (r *Runner) tpCols(ffn bool) []int {
	if r.tp == nil {
		return nil
	}
	if ffn {
		return r.tp.ffnCols
	}
	return r.tp.attnCols
}

// project computes out = W·in ([n][NEmbd]) for this member's part of a
// matrix split by input columns. With a column slice (or on one member), in
// holds the member's columns and out its product, all-reduced over the
// group. Gathered (gather), the members' inputs (cols[p] values per token
// from member p) are all-gathered, W holds this member's output rows, and
// their products are all-gathered into out. A nil W (nothing held)
// contributes zeros.
func (r *Runner) project(w *kernels.Matrix, gather bool, in []float32, n int, cols []int, out []float32) error {
	E := r.m.NEmbd
	if !gather {
		if w == nil {
			clear(out[:n*E])
		} else {
			r.matmul(w, in, n, out)
		}
		return r.allReduce(out[:n*E])
	}
	t := r.tp
	total := 0
	for _, c := range cols {
		total += c
	}
	t.full = grow(t.full, n*total)
	if err := r.gatherRows(in, n, cols, t.full); err != nil {
		return err
	}
	rows := t.outRows[t.coll.Rank()]
	t.part = grow(t.part, n*rows)
	if w != nil {
		r.matmul(w, t.full, n, t.part)
	}
	return r.gatherRows(t.part, n, t.outRows, out)
}

// prepRange adds biases, applies q/k norms and RoPE, and stores K and V in
// the cache for tokens [a,z) of the current layer (the member's heads).
func (r *Runner) prepRange(a, z int) {
	m, s := r.m, &r.s
	ly := &m.W.Layers[r.cur]
	Q, KV, D, half := r.qd, r.kvd, m.HeadDim, m.RopeDim/2
	for i := a; i < z; i++ {
		q, k, v := s.q[i*Q:(i+1)*Q], s.k[i*KV:(i+1)*KV], s.v[i*KV:(i+1)*KV]
		addBias(q, ly.Bq)
		addBias(k, ly.Bk)
		addBias(v, ly.Bv)
		if ly.QNorm != nil {
			for h := 0; h < r.nh; h++ {
				rmsNorm(q[h*D:(h+1)*D], q[h*D:(h+1)*D], ly.QNorm, m.RMSEps)
			}
			for h := 0; h < r.nkv; h++ {
				rmsNorm(k[h*D:(h+1)*D], k[h*D:(h+1)*D], ly.KNorm, m.RMSEps)
			}
		}
		cos, sin := s.cos[i*half:(i+1)*half], s.sin[i*half:(i+1)*half]
		rope(q, r.nh, D, m.RopeDim, m.Arch.Rope, cos, sin)
		rope(k, r.nkv, D, m.RopeDim, m.Arch.Rope, cos, sin)
		r.cache.Store().(*kv.HostStore).Put(r.cur-r.lo, s.blocks[s.tokSeq[i]], int(s.tokPos[i]), k, v)
	}
}

func addBias(x, b []float32) {
	for i := range b {
		x[i] += b[i]
	}
}

// swiglu computes g = silu(gate·x) * up·x for n rows of x (nothing when
// the member holds no FFN columns).
func (r *Runner) swiglu(gate, up *kernels.Matrix, x []float32, n int, g, u []float32) {
	if gate == nil {
		return
	}
	F := gate.Rows
	if t := gate.ActType(); up.ActType() == t {
		kernels.QuantizeActs(r.pool, t, x, n, gate.Cols, r.s.acts)
		kernels.MatMuls(r.pool, r.s.acts, n, []*kernels.Matrix{gate, up}, [][]float32{g, u})
	} else {
		r.matmul(gate, x, n, g)
		r.matmul(up, x, n, u)
	}
	kernels.SiLUMul(g[:n*F], u[:n*F])
}

// ffn computes out = down(silu(gate·x) * up·x) for n rows of x.
func (r *Runner) ffn(gate, up, down *kernels.Matrix, x []float32, n int, g, u, out []float32) {
	r.swiglu(gate, up, x, n, g, u)
	r.matmul(down, g, n, out)
}

// attention runs the attention of the batch's n tokens. A job is a token
// and a KV head, with all the query heads that share it (or a part of
// them, when there would otherwise be fewer jobs than twice the threads):
// each block of keys and values is read from memory once and then from L1
// for the other heads, instead of once per query head.
func (r *Runner) attention(n int) {
	group := r.m.NHead / r.m.NHeadKV
	r.attnParts = 1
	if jobs := n * r.nkv; jobs < 2*r.pool.Threads() {
		r.attnParts = min(group, (2*r.pool.Threads()+jobs-1)/jobs)
	}
	r.pool.RunWorker(n*r.nkv*r.attnParts, 1, r.attnFn)
}

// attnRange runs attention jobs [a,z) (see attention) on worker w: per
// query head, softmax(q·K/√D)·V over the token's context, in float32 with
// the query and probabilities rounded to half precision as ggml does with an
// F16 cache.
func (r *Runner) attnRange(w, a, z int) {
	m, s := r.m, &r.s
	D, Q, KV := m.HeadDim, r.qd, r.kvd
	layer := r.cur - r.lo
	group := m.NHead / m.NHeadKV
	bs := r.cache.Config().BlockSize
	scale := float32(1 / math.Sqrt(float64(D)))
	ws := &r.attnWork[w]
	parts := r.attnParts
	per := (group + parts - 1) / parts
	for job := a; job < z; job++ {
		i, kvh, part := job/(r.nkv*parts), job/parts%r.nkv, job%parts
		// the member's query heads [h0,h0+g) share its KV head kvh: those
		// of the model's group kvLo+kvh that the slice holds, counted from
		// its first
		first := max((r.kvLo+kvh)*group, r.sl.HeadLo) - r.sl.HeadLo
		last := min((r.kvLo+kvh+1)*group, r.sl.HeadHi) - r.sl.HeadLo
		h0 := first + part*per
		g := min(per, last-h0)
		if g <= 0 {
			continue
		}
		blocks := s.blocks[s.tokSeq[i]]
		ctx := int(s.tokPos[i]) + 1
		qh := func(j int) []float32 { return ws.qh[j*D : (j+1)*D] }
		acc := func(j int) []float32 { return ws.acc[j*D : (j+1)*D] }
		scores := func(j int) []float32 { return ws.scores[j*ws.ctx : j*ws.ctx+ctx] }
		for j := 0; j < g; j++ {
			copy(qh(j), s.q[i*Q+(h0+j)*D:i*Q+(h0+j+1)*D])
			kernels.RoundF16(qh(j))
		}
		// K and V rows of one head are KV apart within a block: one kernel
		// call per block of positions and query head.
		for t := 0; t < ctx; t += bs {
			e := min(t+bs, ctx)
			k := r.cache.Store().(*kv.HostStore).KRun(layer, blocks, t)[kvh*D:]
			for j := 0; j < g; j++ {
				kernels.ScoresF16(scores(j)[t:e], qh(j), k, KV)
			}
		}
		for j := 0; j < g; j++ {
			sc := scores(j)
			mx := kernels.ScaleMax(sc, scale)
			// softmaxInPlace's arithmetic, the probabilities then rounded
			// to half precision in the same pass
			kernels.ScaleRoundF16(sc, float32(1/kernels.ExpSub(sc, mx)))
			clear(acc(j))
		}
		for t := 0; t < ctx; t += bs {
			e := min(t+bs, ctx)
			v := r.cache.Store().(*kv.HostStore).VRun(layer, blocks, t)[kvh*D:]
			for j := 0; j < g; j++ {
				kernels.AccumF16(acc(j), scores(j)[t:e], v, KV)
			}
		}
		for j := 0; j < g; j++ {
			copy(s.att[i*Q+(h0+j)*D:i*Q+(h0+j+1)*D], acc(j))
		}
	}
}

// moe runs the routed-expert FFN (plus the shared expert where the
// architecture has one) on s.xn, writing to out. Every member routes every
// token; a member runs the chosen experts it holds and the group sums.
func (r *Runner) moe(ly *Layer, out []float32) error {
	m, s := r.m, &r.s
	n, E, X, K := s.n, m.NEmbd, m.NExpert, m.NExpertUsed
	r.matmul(ly.Router, s.xn, n, s.route)
	idx := s.expIdx
	for i := 0; i < n; i++ {
		p := s.route[i*X : (i+1)*X]
		softmaxInPlace(p)
		topK(p, idx, K)
		var sum float32
		for j := 0; j < K; j++ {
			s.expID[i*K+j] = int32(idx[j])
			s.expW[i*K+j] = p[idx[j]]
			sum += p[idx[j]]
		}
		if m.Arch.NormExperts {
			for j := 0; j < K; j++ {
				s.expW[i*K+j] /= sum
			}
		}
	}
	clear(out[:n*E])
	// Per expert: gather the tokens routed to it, run its FFN, scatter back
	// weighted. Experts are visited in each token's selection order so that
	// sums happen in the order ggml adds them.
	for j := 0; j < K; j++ {
		for e := 0; e < X; e++ {
			ex := &ly.Experts[e]
			if ex.Gate == nil {
				continue // held by another member
			}
			rows := s.expRows[:0]
			for i := 0; i < n; i++ {
				if int(s.expID[i*K+j]) == e {
					rows = append(rows, int32(i))
				}
			}
			if len(rows) == 0 {
				continue
			}
			for gi, i := range rows {
				copy(s.ex[gi*E:(gi+1)*E], s.xn[int(i)*E:(int(i)+1)*E])
			}
			r.ffn(ex.Gate, ex.Up, ex.Down, s.ex, len(rows), s.eg, s.eu, s.eo)
			for gi, i := range rows {
				w := s.expW[int(i)*K+j]
				o, src := out[int(i)*E:(int(i)+1)*E], s.eo[gi*E:(gi+1)*E]
				for c := range o {
					o[c] += src[c] * w
				}
			}
		}
	}
	if !m.Arch.SharedFFN {
		return r.allReduce(out[:n*E])
	}
	if ly.ShGateInp != nil {
		r.matmul(ly.ShGateInp, s.xn, n, s.shgate)
	}
	// The shared expert's partial product joins the routed sum before the
	// one all-reduce; gathered, it is complete and joins after it.
	if ly.ShDownGather {
		if err := r.allReduce(out[:n*E]); err != nil {
			return err
		}
		r.swiglu(ly.ShGate, ly.ShUp, s.xn, n, s.g, s.u)
		if err := r.project(ly.ShDown, true, s.g, n, r.tpCols(true), s.eo); err != nil {
			return err
		}
	} else if ly.ShGate == nil || ly.ShDown == nil {
		clear(s.eo[:n*E])
	} else {
		r.ffn(ly.ShGate, ly.ShUp, ly.ShDown, s.xn, n, s.g, s.u, s.eo)
	}
	for i := 0; i < n; i++ {
		gate := float32(1)
		if ly.ShGateInp != nil {
			gate = 1 / (1 + float32(math.Exp(float64(-s.shgate[i]))))
		}
		o, src := out[i*E:(i+1)*E], s.eo[i*E:(i+1)*E]
		for c := range o {
			o[c] += src[c] * gate
		}
	}
	if ly.ShDownGather {
		return nil
	}
	return r.allReduce(out[:n*E])
}

// Logits applies the output norm and head to the hidden rows listed in rows
// (indexes into x, [*][NEmbd]), writing len(rows) x NVocab values to out.
func (r *Runner) Logits(x []float32, rows []int, out []float32) {
	m, s := r.m, &r.s
	E := m.NEmbd
	n := len(rows)
	s.xn = grow(s.xn, n*E)
	s.acts = grow(s.acts, n*quant.F32.RowSize(E))
	for j, i := range rows {
		rmsNorm(s.xn[j*E:(j+1)*E], x[i*E:(i+1)*E], m.W.OutputNorm, m.RMSEps)
	}
	r.matmul(m.W.Output, s.xn, n, out)
}

// topK orders the first k entries of idx as the indexes of the k largest
// values of p, largest first, ties to the lower index (a stable selection).
func topK(p []float32, idx []int, k int) {
	for e := range idx {
		idx[e] = e
	}
	for j := 0; j < k; j++ {
		best := j
		for e := j + 1; e < len(idx); e++ {
			if p[idx[e]] > p[idx[best]] || (p[idx[e]] == p[idx[best]] && idx[e] < idx[best]) {
				best = e
			}
		}
		idx[j], idx[best] = idx[best], idx[j]
	}
}
