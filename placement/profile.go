package placement

import (
	"fmt"

	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/quant"
)

// LayerProfile is what one transformer block costs, split by how a
// tensor-parallel group divides it.
type LayerProfile struct {
	// AttnBytes are the q, k, v and output projections and their biases:
	// divided among TP members by attention heads.
	AttnBytes uint64 `json:"attn_bytes"`
	// FFNBytes are the dense FFN (or the shared expert of a MoE layer):
	// divided among TP members by FFN columns.
	FFNBytes uint64 `json:"ffn_bytes"`
	// ExpertBytes is one routed expert (its gate, up and down slices); 0 for
	// a dense layer. Experts are placed whole.
	ExpertBytes uint64 `json:"expert_bytes"`
	// FixedBytes are replicated on every member: norms and the router.
	FixedBytes uint64 `json:"fixed_bytes"`

	// FLOPs per token of the matrix products (2 per weight element), split
	// the same way. ExpertFLOPs is one expert; attention over the context is
	// added by the planner because it depends on the context length.
	AttnFLOPs   float64 `json:"attn_flops"`
	FFNFLOPs    float64 `json:"ffn_flops"`
	ExpertFLOPs float64 `json:"expert_flops"`
	FixedFLOPs  float64 `json:"fixed_flops"`
}

// ModelProfile is what the planner knows about a model: shapes, split
// granularity and the bytes and FLOPs of every part.
type ModelProfile struct {
	Name    string `json:"name"`
	Arch    string `json:"arch"`
	NLayer  int    `json:"n_layer"`
	NEmbd   int    `json:"n_embd"`
	NHead   int    `json:"n_head"`
	NHeadKV int    `json:"n_head_kv"`
	HeadDim int    `json:"head_dim"`
	NVocab  int    `json:"n_vocab"`
	// FFNDim is the FFN size tensor parallelism splits: the dense FFN, or a
	// MoE layer's shared expert; 0 when a layer has only routed experts.
	FFNDim      int `json:"ffn_dim"`
	NExpert     int `json:"n_expert"`
	NExpertUsed int `json:"n_expert_used"`
	// HeadUnit is the number of query heads in the smallest head slice a TP
	// member can hold: whole GQA groups (n_head/n_head_kv query heads share
	// a KV head) whose width in attn_output columns is a whole number of
	// quantization blocks; when only the whole model's heads are such a
	// slice (one KV head: multi-query attention), a part of a group, each
	// member holding part of it replicating its KV head. NHead/HeadUnit
	// slices exist.
	HeadUnit int `json:"head_unit"`
	// FFNUnit is the FFN column granularity: a multiple of the block length
	// of the ffn_down tensors (256 for K-quants), at least 32.
	FFNUnit int `json:"ffn_unit"`
	// KVBytesPerToken is the K and V cache of one token in one layer (F16).
	KVBytesPerToken uint64         `json:"kv_bytes_per_token"`
	Layers          []LayerProfile `json:"layers"`
	EmbedBytes      uint64         `json:"embed_bytes"`  // token_embd
	OutputBytes     uint64         `json:"output_bytes"` // output and output_norm
	Tied            bool           `json:"tied"`         // the output reuses token_embd
	GlobalBytes     uint64         `json:"global_bytes"` // other tensors (rope_freqs): on every member
}

// WeightBytes is the size of every tensor of the model.
func (p *ModelProfile) WeightBytes() uint64 {
	n := p.EmbedBytes + p.OutputBytes + p.GlobalBytes
	for _, l := range p.Layers {
		n += l.AttnBytes + l.FFNBytes + l.FixedBytes + uint64(p.NExpert)*l.ExpertBytes
	}
	return n
}

// HeadUnits is the number of head slices a TP group can divide.
func (p *ModelProfile) HeadUnits() int { return p.NHead / p.HeadUnit }

// FFNUnits is the number of FFN column slices a TP group can divide.
func (p *ModelProfile) FFNUnits() int {
	if p.FFNDim == 0 {
		return 0
	}
	return p.FFNDim / p.FFNUnit
}

// OutputFLOPs is the logits projection per token.
func (p *ModelProfile) OutputFLOPs() float64 { return 2 * float64(p.NEmbd) * float64(p.NVocab) }

// ProfileFromGGUF builds the profile of the model in f from its metadata and
// tensor table; no tensor data is read.
func ProfileFromGGUF(f *gguf.File) (ModelProfile, error) {
	c, err := model.ConfigFromGGUF(f)
	if err != nil {
		return ModelProfile{}, err
	}
	name, _ := f.String("general.name")
	return ProfileFromTensors(name, c, f.Tensors)
}

// ProfileFromTensors builds a profile from a configuration and a tensor
// table, for callers that have the table without the file.
func ProfileFromTensors(name string, c model.Config, tensors []gguf.TensorInfo) (ModelProfile, error) {
	if c.NLayer <= 0 || c.NHead <= 0 || c.NHeadKV <= 0 || c.NHead%c.NHeadKV != 0 || c.HeadDim <= 0 {
		return ModelProfile{}, fmt.Errorf("placement: bad model shape: %d layers, %d heads, %d KV heads, head size %d", c.NLayer, c.NHead, c.NHeadKV, c.HeadDim)
	}
	p := ModelProfile{
		Name: name, Arch: c.Arch.Name, NLayer: c.NLayer, NEmbd: c.NEmbd, NHead: c.NHead, NHeadKV: c.NHeadKV,
		HeadDim: c.HeadDim, NVocab: c.NVocab, NExpert: c.NExpert, NExpertUsed: c.NExpertUsed,
		KVBytesPerToken: uint64(c.KVHalves() * c.NHeadKV * c.HeadDim * 2), // F16 K and V, or MLA's one latent row
		Layers:          make([]LayerProfile, c.NLayer),
		Tied:            true,
	}
	attnBlock, ffnBlock := 1, 1
	sawFFN, sawShared := false, false
	for i := range tensors {
		t := &tensors[i]
		flops := 0.0
		if len(t.Dims) >= 2 {
			flops = 2 * float64(t.Elements())
		}
		layer, role, ok := model.LayerTensor(t.Name)
		if !ok {
			switch t.Name {
			case "token_embd.weight":
				p.EmbedBytes += t.Size
			case "output.weight":
				p.OutputBytes += t.Size
				p.Tied = false
			case "output_norm.weight":
				p.OutputBytes += t.Size
			default:
				p.GlobalBytes += t.Size
			}
			continue
		}
		if layer >= c.NLayer && layer < c.NLayer+c.NextN {
			continue // a multi-token-prediction block: nothing runs it
		}
		if layer >= c.NLayer {
			return ModelProfile{}, fmt.Errorf("placement: tensor %s is past the model's %d layers", t.Name, c.NLayer)
		}
		l := &p.Layers[layer]
		switch role {
		case "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
			"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
			"attn_q_b.weight", "attn_k_b.weight", "attn_v_b.weight": // (latent attention's per-head parts; its shared projections are fixed)
			l.AttnBytes += t.Size
			l.AttnFLOPs += flops
			if role == "attn_output.weight" {
				attnBlock = max(attnBlock, t.Type.BlockLen())
			}
		case "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight":
			l.FFNBytes += t.Size
			l.FFNFLOPs += flops
			sawFFN = true
			if role == "ffn_down.weight" {
				ffnBlock = max(ffnBlock, t.Type.BlockLen())
			}
		case "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight":
			l.FFNBytes += t.Size
			l.FFNFLOPs += flops
			sawShared = true
			if role == "ffn_down_shexp.weight" {
				ffnBlock = max(ffnBlock, t.Type.BlockLen())
			}
		case "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight":
			if c.NExpert <= 0 {
				return ModelProfile{}, fmt.Errorf("placement: tensor %s in a model without experts", t.Name)
			}
			l.ExpertBytes += t.Size / uint64(c.NExpert)
			l.ExpertFLOPs += flops / float64(c.NExpert)
		default: // norms, router, shared-expert gate
			l.FixedBytes += t.Size
			l.FixedFLOPs += flops
		}
	}
	switch {
	case c.NExpert > 0 && sawShared:
		p.FFNDim = c.NFFShared
	case c.NExpert == 0 && sawFFN:
		p.FFNDim = c.NFF
	}
	if c.NExpert > 0 && (c.NExpertUsed <= 0 || c.NExpertUsed > c.NExpert) {
		return ModelProfile{}, fmt.Errorf("placement: %d experts used of %d", c.NExpertUsed, c.NExpert)
	}
	p.HeadUnit = headUnit(c.NHead, c.NHeadKV, c.OutHeadDim(), attnBlock)
	p.FFNUnit = ffnUnit(p.FFNDim, ffnBlock)
	return p, nil
}

// headUnit is the smallest number of query heads that is a whole number of
// GQA groups and of attn_output blocks, short of all of them; else the
// smallest part of a group that is a whole number of blocks (its KV head
// replicated on the members sharing the group); n_head when no split
// exists.
func headUnit(nHead, nHeadKV, headDim, block int) int {
	group := nHead / nHeadKV
	for g := 1; g < nHeadKV; g++ {
		if nHeadKV%g == 0 && (g*group*headDim)%block == 0 {
			return g * group
		}
	}
	for u := 1; u < group; u++ {
		if group%u == 0 && (u*headDim)%block == 0 {
			return u
		}
	}
	return nHead
}

// ffnUnit is the FFN split granularity: the ffn_down block length, raised to
// 32 when that still divides the FFN; the whole FFN when nothing divides it.
func ffnUnit(dim, block int) int {
	if dim == 0 {
		return 1
	}
	u := block
	if u < quant.QK && dim%quant.QK == 0 {
		u = quant.QK
	}
	if dim%u != 0 {
		return dim
	}
	return u
}
