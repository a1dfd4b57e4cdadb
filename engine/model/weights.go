package model

import (
	"fmt"

	"shoal/engine/gguf"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// Layer holds one transformer block's weights (views into the mapped file).
type Layer struct {
	AttnNorm   []float32
	Wq, Wk, Wv *kernels.Matrix
	Wo         *kernels.Matrix
	Bq, Bk, Bv []float32 // nil when the architecture has no biases
	QNorm      []float32 // per-head RMSNorm weights (qwen3), else nil
	KNorm      []float32
	FFNNorm    []float32

	// Dense FFN.
	Gate, Up, Down *kernels.Matrix

	// Routed experts: Router is [NExpert x NEmbd]; expert e's matrices are
	// rows [e*F, (e+1)*F) of GateExps/UpExps and [e*NEmbd, (e+1)*NEmbd) of DownExps.
	Router                     *kernels.Matrix
	GateExps, UpExps, DownExps *kernels.Matrix
	ShGate, ShUp, ShDown       *kernels.Matrix // shared expert (qwen2moe)
	ShGateInp                  *kernels.Matrix // 1 x NEmbd, sigmoid gate of the shared expert

	Experts []Expert // views of GateExps/UpExps/DownExps per expert
}

// Expert is one routed expert's FFN.
type Expert struct{ Gate, Up, Down *kernels.Matrix }

// Weights holds a model's tensors.
type Weights struct {
	TokEmbd    *kernels.Matrix
	OutputNorm []float32
	Output     *kernels.Matrix // == TokEmbd when tied
	RopeFreqs  []float32       // llama3 per-dimension frequency divisors, or nil
	Layers     []Layer
}

// loader binds tensors by name and checks their shapes.
type loader struct {
	f    *gguf.File
	used map[string]bool
}

func (l *loader) tensor(name string, required bool, dims ...int) (*gguf.TensorInfo, error) {
	t, ok := l.f.Tensor(name)
	if !ok {
		if required {
			return nil, fmt.Errorf("missing tensor %s", name)
		}
		return nil, nil
	}
	l.used[name] = true
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
		return nil, fmt.Errorf("tensor %s has shape %v, want %v", name, t.Dims, dims)
	}
	return t, nil
}

// matrix binds a 2-D (or 3-D, experts stacked) weight: cols x rows (x experts).
func (l *loader) matrix(name string, required bool, dims ...int) (*kernels.Matrix, error) {
	t, err := l.tensor(name, required, dims...)
	if t == nil || err != nil {
		return nil, err
	}
	rows := 1
	for _, d := range dims[1:] {
		rows *= d
	}
	m, err := kernels.NewMatrix(t.Type, rows, dims[0], l.f.Data(t))
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	if !quant.VecDotType(t.Type).Known() || t.Type == quant.Q8_K {
		return nil, fmt.Errorf("tensor %s: type %s cannot be used as a weight matrix", name, t.Type)
	}
	return m, nil
}

// vector binds a 1-D tensor and converts it to float32.
func (l *loader) vector(name string, required bool, n int) ([]float32, error) {
	t, err := l.tensor(name, required, n)
	if t == nil || err != nil {
		return nil, err
	}
	if err := t.Type.CheckRow(n); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	out := make([]float32, n)
	quant.DequantizeRow(t.Type, l.f.Data(t), out)
	return out, nil
}

func loadWeights(f *gguf.File, c *Config) (*Weights, error) {
	l := &loader{f: f, used: map[string]bool{}}
	w := &Weights{Layers: make([]Layer, c.NLayer)}
	var err error
	must := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	E, Q, KV := c.NEmbd, c.QDim(), c.KVDim()
	var e error
	w.TokEmbd, e = l.matrix("token_embd.weight", true, E, c.NVocab)
	must(e)
	w.OutputNorm, e = l.vector("output_norm.weight", true, E)
	must(e)
	w.Output, e = l.matrix("output.weight", false, E, c.NVocab)
	must(e)
	if w.Output == nil {
		w.Output = w.TokEmbd
	}
	w.RopeFreqs, e = l.vector("rope_freqs.weight", false, c.RopeDim/2)
	must(e)
	for i := range w.Layers {
		ly := &w.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		ly.AttnNorm, e = l.vector(p+"attn_norm.weight", true, E)
		must(e)
		ly.Wq, e = l.matrix(p+"attn_q.weight", true, E, Q)
		must(e)
		ly.Wk, e = l.matrix(p+"attn_k.weight", true, E, KV)
		must(e)
		ly.Wv, e = l.matrix(p+"attn_v.weight", true, E, KV)
		must(e)
		ly.Wo, e = l.matrix(p+"attn_output.weight", true, Q, E)
		must(e)
		ly.Bq, e = l.vector(p+"attn_q.bias", false, Q)
		must(e)
		ly.Bk, e = l.vector(p+"attn_k.bias", false, KV)
		must(e)
		ly.Bv, e = l.vector(p+"attn_v.bias", false, KV)
		must(e)
		ly.QNorm, e = l.vector(p+"attn_q_norm.weight", c.Arch.QKNorm, c.HeadDim)
		must(e)
		ly.KNorm, e = l.vector(p+"attn_k_norm.weight", c.Arch.QKNorm, c.HeadDim)
		must(e)
		ly.FFNNorm, e = l.vector(p+"ffn_norm.weight", true, E)
		must(e)
		if c.IsMoE() {
			F, X := c.NFFExpert, c.NExpert
			ly.Router, e = l.matrix(p+"ffn_gate_inp.weight", true, E, X)
			must(e)
			ly.GateExps, e = l.matrix(p+"ffn_gate_exps.weight", true, E, F, X)
			must(e)
			ly.UpExps, e = l.matrix(p+"ffn_up_exps.weight", true, E, F, X)
			must(e)
			ly.DownExps, e = l.matrix(p+"ffn_down_exps.weight", true, F, E, X)
			must(e)
			if err == nil {
				ly.Experts = make([]Expert, X)
				for e := range ly.Experts {
					ly.Experts[e] = Expert{
						Gate: ly.GateExps.Slice(e*F, (e+1)*F),
						Up:   ly.UpExps.Slice(e*F, (e+1)*F),
						Down: ly.DownExps.Slice(e*E, (e+1)*E),
					}
				}
			}
			if c.Arch.SharedFFN {
				S := c.NFFShared
				ly.ShGate, e = l.matrix(p+"ffn_gate_shexp.weight", true, E, S)
				must(e)
				ly.ShUp, e = l.matrix(p+"ffn_up_shexp.weight", true, E, S)
				must(e)
				ly.ShDown, e = l.matrix(p+"ffn_down_shexp.weight", true, S, E)
				must(e)
				ly.ShGateInp, e = l.matrix(p+"ffn_gate_inp_shexp.weight", false, E)
				must(e)
			}
		} else {
			if c.NFF == 0 {
				must(fmt.Errorf("feed_forward_length is missing or 0"))
			}
			ly.Gate, e = l.matrix(p+"ffn_gate.weight", true, E, c.NFF)
			must(e)
			ly.Up, e = l.matrix(p+"ffn_up.weight", true, E, c.NFF)
			must(e)
			ly.Down, e = l.matrix(p+"ffn_down.weight", true, c.NFF, E)
			must(e)
		}
		if err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}
