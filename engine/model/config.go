package model

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"shoal/engine/device"
	"shoal/engine/gguf"
)

// RopeMode is how RoPE pairs dimensions.
type RopeMode = device.RopeMode

const (
	// RopeNormal rotates adjacent pairs (2i, 2i+1) (llama).
	RopeNormal = device.RopeNormal
	// RopeNeoX rotates pairs (i, i+d/2) (qwen2, qwen3, gpt-neox).
	RopeNeoX = device.RopeNeoX
)

// Arch describes what distinguishes an architecture.
type Arch struct {
	Name        string
	Rope        RopeMode
	QKNorm      bool // per-head RMSNorm of q and k before RoPE (qwen3)
	NormExperts bool // renormalize the top-k router weights to sum 1
	SharedFFN   bool // a sigmoid-gated shared expert beside the routed ones (qwen2moe)
	// Gemma-style blocks: the embedding scaled by √n_embd, RMSNorms after
	// each half as well as before, a GELU-gated FFN, and the queries
	// scaled before the dot products (1/√head_dim; 1/√(n_embd/n_head) for
	// the 62-layer 27B, as llama.cpp does).
	Gemma bool
	// SWAPattern: with %s.attention.sliding_window set, layer l slides when
	// l % SWAPattern < SWAPattern-1; the sliding layers use RoPE base
	// SWARopeBase without position scaling.
	SWAPattern  int
	SWARopeBase float32
	// OAI: gpt-oss's blocks: attention sinks, the FFN's norm named
	// post_attention_norm, routed experts with biases, softmax over the
	// top logits and the clamped SwiGLU (device.Spec.OAI).
	OAI bool
	// DeepSeekMoE: MoE blocks as DeepSeek-V3 and GLM-4.5 build them: the
	// first %s.leading_dense_block_count layers dense, the rest with routed
	// experts scored by %s.expert_gating_func (sigmoid unless it says
	// softmax), chosen by score plus the exp_probs_b bias, weighted by the
	// scores alone, normalized when %s.expert_weights_norm and scaled by
	// %s.expert_weights_scale, and %s.expert_shared_count ungated shared
	// experts beside them; the last %s.nextn_predict_layers blocks
	// (multi-token prediction) are not run.
	DeepSeekMoE bool
	// SoftmaxGate: a DeepSeekMoE model without %s.expert_gating_func
	// scores its experts by a softmax (DeepSeek-V2's files), not a sigmoid.
	SoftmaxGate bool
	// MLA: multi-head latent attention (DeepSeek-V2/V3), as GGUF files
	// converted for llama.cpp's absorbed form hold it (attn_k_b and
	// attn_v_b; see device.MLA).
	MLA bool
	// FFNNorm names the FFN's norm in a layer ("" = ffn_norm.weight).
	FFNNorm string
	// Encoder: a bidirectional embedding encoder (bert) that produces one
	// pooled vector per input, not logits; it loads with LoadEncoder (see
	// encoder.go), and ConfigFromGGUF refuses it with ErrEncoder.
	Encoder bool
}

var archs = map[string]Arch{}

// Register adds an architecture. Architectures register themselves in
// init; like database/sql.Register, it panics when the name is empty or
// already registered, so that one architecture cannot silently replace
// another.
func Register(a Arch) {
	if a.Name == "" {
		panic("model: Register of an architecture without a name")
	}
	if _, dup := archs[a.Name]; dup {
		panic("model: Register called twice for architecture " + a.Name)
	}
	archs[a.Name] = a
}

func init() {
	Register(Arch{Name: "llama", Rope: RopeNormal, NormExperts: true})
	Register(Arch{Name: "mistral", Rope: RopeNormal, NormExperts: true})
	Register(Arch{Name: "qwen2", Rope: RopeNeoX})
	Register(Arch{Name: "qwen2moe", Rope: RopeNeoX, SharedFFN: true})
	Register(Arch{Name: "qwen3", Rope: RopeNeoX, QKNorm: true})
	Register(Arch{Name: "qwen3moe", Rope: RopeNeoX, QKNorm: true, NormExperts: true})
	Register(Arch{Name: "gemma3", Rope: RopeNeoX, QKNorm: true, Gemma: true, SWAPattern: 6, SWARopeBase: 10000})
	Register(Arch{Name: "gpt-oss", Rope: RopeNeoX, SWAPattern: 2, OAI: true})
	Register(Arch{Name: "deepseek2", Rope: RopeNormal, SharedFFN: true, DeepSeekMoE: true, SoftmaxGate: true, MLA: true})
	Register(Arch{Name: "glm4moe", Rope: RopeNeoX, SharedFFN: true, DeepSeekMoE: true, FFNNorm: "post_attention_norm.weight"})
	Register(Arch{Name: "bert", Encoder: true})
}

// ffnNorm is the name of a layer's FFN norm tensor within the layer.
func (a *Arch) ffnNorm() string {
	if a.FFNNorm != "" {
		return a.FFNNorm
	}
	return "ffn_norm.weight"
}

// Archs lists the registered architecture names.
func Archs() []string {
	var names []string
	for n := range archs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Config holds a model's hyperparameters.
type Config struct {
	Arch        Arch
	NEmbd       int
	NLayer      int
	NHead       int
	NHeadKV     int
	HeadDim     int // key/value head size
	NFF         int // dense FFN size
	NVocab      int
	NCtx        int // training context length
	NExpert     int
	NExpertUsed int
	NFFExpert   int // per-expert FFN size
	NFFShared   int // shared expert FFN size (qwen2moe)
	RopeTheta   float32
	RopeDim     int     // dimensions rotated per head
	RopeScale   float32 // position scale (1/linear factor)
	RMSEps      float32
	Window      int          // sliding-window size of the sliding layers (0: none)
	AttnScale   float32      // queries' scale before the dot products (0: 1/√HeadDim on the scores)
	Yarn        *device.Yarn // YaRN RoPE scaling, or nil
	// DeepSeekMoE models (Arch.DeepSeekMoE): the leading dense layers, the
	// multi-token-prediction blocks after the NLayer that run, the routed
	// experts' gating, normalization and scale (0: none).
	DenseLead   int
	NextN       int
	SigmoidGate bool
	NormExperts bool
	ExpertScale float32
	// ExpertGroups and ExpertGroupsUsed: group-limited routing (see
	// device.Spec; 0: none).
	ExpertGroups, ExpertGroupsUsed int
	// MLA is the latent attention's shape (Arch.MLA), else nil. HeadDim is
	// then the cached row (KVLora + RopeDim) and NHeadKV 1.
	MLA *device.MLA
}

// QDim is n_head*head_dim; KVDim is n_head_kv*head_dim.
func (c *Config) QDim() int  { return c.NHead * c.HeadDim }
func (c *Config) KVDim() int { return c.NHeadKV * c.HeadDim }

// QHeadDim is a query head's width in attn_q (or attn_q_b): HeadDim, or
// with MLA its non-rotated and rotated parts.
func (c *Config) QHeadDim() int {
	if c.MLA != nil {
		return c.MLA.QHeadDim(c.RopeDim)
	}
	return c.HeadDim
}

// OutHeadDim is a query head's share of attn_output's input: HeadDim, or
// with MLA the value head size.
func (c *Config) OutHeadDim() int {
	if c.MLA != nil {
		return c.MLA.VDim
	}
	return c.HeadDim
}

// KVHalves is how many rows a token caches per layer and KV head: K and
// V, or with MLA the one latent row read as both.
func (c *Config) KVHalves() int {
	if c.MLA != nil {
		return 1
	}
	return 2
}

// IsMoE reports whether layers use routed experts.
func (c *Config) IsMoE() bool { return c.NExpert > 0 }

// MoELayer reports whether layer l uses routed experts (a MoE model's
// leading dense layers do not).
func (c *Config) MoELayer(l int) bool { return c.IsMoE() && l >= c.DenseLead }

// spec is what a device needs of the hyperparameters (freqs: the llama3
// RoPE frequency divisors, or nil).
func (c *Config) spec(freqs []float32) device.Spec {
	return device.Spec{NEmbd: c.NEmbd, NVocab: c.NVocab, NHead: c.NHead, NHeadKV: c.NHeadKV, HeadDim: c.HeadDim,
		NFF: c.NFF, NFFExpert: c.NFFExpert, NFFShared: c.NFFShared, NExpert: c.NExpert, NExpertUsed: c.NExpertUsed,
		RopeDim: c.RopeDim, RopeTheta: c.RopeTheta, RopeScale: c.RopeScale, RMSEps: c.RMSEps, Rope: c.Arch.Rope,
		RopeFreqs: freqs, NormExperts: c.NormExperts, SharedFFN: c.Arch.SharedFFN, SigmoidGate: c.SigmoidGate, ExpertScale: c.ExpertScale,
		ExpertGroups: c.ExpertGroups, ExpertGroupsUsed: c.ExpertGroupsUsed, MLA: c.MLA,
		GELU: c.Arch.Gemma, AttnScale: c.AttnScale, Yarn: c.Yarn, OAI: c.Arch.OAI, Window: c.Window, SWAPattern: c.Arch.SWAPattern, RopeThetaSWA: c.swaBase()}
}

// swaBase is the sliding layers' RoPE base, or 0 when they have none of
// their own.
func (c *Config) swaBase() float32 {
	if c.Window == 0 {
		return 0
	}
	return c.Arch.SWARopeBase
}

// intReader reads a model's integer hyperparameters (prefix.key), keeping
// the first error: a key of another type, a required key missing, a value
// out of range.
type intReader struct {
	f      *gguf.File
	prefix string
	err    error
}

// get sets *dst to key's value, or def when key is absent and not required.
func (r *intReader) get(key string, dst *int, required bool, def int) {
	if r.err != nil {
		return
	}
	name := r.prefix + key
	v, ok := r.f.Int(name)
	if !ok {
		if kv, present := r.f.Lookup(name); present {
			r.err = fmt.Errorf("%s has type %s, want an integer", name, kv.Type)
			return
		}
		if required {
			r.err = fmt.Errorf("missing %s", name)
			return
		}
		v = int64(def)
	}
	if v < 0 || v > 1<<30 {
		r.err = fmt.Errorf("%s = %d is out of range", name, v)
		return
	}
	*dst = int(v)
}

// vocabSize is prefix.vocab_size, or the number of tokenizer tokens (0 when
// neither is there).
func vocabSize(f *gguf.File, prefix string) int {
	if v, ok := f.Int(prefix + "vocab_size"); ok {
		return int(v)
	}
	if toks, ok := f.Strings("tokenizer.ggml.tokens"); ok {
		return len(toks)
	}
	return 0
}

// ConfigFromGGUF reads the hyperparameters of f.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	name, ok := f.String("general.architecture")
	if !ok {
		return Config{}, fmt.Errorf("no general.architecture in the file")
	}
	arch, ok := archs[name]
	if !ok {
		return Config{}, fmt.Errorf("architecture %q is not supported (supported: %s)", name, strings.Join(Archs(), ", "))
	}
	if arch.Encoder {
		return Config{}, fmt.Errorf("architecture %q: %w", name, ErrEncoder)
	}
	c := Config{Arch: arch, RopeScale: 1, NormExperts: arch.NormExperts}
	p := name + "."
	r := intReader{f: f, prefix: p}
	geti, err := r.get, &r.err
	getf := func(key string, dst *float32, def float32) {
		if v, ok := f.Float(p + key); ok {
			*dst = float32(v)
		} else {
			*dst = def
		}
	}
	geti("embedding_length", &c.NEmbd, true, 0)
	geti("block_count", &c.NLayer, true, 0)
	geti("attention.head_count", &c.NHead, true, 0)
	geti("attention.head_count_kv", &c.NHeadKV, false, c.NHead)
	geti("feed_forward_length", &c.NFF, false, 0)
	geti("context_length", &c.NCtx, false, 4096)
	geti("expert_count", &c.NExpert, false, 0)
	geti("expert_used_count", &c.NExpertUsed, false, 0)
	geti("expert_feed_forward_length", &c.NFFExpert, false, c.NFF)
	geti("expert_shared_feed_forward_length", &c.NFFShared, false, c.NFFExpert)
	if arch.DeepSeekMoE {
		var shared int
		geti("expert_shared_count", &shared, false, 0)
		c.NFFShared = c.NFFExpert * shared
		geti("leading_dense_block_count", &c.DenseLead, false, 0)
		geti("nextn_predict_layers", &c.NextN, false, 0)
		gating := 2
		if arch.SoftmaxGate {
			gating = 1
		}
		geti("expert_gating_func", &gating, false, gating)
		switch gating {
		case 1: // softmax
		case 0, 2:
			c.SigmoidGate = true
		default:
			return Config{}, fmt.Errorf("%sexpert_gating_func %d is not supported (1 softmax, 2 sigmoid)", p, gating)
		}
		if v, ok := f.Bool(p + "expert_weights_norm"); ok {
			c.NormExperts = v
		}
		getf("expert_weights_scale", &c.ExpertScale, 0)
		geti("expert_group_count", &c.ExpertGroups, false, 0)
		geti("expert_group_used_count", &c.ExpertGroupsUsed, false, 0)
		if g, u := c.ExpertGroups, c.ExpertGroupsUsed; *err == nil && g > 1 && (c.NExpert%g != 0 || u < 1 || u > g || c.NExpertUsed > u*(c.NExpert/g)) {
			return Config{}, fmt.Errorf("%sexpert_group_count %d and expert_group_used_count %d do not fit %d experts of which %d are used", p, g, u, c.NExpert, c.NExpertUsed)
		}
		if *err == nil && c.NextN > 0 && c.NextN >= c.NLayer {
			return Config{}, fmt.Errorf("%snextn_predict_layers %d leaves none of the %d blocks to run", p, c.NextN, c.NLayer)
		}
		c.NLayer -= c.NextN
	}
	if *err != nil {
		return Config{}, *err
	}
	if c.NHead == 0 || c.NEmbd == 0 || c.NLayer == 0 {
		return Config{}, fmt.Errorf("embedding_length, block_count and head_count must be positive (got %d, %d, %d)", c.NEmbd, c.NLayer, c.NHead)
	}
	geti("attention.key_length", &c.HeadDim, false, c.NEmbd/c.NHead)
	var vdim int
	geti("attention.value_length", &vdim, false, c.HeadDim)
	geti("rope.dimension_count", &c.RopeDim, false, c.HeadDim)
	if *err != nil {
		return Config{}, *err
	}
	if arch.MLA {
		if err := c.readMLA(&r, vdim); err != nil {
			return Config{}, err
		}
	} else if vdim != c.HeadDim {
		return Config{}, fmt.Errorf("value head size %d differs from key head size %d: not supported", vdim, c.HeadDim)
	}
	getf("rope.freq_base", &c.RopeTheta, 10000)
	getf("attention.layer_norm_rms_epsilon", &c.RMSEps, 1e-5)
	// RoPE scaling as llama.cpp reads it: the type defaults to linear, the
	// factor comes from rope.scaling.factor or the older rope.scale_linear,
	// and only "none" turns it off.
	var factor float32
	getf("rope.scaling.factor", &factor, 0)
	if factor == 0 {
		getf("rope.scale_linear", &factor, 0)
	}
	switch st, _ := f.String(p + "rope.scaling.type"); st {
	case "", "linear":
		if factor > 0 {
			c.RopeScale = 1 / factor
		}
	case "yarn":
		if factor <= 0 {
			return Config{}, fmt.Errorf("yarn rope scaling without rope.scaling.factor")
		}
		c.RopeScale = 1 / factor
		y := device.Yarn{}
		geti("rope.scaling.original_context_length", &y.OrigCtx, false, c.NCtx)
		getf("rope.scaling.yarn_beta_fast", &y.BetaFast, 32)
		getf("rope.scaling.yarn_beta_slow", &y.BetaSlow, 1)
		getf("rope.scaling.yarn_attn_factor", &y.AttnFactor, 1)
		var ext float32
		getf("rope.scaling.yarn_ext_factor", &ext, 1)
		if *err != nil {
			return Config{}, *err
		}
		_, hasLogMul := f.Lookup(p + "rope.scaling.yarn_log_multiplier")
		if hasLogMul && c.MLA == nil || ext != 1 {
			return Config{}, fmt.Errorf("yarn rope scaling with an extrapolation factor other than 1, or a log multiplier outside DeepSeek's latent attention, is not supported yet")
		}
		if c.MLA != nil {
			// as llama.cpp scales DeepSeek's YaRN: RoPE's cos and sin by
			// the attention factor alone (its own ln-factor term
			// cancelled), the scores by mscale² with mscale = factor ·
			// (1 + log_mul·ln(scale)) (the file's log_mul is 0.1 ×
			// DeepSeek's mscale_all_dim)
			var logMul float32
			getf("rope.scaling.yarn_log_multiplier", &logMul, 0)
			ln := float32(math.Log(float64(factor)))
			org := y.AttnFactor
			y.AttnFactor = org / (1 + 0.1*ln)
			ms := org * (1 + logMul*ln)
			c.MLA.KQScale *= ms * ms
		}
		c.Yarn = &y
	case "none":
	default:
		return Config{}, fmt.Errorf("rope scaling %q is not supported (linear, yarn and none are)", st)
	}
	c.NVocab = vocabSize(f, p)
	if arch.SWAPattern > 0 {
		geti("attention.sliding_window", &c.Window, false, 0)
		if *err != nil {
			return Config{}, *err
		}
	}
	if arch.Gemma {
		c.AttnScale = float32(1 / math.Sqrt(float64(c.HeadDim)))
		if c.NLayer == 62 { // the 27B: llama.cpp's rule
			c.AttnScale = float32(1 / math.Sqrt(float64(c.NEmbd/c.NHead)))
		}
	}
	switch {
	case c.NHeadKV == 0 || c.NHead%c.NHeadKV != 0:
		return Config{}, fmt.Errorf("head_count %d is not a multiple of head_count_kv %d", c.NHead, c.NHeadKV)
	case c.HeadDim == 0 || c.HeadDim%2 != 0:
		return Config{}, fmt.Errorf("head size %d must be even and positive", c.HeadDim)
	case c.RopeDim%2 != 0 || c.RopeDim > c.HeadDim:
		return Config{}, fmt.Errorf("rope.dimension_count %d must be even and at most the head size %d", c.RopeDim, c.HeadDim)
	case c.NExpert > 0 && (c.NExpertUsed <= 0 || c.NExpertUsed > c.NExpert):
		return Config{}, fmt.Errorf("expert_used_count %d must be in 1..expert_count %d", c.NExpertUsed, c.NExpert)
	case c.RMSEps <= 0:
		return Config{}, fmt.Errorf("layer_norm_rms_epsilon %g must be positive", c.RMSEps)
	}
	return c, nil
}

// readMLA reads the latent attention's shape: the GGUF's key and value
// lengths are the cached row and the latent (kv_lora_rank + rope and
// kv_lora_rank, one KV head), key_length_mla and value_length_mla a query
// head's and a value head's sizes.
func (c *Config) readMLA(r *intReader, vdim int) error {
	m := &device.MLA{}
	var kmla int
	r.get("attention.q_lora_rank", &m.QLora, false, 0)
	r.get("attention.kv_lora_rank", &m.KVLora, true, 0)
	r.get("attention.key_length_mla", &kmla, false, 0)
	r.get("attention.value_length_mla", &m.VDim, false, 0)
	if r.err != nil {
		return r.err
	}
	p := r.prefix
	switch {
	case kmla == 0 || m.VDim == 0:
		return fmt.Errorf("%sattention.key_length_mla and value_length_mla are missing: this file holds DeepSeek's attention unabsorbed (attn_kv_b), as converters before mid-2025 wrote it; convert the model again with a current llama.cpp convert_hf_to_gguf.py", p)
	case c.HeadDim != m.KVLora+c.RopeDim || vdim != m.KVLora || c.NHeadKV != 1:
		return fmt.Errorf("%sattention.key_length %d, value_length %d and head_count_kv %d are not the latent attention's %d + %d, %d and 1", p, c.HeadDim, vdim, c.NHeadKV, m.KVLora, c.RopeDim, m.KVLora)
	case kmla <= c.RopeDim:
		return fmt.Errorf("%sattention.key_length_mla %d must exceed rope.dimension_count %d", p, kmla, c.RopeDim)
	}
	m.Nope = kmla - c.RopeDim
	m.KQScale = float32(1 / math.Sqrt(float64(kmla)))
	c.MLA = m
	return nil
}
