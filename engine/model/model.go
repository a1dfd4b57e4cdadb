package model

import (
	"fmt"

	"shoal/engine/gguf"
)

// Model is a loaded model: hyperparameters and weight views into its file
// (or into a shard of it).
type Model struct {
	Config
	W    *Weights
	File *gguf.File // nil for a model loaded from a Source
	// Slice is the tensor-parallel slice the weights hold; nil when they
	// hold every head, FFN column and expert.
	Slice *Slice
}

// Load binds the model in f. f must stay open while the model is used.
func Load(f *gguf.File) (*Model, error) {
	c, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", displayPath(f), err)
	}
	whole := c.whole()
	w, err := loadWeights(&loader{f: f, release: f.Release}, &c, 0, c.NLayer, &whole)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", displayPath(f), err)
	}
	return &Model{Config: c, W: w, File: f}, nil
}

// LoadSource binds the tensors of layers [lo,hi) of a model with
// hyperparameters c from src, which holds slice sl of each layer (nil: all
// of it). For slice sl a tensor holds:
//
//   - attn_q (and its bias): rows of the query heads [HeadLo,HeadHi);
//     attn_k, attn_v: rows of the matching KV heads;
//   - ffn_gate, ffn_up (or the shared expert's): rows [FFNLo,FFNHi);
//   - attn_output, ffn_down (or the shared expert's): columns of the heads
//     or the FFN range, packed densely, when ColumnSplitAligned, else whole
//     rows OutputRows(Rank, Size, n_embd);
//   - the stacked routed experts: the held experts, in id order;
//   - norms, biases of outputs, the router: whole.
//
// token_embd, output_norm and output are optional (a pipeline stage may
// hold none of them). The weights are views of src's data, which must stay
// valid while the model is used.
func LoadSource(c Config, lo, hi int, sl *Slice, src Source) (*Model, error) {
	if lo < 0 || hi > c.NLayer || lo >= hi {
		return nil, fmt.Errorf("layer range [%d,%d) is not within [0,%d)", lo, hi, c.NLayer)
	}
	var s Slice
	if sl != nil {
		s = sl.normalize(&c)
	} else {
		s = c.whole()
	}
	if err := s.check(&c); err != nil {
		return nil, err
	}
	l := &loader{src: src}
	if r, ok := src.(Releaser); ok {
		l.release = r.Release
	}
	w, err := loadWeights(l, &c, lo, hi, &s)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: c, W: w}
	if s.Size > 1 { // a single member's slice is the whole model (s.check)
		m.Slice = &s
	}
	return m, nil
}

// Open maps and loads the GGUF model at path.
func Open(path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := Load(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

// Close unmaps the model file (a model loaded from a Source has none: its
// source owns the data).
func (m *Model) Close() error {
	if m.File == nil {
		return nil
	}
	return m.File.Close()
}

func displayPath(f *gguf.File) string {
	if p := f.Path(); p != "" {
		return p
	}
	return "model"
}
