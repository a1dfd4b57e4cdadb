package cpu

import (
	"fmt"

	"shoal/engine/device"
	"shoal/engine/kernels"
	"shoal/engine/kv"
	"shoal/engine/quant"
)

// Device is the CPU.
type Device struct{}

// Name implements device.Device.
func (Device) Name() string { return "cpu" }

// Load implements device.Device: the weights stay where they are.
func (Device) Load(ld device.Load) (device.Range, error) { return Load(ld) }

// Range is a layer range on the CPU.
type Range struct {
	sp      *device.Spec
	ld      device.Load
	pool    *kernels.Pool
	store   *kv.HostStore
	nh, nkv int // query and KV heads held
	qd, kvd int // their widths: nh·HeadDim, nkv·HeadDim
	tp      *tpState
	// swaRope is the spec with the sliding layers' RoPE base (nil when
	// they use the model's).
	swaRope *device.Spec

	s scratch

	// Parallel sections are built once so a batch does not allocate.
	cur      int // layer being executed
	prepFn   func(lo, hi int)
	attnFn   func(w, lo, hi int)
	attnWork []attnScratch
	// attnParts: attention jobs split each KV head's query heads in this
	// many parts (see attention).
	attnParts int
	// mla is the multi-head latent attention state (Spec.MLA), or nil.
	mla       *mlaState
	mlaPrepFn func(lo, hi int)
}

// Load places ld on the CPU.
func Load(ld device.Load) (*Range, error) {
	if ld.Hi-ld.Lo != len(ld.Layers) || ld.KV.Layers != len(ld.Layers) || ld.KV.BlockSize <= 0 {
		return nil, fmt.Errorf("cpu: %d layers for the range [%d,%d) with a KV store of %d (block size %d)", len(ld.Layers), ld.Lo, ld.Hi, ld.KV.Layers, ld.KV.BlockSize)
	}
	sp, p := &ld.Spec, ld.Part
	if err := kv.CheckType(ld.KV.Type, sp.HeadDim); ld.KV.Type != quant.F32 && err != nil {
		return nil, err
	}
	if sp.MLA != nil && !ld.KV.VInK {
		return nil, fmt.Errorf("cpu: multi-head latent attention caches its latent once: its KV store must have V as a view of K")
	}
	r := &Range{sp: sp, ld: ld, pool: kernels.NewPool(ld.Threads), store: kv.NewHostStore(ld.KV),
		nh: p.HeadHi - p.HeadLo, nkv: p.KVHi - p.KVLo}
	r.qd, r.kvd = r.nh*sp.HeadDim, r.nkv*sp.HeadDim
	if sp.RopeThetaSWA != 0 {
		l := *sp
		l.RopeTheta, l.RopeScale, l.RopeFreqs, l.Yarn = sp.RopeThetaSWA, 1, nil, nil
		r.swaRope = &l
	}
	if ld.Coll != nil && ld.Coll.Size() > 1 {
		r.tp = &tpState{coll: ld.Coll}
	}
	r.prepFn = r.prepRange
	r.attnFn = r.attnRange
	if sp.MLA != nil {
		r.initMLA()
	}
	r.attnWork = make([]attnScratch, r.pool.Threads())
	ctx := ld.KV.NumBlocks * ld.KV.BlockSize
	group := sp.NHead / sp.NHeadKV
	for i := range r.attnWork {
		r.attnWork[i] = attnScratch{ctx: ctx, scores: make([]float32, group*ctx), qh: make([]float32, group*sp.HeadDim), acc: make([]float32, group*sp.HeadDim)}
		if t := r.store.Type(); t != quant.F16 {
			r.attnWork[i].qq = make([]byte, group*quant.VecDotType(t).RowSize(sp.HeadDim))
			r.attnWork[i].vrow = make([]float32, sp.HeadDim)
		}
	}
	return r, nil
}

// KV implements device.Range.
func (r *Range) KV() kv.Store { return r.store }

// Hold implements device.Range.
func (r *Range) Hold() { r.pool.Hold() }

// Release implements device.Range.
func (r *Range) Release() { r.pool.Release() }

// Close stops the range's threads.
func (r *Range) Close() { r.pool.Close() }

// Pool is the range's worker pool.
func (r *Range) Pool() *kernels.Pool { return r.pool }

// SetGroup implements device.Range.
func (r *Range) SetGroup(g device.Group) {
	if r.tp != nil {
		r.tp.Group = g
	}
}

// layer is the weights of layer l.
func (r *Range) layer(l int) *device.Layer { return &r.ld.Layers[l-r.ld.Lo] }

// Forward implements device.Range.
func (r *Range) Forward(lo, hi int, x []float32) error {
	if lo < r.ld.Lo || hi > r.ld.Hi || lo > hi {
		return fmt.Errorf("layers [%d,%d) are not within this range's [%d,%d)", lo, hi, r.ld.Lo, r.ld.Hi)
	}
	if r.tp != nil {
		return fmt.Errorf("a tensor-parallel member runs its layers by halves")
	}
	o := r.s.o
	for l := lo; l < hi; l++ {
		if _, err := r.Attention(l, x, o); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		r.Residual(l, device.AttnHalf, x, o)
		if _, err := r.FFN(l, x, o); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		r.Residual(l, device.FFNHalf, x, o)
	}
	return nil
}

// Residual implements device.Range.
func (r *Range) Residual(l int, h device.Half, x, out []float32) {
	n, E := r.s.n, r.sp.NEmbd
	ly := r.layer(l)
	if h == device.AttnHalf && ly.Bo != nil { // once, on the reduced product every member holds
		for i := 0; i < n; i++ {
			AddBias(out[i*E:(i+1)*E], ly.Bo)
		}
	}
	post := ly.AttnPostNorm
	if h == device.FFNHalf {
		post = ly.FFNPostNorm
	}
	if post != nil {
		for i := 0; i < n; i++ {
			RMSNorm(out[i*E:(i+1)*E], out[i*E:(i+1)*E], post, r.sp.RMSEps)
		}
	}
	for i := range out[:n*E] {
		x[i] += out[i]
	}
}

// Logits implements device.Range.
func (r *Range) Logits(x []float32, rows []int, out []float32) error {
	s := &r.s
	E := r.sp.NEmbd
	n := len(rows)
	s.xn = Grow(s.xn, n*E)
	s.acts = Grow(s.acts, n*quant.F32.RowSize(E))
	for j, i := range rows {
		RMSNorm(s.xn[j*E:(j+1)*E], x[i*E:(i+1)*E], r.ld.OutputNorm, r.sp.RMSEps)
	}
	if r.ld.Output == nil {
		return fmt.Errorf("this range holds no output head")
	}
	r.matmul(r.ld.Output, s.xn, n, out)
	return nil
}

// matmul computes out[i] = W · x[i] for n rows of x (cols = W.Cols),
// quantizing x once to W's activation format.
func (r *Range) matmul(w *kernels.Matrix, x []float32, n int, out []float32) {
	t := w.ActType()
	kernels.QuantizeActs(r.pool, t, x, n, w.Cols, r.s.acts)
	kernels.MatMul(r.pool, w, r.s.acts, n, out, w.Rows)
}

// matmulQ is matmul reusing activations already quantized by a previous
// call for a matrix with the same activation format.
func (r *Range) matmulQ(w *kernels.Matrix, n int, out []float32) {
	kernels.MatMul(r.pool, w, r.s.acts, n, out, w.Rows)
}
