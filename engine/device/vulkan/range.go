package vulkan

import (
	"fmt"
	"unsafe"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/engine/kv"
)

// Device is a Vulkan GPU as an engine device.
type Device struct {
	GPU *GPU
}

// Name implements device.Device.
func (d Device) Name() string { return fmt.Sprintf("vulkan:%d", d.GPU.Info().Index) }

// Load implements device.Device: the range's weights are uploaded, its KV
// store allocated in device memory.
func (d Device) Load(ld device.Load) (device.Range, error) { return d.GPU.Load(ld) }

// vec is a float vector's place in a range's vector buffer (n = 0: none).
type vec struct{ off, n int }

type layerW struct {
	attnNorm, ffnNorm, bq, bk, bv, bo, qnorm, knorm vec
	wq, wk, wv, wo, gate, up, down                  *Matrix
	moe                                             *moeW
}

// Range is a layer range on the GPU.
type Range struct {
	g       *GPU
	sp      *device.Spec
	ld      device.Load
	layers  []layerW
	vecs    *vk.Buf
	outNorm vec
	output  *Matrix
	store   *kvStore
	nh, nkv int
	qd, kvd int
	maxF    int
	group   device.Group

	n, cap                                 int
	x, xn, q, k, v, att, gb, ub, o, logits *vk.Buf
	route, eo                              *vk.Buf
	xq                                     *vk.Buf // activations rounded as the CPU rounds them (see mv)
	gx, gy                                 *vk.Buf
	moeHost                                moeHost
	// gathered halves: the host side of a tensor-parallel member whose
	// attn_output or ffn_down holds whole rows (see device.Layer)
	gin, gpart, gfull, gbuf []float32
	tok, tab, cs            *vk.Buf
	tokHost, tabHost        []uint32
	csHost                  []float32
	kernels                 struct{ norm, add, rope, kvstore, attn, silu, quant *vk.Kernel }
}

// Load places ld on the GPU.
func (g *GPU) Load(ld device.Load) (*Range, error) {
	sp, p := &ld.Spec, ld.Part
	if ld.Hi-ld.Lo != len(ld.Layers) || ld.KV.Layers != len(ld.Layers) || ld.KV.BlockSize <= 0 {
		return nil, fmt.Errorf("vulkan: %d layers for the range [%d,%d) with a KV store of %d (block size %d)", len(ld.Layers), ld.Lo, ld.Hi, ld.KV.Layers, ld.KV.BlockSize)
	}
	if sp.HeadDim > 256 || sp.HeadDim%2 != 0 {
		return nil, fmt.Errorf("vulkan: head size %d (the attention kernel takes even sizes up to 256)", sp.HeadDim)
	}
	if op := lacks(ld); op != "" {
		return nil, fmt.Errorf("vulkan: no kernels yet for %s", op)
	}
	r := &Range{g: g, sp: sp, ld: ld, nh: p.HeadHi - p.HeadLo, nkv: p.KVHi - p.KVLo}
	r.qd, r.kvd = r.nh*sp.HeadDim, r.nkv*sp.HeadDim
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	if err := r.loadKernels(); err != nil {
		return nil, err
	}
	var err error
	var host []float32
	add := func(x []float32) vec {
		if x == nil {
			return vec{}
		}
		v := vec{off: len(host), n: len(x)}
		host = append(host, x...)
		return v
	}
	up := func(m *kernels.Matrix) (*Matrix, error) {
		if m == nil {
			return nil, nil
		}
		return g.Upload(m)
	}
	for i := range ld.Layers {
		ly := &ld.Layers[i]
		if ly.ShDownGather {
			return nil, fmt.Errorf("vulkan: layer %d's shared expert split is not block aligned (a gathered shared expert does not run on the GPU yet)", ld.Lo+i)
		}
		w := layerW{attnNorm: add(ly.AttnNorm), ffnNorm: add(ly.FFNNorm), bq: add(ly.Bq), bk: add(ly.Bk), bv: add(ly.Bv), bo: add(ly.Bo), qnorm: add(ly.QNorm), knorm: add(ly.KNorm)}
		for _, mm := range []struct {
			dst **Matrix
			src *kernels.Matrix
		}{{&w.wq, ly.Wq}, {&w.wk, ly.Wk}, {&w.wv, ly.Wv}, {&w.wo, ly.Wo}, {&w.gate, ly.Gate}, {&w.up, ly.Up}, {&w.down, ly.Down}} {
			if *mm.dst, err = up(mm.src); err != nil {
				r.layers = append(r.layers, w)
				return nil, fmt.Errorf("layer %d: %w", ld.Lo+i, err)
			}
		}
		if ly.Gate != nil {
			r.maxF = max(r.maxF, ly.Gate.Rows)
		}
		r.layers = append(r.layers, w)
		if sp.IsMoE() {
			mw, err := r.uploadMoE(ly)
			r.layers[len(r.layers)-1].moe = mw
			if err != nil {
				return nil, fmt.Errorf("layer %d: %w", ld.Lo+i, err)
			}
		}
	}
	r.outNorm = add(ld.OutputNorm)
	if r.output, err = up(ld.Output); err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	if r.vecs, err = g.floats(host); err != nil {
		return nil, err
	}
	if r.store, err = newKVStore(g, ld.KV); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// floats uploads x to a new buffer.
func (g *GPU) floats(x []float32) (*vk.Buf, error) {
	b, err := g.ctx.NewBuffer(uint64(4*max(len(x), 1)), false)
	if err != nil {
		return nil, err
	}
	if err := b.Write(0, f32bytes(x)); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

func f32bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

func u32bytes(x []uint32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// KV implements device.Range.
func (r *Range) KV() kv.Store { return r.store }

// SetGroup implements device.Range.
func (r *Range) SetGroup(g device.Group) { r.group = g }

// Hold implements device.Range (nothing to keep ready).
func (r *Range) Hold() {}

// Release implements device.Range.
func (r *Range) Release() {}

// Close frees the range's device memory.
func (r *Range) Close() {
	for _, w := range r.layers {
		for _, m := range append([]*Matrix{w.wq, w.wk, w.wv, w.wo, w.gate, w.up, w.down}, w.moe.matrices()...) {
			if m != nil {
				m.Free()
			}
		}
	}
	r.layers = nil
	if r.output != nil {
		r.output.Free()
		r.output = nil
	}
	if r.store != nil {
		r.store.free()
		r.store = nil
	}
	for _, b := range []**vk.Buf{&r.vecs, &r.x, &r.xn, &r.q, &r.k, &r.v, &r.att, &r.gb, &r.ub, &r.o, &r.logits, &r.tok, &r.tab, &r.cs, &r.route, &r.eo, &r.gx, &r.gy, &r.xq} {
		(*b).Free()
		*b = nil
	}
}

// Begin implements device.Range: it sizes the activation buffers and
// uploads the batch's positions, block tables and RoPE angles.
func (r *Range) Begin(b *device.Batch) error {
	m := r.sp
	n := 0
	for _, c := range b.Chunks {
		n += c.N
	}
	if n > r.cap {
		if err := r.grow(max(n, 2*r.cap)); err != nil {
			return err
		}
	}
	r.n = n
	bs := r.ld.KV.BlockSize
	half := m.RopeDim / 2
	r.tokHost = r.tokHost[:0]
	r.tabHost = r.tabHost[:0]
	r.csHost = grow(r.csHost, 2*n*half)
	cos, sin := r.csHost[:n*half], r.csHost[n*half:]
	// tok: the store row of each token, then (context, table offset) pairs
	var pairs []uint32
	i := 0
	for ci, c := range b.Chunks {
		if c.N <= 0 || c.Pos < 0 || (c.Pos+c.N+bs-1)/bs > len(c.Blocks) {
			return fmt.Errorf("chunk %d (positions [%d,%d)) has no reserved KV space", ci, c.Pos, c.Pos+c.N)
		}
		toff := uint32(len(r.tabHost))
		nb := (c.Pos + c.N + bs - 1) / bs
		for _, blk := range c.Blocks[:nb] {
			if blk < 0 || int(blk) >= r.ld.KV.NumBlocks {
				return fmt.Errorf("chunk %d: block %d outside the store's %d", ci, blk, r.ld.KV.NumBlocks)
			}
			r.tabHost = append(r.tabHost, uint32(blk))
		}
		for j := 0; j < c.N; j++ {
			pos := c.Pos + j
			r.tokHost = append(r.tokHost, uint32((int(c.Blocks[pos/bs])*bs+pos%bs)*r.kvd))
			pairs = append(pairs, uint32(pos+1), toff)
			cpu.RopeTable(cos[i*half:(i+1)*half], sin[i*half:(i+1)*half], pos, m)
			i++
		}
	}
	r.tokHost = append(r.tokHost, pairs...)
	if len(r.tabHost) == 0 {
		r.tabHost = append(r.tabHost, 0)
	}
	if err := r.ensure(&r.tab, 4*len(r.tabHost)); err != nil {
		return err
	}
	for _, w := range []struct {
		b *vk.Buf
		d []byte
	}{{r.tok, u32bytes(r.tokHost)}, {r.tab, u32bytes(r.tabHost)}, {r.cs, f32bytes(r.csHost)}} {
		if err := w.b.Write(0, w.d); err != nil {
			return err
		}
	}
	return nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// ensure makes *b hold at least size bytes.
func (r *Range) ensure(b **vk.Buf, size int) error {
	if *b != nil && (*b).Size >= uint64(size) {
		return nil
	}
	(*b).Free()
	nb, err := r.g.ctx.NewBuffer(uint64(max(size, 4)), false)
	if err != nil {
		*b = nil
		return err
	}
	*b = nb
	return nil
}

// grow sizes the activation buffers for n tokens.
func (r *Range) grow(n int) error {
	m := r.sp
	E, F := m.NEmbd, max(r.maxF, 1)
	for _, s := range []struct {
		b    **vk.Buf
		size int
	}{
		{&r.x, n * E}, {&r.xn, n * E}, {&r.o, n * E},
		{&r.q, n * max(r.qd, 1)}, {&r.att, n * max(r.qd, 1)}, {&r.k, n * max(r.kvd, 2)}, {&r.v, n * max(r.kvd, 2)},
		{&r.gb, n * F}, {&r.ub, n * F},
		{&r.tok, 3 * n}, {&r.cs, n * max(m.RopeDim, 1)},
		{&r.route, n * (m.NExpert + 1)}, {&r.eo, n * E},
		{&r.xq, n * max(E, m.NHead*m.HeadDim, F)},
	} {
		if err := r.ensure(s.b, 4*s.size); err != nil {
			return fmt.Errorf("vulkan: activations for %d tokens: %w", n, err)
		}
	}
	r.cap = n
	return nil
}

// layer is the weights of layer l.
func (r *Range) layer(l int) (*layerW, error) {
	if l < r.ld.Lo || l >= r.ld.Hi {
		return nil, fmt.Errorf("layer %d is not within this range's [%d,%d)", l, r.ld.Lo, r.ld.Hi)
	}
	return &r.layers[l-r.ld.Lo], nil
}

// run records with rec between writing in to buffer dst and reading
// buffer src to out.
func (r *Range) run(in []float32, dst *vk.Buf, rec func(cmd *vk.Cmd) error, src *vk.Buf, out []float32) error {
	if err := dst.Write(0, f32bytes(in)); err != nil {
		return err
	}
	cmd := r.g.ctx.Begin()
	err := rec(cmd)
	if serr := cmd.Submit(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	return src.Read(0, f32bytes(out))
}

// Attention implements device.Range.
func (r *Range) Attention(l int, x, out []float32) (bool, error) {
	w, err := r.layer(l)
	if err != nil {
		return false, err
	}
	E := r.sp.NEmbd
	if ly := &r.ld.Layers[l-r.ld.Lo]; ly.WoGather {
		r.gin = grow(r.gin, r.n*r.qd)
		if err := r.run(x[:r.n*E], r.x, func(cmd *vk.Cmd) error { r.recAttnCore(cmd, l, w, r.x); return nil }, r.att, r.gin); err != nil {
			return false, err
		}
		return false, r.gathered(w.wo, r.gin, r.group.AttnCols, out[:r.n*E])
	}
	return true, r.run(x[:r.n*E], r.x, func(cmd *vk.Cmd) error { r.recAttention(cmd, l, w, r.x, r.o); return nil }, r.o, out[:r.n*E])
}

// FFN implements device.Range.
func (r *Range) FFN(l int, x, out []float32) (bool, error) {
	w, err := r.layer(l)
	if err != nil {
		return false, err
	}
	E := r.sp.NEmbd
	if w.moe != nil {
		return true, r.moe(w, x[:r.n*E], out[:r.n*E])
	}
	if ly := &r.ld.Layers[l-r.ld.Lo]; ly.DownGather {
		F := 0
		if w.gate != nil {
			F = w.gate.Rows
		}
		r.gin = grow(r.gin, r.n*F)
		if F > 0 {
			err := r.run(x[:r.n*E], r.x, func(cmd *vk.Cmd) error {
				r.norm(cmd, r.x, r.n, E, w.ffnNorm, r.xn)
				r.swigluIn(cmd, w.gate, w.up, Vec{B: r.xn, Stride: E}, r.n)
				return nil
			}, r.gb, r.gin)
			if err != nil {
				return false, err
			}
		}
		return false, r.gathered(w.down, r.gin, r.group.FFNCols, out[:r.n*E])
	}
	return true, r.run(x[:r.n*E], r.x, func(cmd *vk.Cmd) error { r.recFFN(cmd, w, r.x, r.o); return nil }, r.o, out[:r.n*E])
}

// Residual implements device.Range (on the host, where the halves' outputs
// are).
func (r *Range) Residual(l int, h device.Half, x, out []float32) {
	n, E := r.n, r.sp.NEmbd
	if ly := &r.ld.Layers[l-r.ld.Lo]; h == device.AttnHalf && ly.Bo != nil {
		for i := 0; i < n; i++ {
			cpu.AddBias(out[i*E:(i+1)*E], ly.Bo)
		}
	}
	for i := range out[:n*E] {
		x[i] += out[i]
	}
}

// Forward implements device.Range: every layer of [lo,hi) in one command
// buffer, the hidden states staying on the device between layers.
func (r *Range) Forward(lo, hi int, x []float32) error {
	if lo < r.ld.Lo || hi > r.ld.Hi || lo > hi {
		return fmt.Errorf("layers [%d,%d) are not within this range's [%d,%d)", lo, hi, r.ld.Lo, r.ld.Hi)
	}
	if r.ld.Coll != nil && r.ld.Coll.Size() > 1 {
		return fmt.Errorf("a tensor-parallel member runs its layers by halves")
	}
	E := r.sp.NEmbd
	if r.sp.IsMoE() {
		// the experts are chosen on the host: layer by layer, by halves
		o := make([]float32, r.n*E)
		for l := lo; l < hi; l++ {
			for h, half := range []func(int, []float32, []float32) (bool, error){r.Attention, r.FFN} {
				if _, err := half(l, x, o); err != nil {
					return fmt.Errorf("layer %d: %w", l, err)
				}
				r.Residual(l, device.Half(h), x, o)
			}
		}
		return nil
	}
	return r.run(x[:r.n*E], r.x, func(cmd *vk.Cmd) error {
		for l := lo; l < hi; l++ {
			w := &r.layers[l-r.ld.Lo]
			r.recAttention(cmd, l, w, r.x, r.o)
			r.add(cmd, r.x, r.o, w.bo) // x += attention (+ its bias)
			r.recFFN(cmd, w, r.x, r.o)
			r.add(cmd, r.x, r.o, vec{})
		}
		return nil
	}, r.x, x[:r.n*E])
}

// Logits implements device.Range.
func (r *Range) Logits(x []float32, rows []int, out []float32) error {
	E, V := r.sp.NEmbd, r.sp.NVocab
	n := len(rows)
	if r.output == nil {
		return fmt.Errorf("this range holds no output head")
	}
	if err := r.ensure(&r.x, 4*n*E); err != nil {
		return err
	}
	if err := r.ensure(&r.xn, 4*n*E); err != nil {
		return err
	}
	if err := r.ensure(&r.logits, 4*n*V); err != nil {
		return err
	}
	if err := r.ensure(&r.xq, 4*n*E); err != nil {
		return err
	}
	sel := make([]float32, n*E)
	for j, i := range rows {
		copy(sel[j*E:(j+1)*E], x[i*E:(i+1)*E])
	}
	return r.run(sel, r.x, func(cmd *vk.Cmd) error {
		r.norm(cmd, r.x, n, E, r.outNorm, r.xn)
		r.mv(cmd, r.output, Vec{B: r.xn, Stride: E}, n, Vec{B: r.logits, Stride: V})
		return nil
	}, r.logits, out[:n*V])
}

// loadKernels builds (or takes from the GPU's cache) the range's op kernels.
func (r *Range) loadKernels() error {
	k := &r.kernels
	for _, kk := range []struct {
		p          **vk.Kernel
		name       string
		nbind, psz int
		spec       []uint32
	}{
		{&k.norm, "rmsnorm", 3, 32, []uint32{wg}},
		{&k.add, "add", 3, 36, nil},
		{&k.rope, "rope", 2, 28, nil},
		{&k.kvstore, "kvstore", 5, 12, nil},
		{&k.attn, "attn", 6, 36, []uint32{wg}},
		{&k.silu, "silumul", 2, 4, nil},
		{&k.quant, "quantact", 2, 24, nil},
	} {
		var err error
		if *kk.p, err = r.g.kernel(kk.name, kk.nbind, kk.psz, kk.spec...); err != nil {
			return err
		}
	}
	return nil
}
