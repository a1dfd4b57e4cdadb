package model

import (
	"fmt"

	"shoal/engine/device"
	"shoal/engine/gguf"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// Layer holds one transformer block's weights (views into the mapped file);
// the device package defines it, for the devices that load it.
type Layer = device.Layer

// Expert is one routed expert's FFN.
type Expert = device.Expert

// Weights holds a model's tensors.
type Weights struct {
	TokEmbd    *kernels.Matrix
	OutputNorm []float32
	Output     *kernels.Matrix // == TokEmbd when tied
	RopeFreqs  []float32       // llama3 per-dimension frequency divisors, or nil
	Layers     []Layer         // NLayer entries; only [Lo,Hi) are loaded
	Lo, Hi     int
}

// HeldTensor is the part of a tensor a source holds, packed densely: Rows
// rows (counted over every dimension but the first, so stacked experts are
// row runs too) of Cols elements each.
type HeldTensor struct {
	Type       quant.Type
	Cols, Rows int
	Data       []byte
}

// Source gives the tensors of a model slice by GGUF name (shard.Shard is
// one). What each tensor must hold follows from the slice (see LoadSource).
type Source interface {
	HeldTensor(name string) (HeldTensor, bool)
}

// loader binds tensors by name and checks their shapes, from a whole GGUF
// file (f) or from a source of sliced tensors (src).
type loader struct {
	f   *gguf.File
	src Source
	// release, when set, drops the pages of tensor bytes copied elsewhere
	// and reports whether it did (see gguf.File.Release).
	release func([]byte) bool
}

// Releaser is a Source whose tensor bytes may be mapped from a file: Release
// drops the pages of bytes the engine has copied (see gguf.File.Release).
type Releaser interface {
	Release(b []byte) bool
}

// tensor finds name and checks that it holds dims (ggml order; for a
// source, dims are what is held and only the first and the product of the
// rest are checked).
func (l *loader) tensor(name string, required bool, dims ...int) (HeldTensor, bool, error) {
	rows := 1
	for _, d := range dims[1:] {
		rows *= d
	}
	if l.src != nil {
		h, ok := l.src.HeldTensor(name)
		if !ok {
			if required {
				return HeldTensor{}, false, fmt.Errorf("missing tensor %s", name)
			}
			return HeldTensor{}, false, nil
		}
		if dims[0] == 0 || rows == 0 { // nothing held: any empty shape
			if h.Cols*h.Rows != 0 {
				return HeldTensor{}, false, fmt.Errorf("tensor %s holds %d x %d, want nothing", name, h.Rows, h.Cols)
			}
			return h, true, nil
		}
		if h.Cols != dims[0] || h.Rows != rows {
			return HeldTensor{}, false, fmt.Errorf("tensor %s holds %d x %d, want %d x %d", name, h.Rows, h.Cols, rows, dims[0])
		}
		return h, true, nil
	}
	t, ok := l.f.Tensor(name)
	if !ok {
		if required {
			return HeldTensor{}, false, fmt.Errorf("missing tensor %s", name)
		}
		return HeldTensor{}, false, nil
	}
	match := len(t.Dims) >= 1
	for i, d := range dims {
		if t.Dim(i) != d {
			match = false
		}
	}
	for i := len(dims); i < len(t.Dims); i++ {
		if t.Dims[i] != 1 {
			match = false
		}
	}
	if !match {
		return HeldTensor{}, false, fmt.Errorf("tensor %s has shape %v, want %v", name, t.Dims, dims)
	}
	return HeldTensor{Type: t.Type, Cols: dims[0], Rows: rows, Data: l.f.Data(t)}, true, nil
}

// typeOf is the type of name, if present.
func (l *loader) typeOf(name string) (quant.Type, bool) {
	if l.src != nil {
		h, ok := l.src.HeldTensor(name)
		return h.Type, ok
	}
	t, ok := l.f.Tensor(name)
	if !ok {
		return 0, false
	}
	return t.Type, true
}

// matrix binds a 2-D (or 3-D, experts stacked) weight: cols x rows (x
// experts). A matrix holding no rows or columns is nil.
func (l *loader) matrix(name string, required bool, dims ...int) (*kernels.Matrix, error) {
	t, ok, err := l.tensor(name, required, dims...)
	if !ok || err != nil || t.Rows == 0 || t.Cols == 0 {
		return nil, err
	}
	m, err := kernels.NewMatrix(t.Type, t.Rows, t.Cols, t.Data)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	if !quant.VecDotType(t.Type).Known() || t.Type == quant.Q8_K {
		return nil, fmt.Errorf("tensor %s: type %s cannot be used as a weight matrix", name, t.Type)
	}
	return m, nil
}

// vector binds a 1-D tensor and converts it to float32 (nil when it holds
// nothing).
func (l *loader) vector(name string, required bool, n int) ([]float32, error) {
	t, ok, err := l.tensor(name, required, n)
	if !ok || err != nil || n == 0 {
		return nil, err
	}
	if err := t.Type.CheckRow(n); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	if len(t.Data) != t.Type.RowSize(n) {
		return nil, fmt.Errorf("tensor %s: %d bytes for %d values of %s", name, len(t.Data), n, t.Type)
	}
	out := make([]float32, n)
	quant.DequantizeRow(t.Type, t.Data, out)
	return out, nil
}

// vectors binds a 2-D tensor of rows vectors of n values (per-expert
// biases, every expert's) as float32, rows after rows.
func (l *loader) vectors(name string, n, rows int) ([]float32, error) {
	t, _, err := l.tensor(name, true, n, rows)
	if err != nil {
		return nil, err
	}
	if len(t.Data) != t.Type.RowSize(n)*rows || t.Type.CheckRow(n) != nil {
		return nil, fmt.Errorf("tensor %s: %d bytes for %d x %d values of %s", name, len(t.Data), rows, n, t.Type)
	}
	out := make([]float32, n*rows)
	for r := 0; r < rows; r++ {
		quant.DequantizeRow(t.Type, t.Data[r*t.Type.RowSize(n):(r+1)*t.Type.RowSize(n)], out[r*n:(r+1)*n])
	}
	return out, nil
}

// splitMatrix binds a matrix of rows x cols split by input columns [lo,hi)
// in a tensor-parallel slice: the column slice when it is block aligned,
// else output rows OutputRows(sl.Rank, sl.Size, rows) of every column
// (gathered reports which).
func (l *loader) splitMatrix(name string, sl *Slice, cols, rows, lo, hi int) (m *kernels.Matrix, gathered bool, err error) {
	t, ok := l.typeOf(name)
	if !ok {
		return nil, false, fmt.Errorf("missing tensor %s", name)
	}
	if sl.Size <= 1 || ColumnSplitAligned(t, lo, hi) {
		m, err = l.matrix(name, true, hi-lo, rows)
		return m, false, err
	}
	rlo, rhi := OutputRows(sl.Rank, sl.Size, rows)
	m, err = l.matrix(name, true, cols, rhi-rlo)
	return m, true, err
}

// loadWeights binds the tensors of layers [lo,hi) and slice sl of the
// model; the embedding, output norm and output are required when loading a
// whole file and optional from a source.
func loadWeights(l *loader, c *Config, lo, hi int, sl *Slice) (*Weights, error) {
	w := &Weights{Layers: make([]Layer, c.NLayer), Lo: lo, Hi: hi}
	var err error
	must := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	global := l.src == nil
	E, D := c.NEmbd, c.HeadDim
	kvLo, kvHi := sl.KVHeads(c)
	Q, KV := (sl.HeadHi-sl.HeadLo)*D, (kvHi-kvLo)*D
	qlo := sl.HeadLo * D
	var e error
	w.TokEmbd, e = l.matrix("token_embd.weight", global, E, c.NVocab)
	must(e)
	w.OutputNorm, e = l.vector("output_norm.weight", global, E)
	must(e)
	w.Output, e = l.matrix("output.weight", false, E, c.NVocab)
	must(e)
	if w.Output == nil {
		w.Output = w.TokEmbd
	}
	w.RopeFreqs, e = l.vector("rope_freqs.weight", false, c.RopeDim/2)
	must(e)
	for i := lo; i < hi; i++ {
		ly := &w.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		ly.AttnNorm, e = l.vector(p+"attn_norm.weight", true, E)
		must(e)
		if c.MLA != nil {
			must(loadMLA(l, c, sl, p, ly))
		} else {
			ly.Wq, e = l.matrix(p+"attn_q.weight", true, E, Q)
			must(e)
			ly.Wk, e = l.matrix(p+"attn_k.weight", true, E, KV)
			must(e)
			ly.Wv, e = l.matrix(p+"attn_v.weight", true, E, KV)
			must(e)
			ly.Wo, ly.WoGather, e = l.splitMatrix(p+"attn_output.weight", sl, c.QDim(), E, qlo, qlo+Q)
			must(e)
			ly.Bq, e = l.vector(p+"attn_q.bias", false, Q)
			must(e)
			ly.Bk, e = l.vector(p+"attn_k.bias", false, KV)
			must(e)
			ly.Bv, e = l.vector(p+"attn_v.bias", false, KV)
			must(e)
			ly.Bo, e = l.vector(p+"attn_output.bias", false, E)
			must(e)
			ly.QNorm, e = l.vector(p+"attn_q_norm.weight", c.Arch.QKNorm, c.HeadDim)
			must(e)
			ly.KNorm, e = l.vector(p+"attn_k_norm.weight", c.Arch.QKNorm, c.HeadDim)
			must(e)
		}
		if c.Arch.OAI {
			ly.FFNNorm, e = l.vector(p+"post_attention_norm.weight", true, E)
			must(e)
			ly.Sinks, e = l.vector(p+"attn_sinks.weight", true, c.NHead)
			must(e)
			ly.RouterB, e = l.vector(p+"ffn_gate_inp.bias", true, c.NExpert)
			must(e)
			ly.ExpGateB, e = l.vectors(p+"ffn_gate_exps.bias", c.NFFExpert, c.NExpert)
			must(e)
			ly.ExpUpB, e = l.vectors(p+"ffn_up_exps.bias", c.NFFExpert, c.NExpert)
			must(e)
			ly.ExpDownB, e = l.vectors(p+"ffn_down_exps.bias", E, c.NExpert)
			must(e)
		} else {
			ly.FFNNorm, e = l.vector(p+c.Arch.ffnNorm(), true, E)
			must(e)
		}
		if c.Arch.Gemma {
			ly.AttnPostNorm, e = l.vector(p+"post_attention_norm.weight", true, E)
			must(e)
			ly.FFNPostNorm, e = l.vector(p+"post_ffw_norm.weight", true, E)
			must(e)
		}
		fdim, flo, fhi := c.LayerFFN(i, sl)
		F := fhi - flo
		if c.MoELayer(i) {
			FE, X := c.NFFExpert, c.NExpert
			held := X
			if sl.Experts != nil {
				held = len(sl.Experts)
			}
			ly.Router, e = l.matrix(p+"ffn_gate_inp.weight", true, E, X)
			must(e)
			ly.ExpProbsB, e = l.vector(p+"exp_probs_b.bias", false, X)
			must(e)
			ly.GateExps, e = l.matrix(p+"ffn_gate_exps.weight", true, E, FE, held)
			must(e)
			ly.UpExps, e = l.matrix(p+"ffn_up_exps.weight", true, E, FE, held)
			must(e)
			ly.DownExps, e = l.matrix(p+"ffn_down_exps.weight", true, FE, E, held)
			must(e)
			if err == nil {
				ly.Experts = make([]Expert, X)
				j := 0
				for x := range ly.Experts {
					if !sl.holds(x) {
						continue
					}
					ly.Experts[x] = Expert{
						Gate: ly.GateExps.Slice(j*FE, (j+1)*FE),
						Up:   ly.UpExps.Slice(j*FE, (j+1)*FE),
						Down: ly.DownExps.Slice(j*E, (j+1)*E),
					}
					j++
				}
			}
			if c.Arch.SharedFFN {
				ly.ShGate, e = l.matrix(p+"ffn_gate_shexp.weight", true, E, F)
				must(e)
				ly.ShUp, e = l.matrix(p+"ffn_up_shexp.weight", true, E, F)
				must(e)
				ly.ShDown, ly.ShDownGather, e = l.splitMatrix(p+"ffn_down_shexp.weight", sl, fdim, E, flo, fhi)
				must(e)
				ly.ShGateInp, e = l.matrix(p+"ffn_gate_inp_shexp.weight", false, E)
				must(e)
			}
		} else {
			if c.NFF == 0 {
				must(fmt.Errorf("feed_forward_length is missing or 0"))
			}
			ly.Gate, e = l.matrix(p+"ffn_gate.weight", true, E, F)
			must(e)
			ly.Up, e = l.matrix(p+"ffn_up.weight", true, E, F)
			must(e)
			ly.Down, ly.DownGather, e = l.splitMatrix(p+"ffn_down.weight", sl, fdim, E, flo, fhi)
			must(e)
		}
		if err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	if l.release != nil {
		packWeights(w, l.release)
	}
	return w, nil
}

// loadMLA binds a layer's latent attention (see device.Layer): the
// queries of the slice's heads, the latent's projection and norm (every
// member computes them), attn_k_b and attn_v_b of the slice's heads, and
// their columns of attn_output.
func loadMLA(l *loader, c *Config, sl *Slice, p string, ly *Layer) error {
	m, E := c.MLA, c.NEmbd
	nh := sl.HeadHi - sl.HeadLo
	var err error
	must := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	var e error
	if m.QLora > 0 {
		ly.WqA, e = l.matrix(p+"attn_q_a.weight", true, E, m.QLora)
		must(e)
		ly.QANorm, e = l.vector(p+"attn_q_a_norm.weight", true, m.QLora)
		must(e)
		ly.WqB, e = l.matrix(p+"attn_q_b.weight", true, m.QLora, nh*c.QHeadDim())
		must(e)
	} else {
		ly.Wq, e = l.matrix(p+"attn_q.weight", true, E, nh*c.QHeadDim())
		must(e)
	}
	ly.WkvA, e = l.matrix(p+"attn_kv_a_mqa.weight", true, E, m.KVLora+c.RopeDim)
	must(e)
	ly.KVANorm, e = l.vector(p+"attn_kv_a_norm.weight", true, m.KVLora)
	must(e)
	ly.WkB, e = l.matrix(p+"attn_k_b.weight", true, m.Nope, m.KVLora, nh)
	must(e)
	ly.WvB, e = l.matrix(p+"attn_v_b.weight", true, m.KVLora, m.VDim, nh)
	must(e)
	V := m.VDim
	ly.Wo, ly.WoGather, e = l.splitMatrix(p+"attn_output.weight", sl, c.NHead*V, E, sl.HeadLo*V, sl.HeadHi*V)
	must(e)
	return err
}

// packWeights replaces the layers' matrices (and an output matrix that is
// not the embedding) with resident copies (kernels.Resident): in the packed
// layout of the active kernels where they have one, so that decoding reads
// each group of rows with aligned loads, else the same bytes in the
// process's own memory, which one core streams faster than the page cache's
// pages. A copy replaces its matrix only when release dropped the
// original's file pages, so the weights take the same memory as before.
// Each routed expert gets copies of its own (packExperts). The embedding
// (read a row at a time) stays in the file.
func packWeights(w *Weights, release func([]byte) bool) {
	pack := func(m **kernels.Matrix) {
		if *m == nil {
			return
		}
		if p := kernels.Resident(*m); release((*m).Data) {
			*m = p
		}
	}
	for i := w.Lo; i < w.Hi; i++ {
		ly := &w.Layers[i]
		for _, m := range []**kernels.Matrix{&ly.Wq, &ly.Wk, &ly.Wv, &ly.Wo, &ly.Gate, &ly.Up, &ly.Down, &ly.ShGate, &ly.ShUp, &ly.ShDown, &ly.WqA, &ly.WqB, &ly.WkvA} {
			pack(m)
		}
		packExperts(ly, release)
	}
	if w.Output != w.TokEmbd {
		pack(&w.Output)
	}
}

// packExperts gives each routed expert of a MoE layer resident copies of
// its matrices (kernels.Resident: packed where each expert's rows divide
// into groups), in place of its views of the stacked tensors in the file,
// whose pages release then drops.
func packExperts(ly *Layer, release func([]byte) bool) {
	for _, k := range []struct {
		stacked *kernels.Matrix
		of      func(e *Expert) **kernels.Matrix
	}{
		{ly.GateExps, func(e *Expert) **kernels.Matrix { return &e.Gate }},
		{ly.UpExps, func(e *Expert) **kernels.Matrix { return &e.Up }},
		{ly.DownExps, func(e *Expert) **kernels.Matrix { return &e.Down }},
	} {
		if k.stacked == nil {
			continue
		}
		copies := make([]*kernels.Matrix, len(ly.Experts))
		for x := range ly.Experts {
			if m := *k.of(&ly.Experts[x]); m != nil {
				copies[x] = kernels.Resident(m)
			}
		}
		if !release(k.stacked.Data) {
			continue
		}
		for x, c := range copies {
			if c != nil {
				*k.of(&ly.Experts[x]) = c
			}
		}
	}
}
