package synth

import (
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"

	"shoal/engine/gguf"
	"shoal/engine/quant"
)

// Spec describes the model to write.
type Spec struct {
	Arch        string // llama, qwen2, qwen3, llama-moe (Mixtral-style), qwen2moe, qwen3moe, gemma3, gpt-oss, glm4moe, deepseek2, bert
	NEmbd       int
	NLayer      int
	NHead       int
	NHeadKV     int
	HeadDim     int // 0 = NEmbd/NHead
	NFF         int // dense FFN size, or per-expert size for MoE
	NExpert     int
	NExpertUsed int
	NFFShared   int // qwen2moe shared expert size (NFF if 0)
	// glm4moe: DenseLead leading dense layers (0 = 1) of NFFDense columns
	// (0 = 4·NFF), NShared shared experts (0 = 1), RopeDim rotated
	// dimensions per head (0 = half the head), NextN multi-token-prediction
	// blocks after the NLayer that run (-1 = none; 0 = 1, as GLM-4.5's files
	// have), ExpertScale the routed weights' scale (0 = 2.5), SoftmaxGate
	// softmax scores in place of sigmoids.
	DenseLead, NFFDense, NShared, RopeDim, NextN int
	ExpertScale                                  float32
	SoftmaxGate                                  bool
	// deepseek2 (as glm4moe, and without NextN blocks): multi-head latent
	// attention of KVLora latent values (0 = 4·VDim) and VDim values per
	// head (0 = HeadDim - RopeDim), HeadDim being a query head's size
	// (key_length_mla; RopeDim 0 = a third of it); queries through a QLora
	// rank (0 = 3·KVLora; -1 = none, the lite variant's attn_q);
	// ExpertGroups groups of experts of which ExpertGroupsUsed are chosen
	// from (0 = no groups).
	QLora, KVLora, VDim            int
	ExpertGroups, ExpertGroupsUsed int
	Ctx                            int
	// RopeScaling ("linear" or "yarn"), RopeFactor and RopeOrigCtx write
	// the rope.scaling keys (none when RopeScaling is "").
	RopeScaling string
	RopeFactor  float32
	RopeOrigCtx int
	// YarnLogMul, when not 0, writes rope.scaling.yarn_log_multiplier
	// (deepseek2: the scores' YaRN scale).
	YarnLogMul float32
	// Window is gemma3's sliding window (0 = 512; one global layer after
	// every five sliding ones).
	Window     int
	RopeTheta  float32 // 0 = 10000 (llama) or 1e6 (qwen)
	RMSEps     float32 // 0 = 1e-5 (llama) or 1e-6 (qwen); bert: the LayerNorm epsilon (0 = 1e-12)
	Tied       bool    // no output.weight
	Type       string  // weight type or mix: f32, f16, bf16, q4_0, q8_0, q4_k, q4_k_m, ...
	OutputType string  // "" = as llama-quantize would choose for Type
	Seed       uint64
	Std        float32 // weight std (0.02 if 0)
	Name       string
	// Pooling is bert's pooling_type (llama.cpp's: 1 mean, 2 cls, 3 last;
	// 0 = mean). A decoder with Pooling > 0 is an embedding model
	// (Qwen3-Embedding style): its %s.pooling_type is written.
	Pooling int
	// Tokenizer holds the tokenizer.* metadata to write (copied from another
	// GGUF or built by the tokenizer package); its token list sets n_vocab.
	Tokenizer []gguf.KV
}

type tensorPlan struct {
	name string
	typ  quant.Type
	dims []uint64
	std  float32
	mean float32
}

func (s *Spec) arch() (ggufArch string, moe, qwen bool, err error) {
	switch s.Arch {
	case "llama", "":
		return "llama", false, false, nil
	case "llama-moe", "moe", "mixtral":
		return "llama", true, false, nil
	case "qwen2":
		return "qwen2", false, true, nil
	case "qwen3":
		return "qwen3", false, true, nil
	case "qwen2moe":
		return "qwen2moe", true, true, nil
	case "qwen3moe":
		return "qwen3moe", true, true, nil
	case "gemma3":
		return "gemma3", false, false, nil
	case "gpt-oss":
		return "gpt-oss", true, false, nil
	case "glm4moe":
		return "glm4moe", true, false, nil
	case "deepseek2":
		return "deepseek2", true, false, nil
	case "bert":
		return "bert", false, false, nil
	}
	return "", false, false, fmt.Errorf("unknown arch %q (want llama, qwen2, qwen3, moe, qwen2moe, qwen3moe, gemma3, gpt-oss, glm4moe, deepseek2 or bert)", s.Arch)
}

func nVocab(kvs []gguf.KV) int {
	for _, kv := range kvs {
		if kv.Key == "tokenizer.ggml.tokens" {
			if t, ok := kv.Value.([]string); ok {
				return len(t)
			}
		}
	}
	return 0
}

// typeFor picks a tensor's type the way llama-quantize's mixes do.
type typeChooser struct {
	base, output quant.Type
	mix          string // "", "q4_k_m", "q5_k_m", "q4_k_s"
	nLayer       int
}

func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

func (c *typeChooser) choose(role string, layer int, cols int) quant.Type {
	t := c.base
	if c.mix == "mxfp4_moe" { // llama-quantize's MXFP4_MOE: experts MXFP4, the rest Q8_0
		t = quant.Q8_0
		if role == "expert" {
			t = quant.MXFP4
		}
		return fallback(t, cols)
	}
	switch role {
	case "output":
		t = c.output
	case "attn_v", "ffn_down":
		if (c.mix == "q4_k_m" || c.mix == "q5_k_m") && useMoreBits(layer, c.nLayer) {
			t = quant.Q6_K
		}
	}
	return fallback(t, cols)
}

// fallback replaces a block type whose block does not divide the row length,
// as llama-quantize does (K-quants → legacy 32-blocks, IQ4_XS and the IQ1,
// IQ2 and IQ3 types → IQ4_NL; then F16).
func fallback(t quant.Type, cols int) quant.Type {
	if cols%t.BlockLen() == 0 {
		return t
	}
	switch t {
	case quant.Q2_K, quant.Q3_K:
		t = quant.Q4_0
	case quant.Q4_K:
		t = quant.Q5_0
	case quant.Q5_K:
		t = quant.Q5_1
	case quant.Q6_K:
		t = quant.Q8_0
	case quant.IQ4_XS, quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S,
		quant.IQ1_S, quant.IQ1_M:
		t = quant.IQ4_NL
	}
	if cols%t.BlockLen() != 0 {
		return quant.F16
	}
	return t
}

func parseTypes(typ, out string) (*typeChooser, error) {
	c := &typeChooser{}
	switch typ {
	case "q4_k_m", "q4_k_s":
		c.base, c.mix = quant.Q4_K, typ
	case "q5_k_m", "q5_k_s":
		c.base, c.mix = quant.Q5_K, typ
	case "q3_k_m", "q3_k_s":
		c.base, c.mix = quant.Q3_K, typ
	case "mxfp4_moe", "mxfp4":
		c.base, c.mix = quant.Q8_0, "mxfp4_moe"
	default:
		t, err := quant.ParseType(typ)
		if err != nil {
			return nil, err
		}
		switch t {
		case quant.Q8_1, quant.Q8_K, quant.I8, quant.I16, quant.I32, quant.I64, quant.F64:
			return nil, fmt.Errorf("type %s is not a weight type", t)
		}
		c.base = t
	}
	switch c.base {
	case quant.F32, quant.F16, quant.BF16, quant.Q8_0:
		c.output = c.base
	default:
		c.output = quant.Q6_K // llama-quantize's choice for the output of low-bit files
	}
	if out != "" {
		t, err := quant.ParseType(out)
		if err != nil {
			return nil, err
		}
		c.output = t
	}
	return c, nil
}

// fileType maps the weight type to general.file_type (llama_ftype).
func fileType(typ string, base quant.Type) uint32 {
	switch typ {
	case "q4_k_s":
		return 14
	case "q4_k_m":
		return 15
	case "q5_k_s":
		return 16
	case "q5_k_m":
		return 17
	case "q3_k_s":
		return 11
	case "q3_k_m":
		return 12
	}
	return map[quant.Type]uint32{quant.F32: 0, quant.F16: 1, quant.Q4_0: 2, quant.Q4_1: 3, quant.Q8_0: 7, quant.Q5_0: 8,
		quant.Q5_1: 9, quant.Q2_K: 10, quant.Q3_K: 12, quant.Q4_K: 15, quant.Q5_K: 17, quant.Q6_K: 18, quant.BF16: 32,
		quant.IQ4_NL: 25, quant.IQ4_XS: 30, quant.IQ2_XXS: 19, quant.IQ2_XS: 20, quant.IQ2_S: 28,
		quant.IQ3_XXS: 23, quant.IQ3_S: 26, quant.IQ1_S: 24, quant.IQ1_M: 31}[base]
}

// Write generates the model and writes it to w, reporting progress through
// progress(done, total) in tensor bytes if non-nil.
func Write(w io.Writer, s Spec, progress func(done, total int64)) error {
	name, moe, qwen, err := s.arch()
	if err != nil {
		return err
	}
	if name == "bert" {
		return writeBert(w, s, progress)
	}
	V := nVocab(s.Tokenizer)
	if V == 0 {
		return fmt.Errorf("no tokenizer.ggml.tokens in the tokenizer metadata")
	}
	if s.NEmbd <= 0 || s.NLayer <= 0 || s.NHead <= 0 || s.NFF <= 0 {
		return fmt.Errorf("n-embd, n-layer, n-head and n-ff must be positive")
	}
	if s.NHeadKV == 0 {
		s.NHeadKV = s.NHead
	}
	if s.NHead%s.NHeadKV != 0 {
		return fmt.Errorf("n-head %d is not a multiple of n-head-kv %d", s.NHead, s.NHeadKV)
	}
	hd := s.HeadDim
	if hd == 0 {
		if s.NEmbd%s.NHead != 0 {
			return fmt.Errorf("n-embd %d is not a multiple of n-head %d", s.NEmbd, s.NHead)
		}
		hd = s.NEmbd / s.NHead
	}
	if hd%2 != 0 {
		return fmt.Errorf("head size %d must be even", hd)
	}
	if moe {
		if s.NExpert <= 0 {
			s.NExpert = 4
		}
		if s.NExpertUsed <= 0 {
			s.NExpertUsed = 2
		}
		if s.NExpertUsed > s.NExpert {
			return fmt.Errorf("n-expert-used %d exceeds n-expert %d", s.NExpertUsed, s.NExpert)
		}
	}
	if s.Ctx <= 0 {
		s.Ctx = 2048
	}
	if s.RopeTheta == 0 {
		s.RopeTheta = 10000
		if qwen {
			s.RopeTheta = 1e6
		}
	}
	gemma, oai, ds := name == "gemma3", name == "gpt-oss", name == "deepseek2"
	glm := name == "glm4moe" || ds // DeepSeek's MoE blocks
	ropeDim := hd
	if ds {
		s.NHeadKV = 1 // the latent, one row per token
		if s.RopeDim == 0 {
			s.RopeDim = hd / 3 / 2 * 2
		}
		if s.NextN == 0 {
			s.NextN = -1
		}
		if s.VDim == 0 {
			s.VDim = hd - s.RopeDim
		}
		if s.KVLora == 0 {
			s.KVLora = 4 * s.VDim
		}
		switch s.QLora {
		case 0:
			s.QLora = 3 * s.KVLora
		case -1:
			s.QLora = 0
		}
		if s.RopeDim <= 0 || s.RopeDim >= hd {
			return fmt.Errorf("rope dimensions %d must be positive and below the query head size %d", s.RopeDim, hd)
		}
		if g, u := s.ExpertGroups, s.ExpertGroupsUsed; g > 1 && (s.NExpert%g != 0 || u < 1 || u > g) {
			return fmt.Errorf("%d expert groups (%d used) do not divide %d experts", g, u, s.NExpert)
		}
	}
	if glm {
		if s.DenseLead == 0 {
			s.DenseLead = 1
		}
		if s.NFFDense == 0 {
			s.NFFDense = 4 * s.NFF
		}
		if s.NShared == 0 {
			s.NShared = 1
		}
		switch s.NextN {
		case -1:
			s.NextN = 0
		case 0:
			s.NextN = 1
		}
		if s.ExpertScale == 0 {
			s.ExpertScale = 2.5
		}
		ropeDim = hd / 2
		if s.RopeDim > 0 {
			ropeDim = s.RopeDim
		}
		if ropeDim%2 != 0 || ropeDim > hd {
			return fmt.Errorf("rope dimensions %d must be even and at most the head size %d", ropeDim, hd)
		}
	} else {
		s.DenseLead, s.NextN = 0, 0
	}
	if oai && s.Window <= 0 {
		s.Window = 128
	}
	if gemma {
		s.Tied = true // as Google's files: the embedding is the output
		if s.Window <= 0 {
			s.Window = 512
		}
		if s.RopeTheta == 0 {
			s.RopeTheta = 1e6
		}
	}
	if s.RMSEps == 0 {
		s.RMSEps = 1e-5
		if qwen || gemma {
			s.RMSEps = 1e-6
		}
	}
	if s.Std == 0 {
		s.Std = 0.02
	}
	if s.Type == "" {
		s.Type = "f32"
	}
	tc, err := parseTypes(s.Type, s.OutputType)
	if err != nil {
		return err
	}
	tc.nLayer = s.NLayer
	E, Q, KV, F := s.NEmbd, s.NHead*hd, s.NHeadKV*hd, s.NFF
	u := func(v int) uint64 { return uint64(v) }
	var plan []tensorPlan
	add := func(name string, role string, layer int, std float32, dims ...int) {
		t := quant.F32
		if len(dims) > 1 || role == "matrix" {
			t = tc.choose(role, layer, dims[0])
		}
		d := make([]uint64, len(dims))
		for i := range dims {
			d[i] = u(dims[i])
		}
		p := tensorPlan{name: name, typ: t, dims: d, std: std}
		if role == "norm" {
			p.mean, p.std = 1, 0.1
		}
		plan = append(plan, p)
	}
	embRole := "token_embd"
	if s.Tied {
		embRole = "output"
	}
	add("token_embd.weight", embRole, 0, s.Std, E, V)
	for l := 0; l < s.NLayer+s.NextN; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", "norm", l, 0, E)
		if ds {
			if s.QLora > 0 {
				add(p+"attn_q_a.weight", "attn_q", l, s.Std, E, s.QLora)
				add(p+"attn_q_a_norm.weight", "norm", l, 0, s.QLora)
				add(p+"attn_q_b.weight", "attn_q", l, s.Std, s.QLora, Q)
			} else {
				add(p+"attn_q.weight", "attn_q", l, s.Std, E, Q)
			}
			add(p+"attn_kv_a_mqa.weight", "attn_k", l, s.Std, E, s.KVLora+ropeDim)
			add(p+"attn_kv_a_norm.weight", "norm", l, 0, s.KVLora)
			add(p+"attn_k_b.weight", "attn_k", l, s.Std*4, hd-ropeDim, s.KVLora, s.NHead)
			add(p+"attn_v_b.weight", "attn_v", l, s.Std*4, s.KVLora, s.VDim, s.NHead)
			add(p+"attn_output.weight", "attn_output", l, s.Std, s.NHead*s.VDim, E)
		} else {
			add(p+"attn_q.weight", "attn_q", l, s.Std, E, Q)
			add(p+"attn_k.weight", "attn_k", l, s.Std, E, KV)
			add(p+"attn_v.weight", "attn_v", l, s.Std, E, KV)
		}
		if oai {
			add(p+"attn_q.bias", "bias", l, s.Std, Q)
			add(p+"attn_k.bias", "bias", l, s.Std, KV)
			add(p+"attn_v.bias", "bias", l, s.Std, KV)
			add(p+"attn_output.bias", "bias", l, s.Std, E)
			plan = append(plan, tensorPlan{name: p + "attn_sinks.weight", typ: quant.F32, dims: []uint64{u(s.NHead)}, std: 1})
		}
		if glm && !ds || qwen && (name == "qwen2" || name == "qwen2moe") {
			add(p+"attn_q.bias", "bias", l, s.Std, Q)
			add(p+"attn_k.bias", "bias", l, s.Std, KV)
			add(p+"attn_v.bias", "bias", l, s.Std, KV)
		}
		if name == "qwen3" || name == "qwen3moe" || gemma {
			add(p+"attn_q_norm.weight", "norm", l, 0, hd)
			add(p+"attn_k_norm.weight", "norm", l, 0, hd)
		}
		if !ds {
			add(p+"attn_output.weight", "attn_output", l, s.Std, Q, E)
		}
		if gemma {
			add(p+"post_attention_norm.weight", "norm", l, 0, E)
		}
		if oai || glm && !ds {
			add(p+"post_attention_norm.weight", "norm", l, 0, E)
		} else {
			add(p+"ffn_norm.weight", "norm", l, 0, E)
		}
		if oai {
			X := s.NExpert
			plan = append(plan, tensorPlan{name: p + "ffn_gate_inp.weight", typ: quant.F32, dims: []uint64{u(E), u(X)}, std: s.Std * 5},
				tensorPlan{name: p + "ffn_gate_inp.bias", typ: quant.F32, dims: []uint64{u(X)}, std: s.Std * 5})
			add(p+"ffn_gate_exps.weight", "expert", l, s.Std, E, F, X)
			add(p+"ffn_up_exps.weight", "expert", l, s.Std, E, F, X)
			add(p+"ffn_down_exps.weight", "expert", l, s.Std, F, E, X)
			for _, b := range []struct {
				name string
				n    int
			}{{"ffn_gate_exps.bias", F}, {"ffn_up_exps.bias", F}, {"ffn_down_exps.bias", E}} {
				plan = append(plan, tensorPlan{name: p + b.name, typ: quant.F32, dims: []uint64{u(b.n), u(X)}, std: s.Std})
			}
		} else if glm && l < s.DenseLead {
			add(p+"ffn_gate.weight", "ffn_gate", l, s.Std, E, s.NFFDense)
			add(p+"ffn_up.weight", "ffn_up", l, s.Std, E, s.NFFDense)
			add(p+"ffn_down.weight", "ffn_down", l, s.Std, s.NFFDense, E)
		} else if glm {
			// Router logits of about unit spread: sigmoid scores apart from
			// one another (saturated ones nearly tie), a smaller bias.
			X, S := s.NExpert, F*s.NShared
			rstd := float32(1.5 / math.Sqrt(float64(E)))
			plan = append(plan, tensorPlan{name: p + "ffn_gate_inp.weight", typ: quant.F32, dims: []uint64{u(E), u(X)}, std: rstd})
			if !s.SoftmaxGate {
				plan = append(plan, tensorPlan{name: p + "exp_probs_b.bias", typ: quant.F32, dims: []uint64{u(X)}, std: 0.05})
			}
			add(p+"ffn_gate_exps.weight", "ffn_gate", l, s.Std, E, F, X)
			add(p+"ffn_up_exps.weight", "ffn_up", l, s.Std, E, F, X)
			add(p+"ffn_down_exps.weight", "ffn_down", l, s.Std, F, E, X)
			add(p+"ffn_gate_shexp.weight", "ffn_gate", l, s.Std, E, S)
			add(p+"ffn_up_shexp.weight", "ffn_up", l, s.Std, E, S)
			add(p+"ffn_down_shexp.weight", "ffn_down", l, s.Std, S, E)
			if l >= s.NLayer { // the multi-token-prediction block's own tensors
				add(p+"nextn.eh_proj.weight", "matrix", l, s.Std, 2*E, E)
				add(p+"nextn.enorm.weight", "norm", l, 0, E)
				add(p+"nextn.hnorm.weight", "norm", l, 0, E)
				add(p+"nextn.shared_head_norm.weight", "norm", l, 0, E)
			}
		} else if moe {
			X := s.NExpert
			plan = append(plan, tensorPlan{name: p + "ffn_gate_inp.weight", typ: quant.F32, dims: []uint64{u(E), u(X)}, std: s.Std * 5})
			add(p+"ffn_gate_exps.weight", "ffn_gate", l, s.Std, E, F, X)
			add(p+"ffn_up_exps.weight", "ffn_up", l, s.Std, E, F, X)
			add(p+"ffn_down_exps.weight", "ffn_down", l, s.Std, F, E, X)
			if name == "qwen2moe" {
				S := s.NFFShared
				if S == 0 {
					S = F
				}
				add(p+"ffn_gate_inp_shexp.weight", "vector", l, s.Std, E)
				add(p+"ffn_gate_shexp.weight", "ffn_gate", l, s.Std, E, S)
				add(p+"ffn_up_shexp.weight", "ffn_up", l, s.Std, E, S)
				add(p+"ffn_down_shexp.weight", "ffn_down", l, s.Std, S, E)
			}
		} else {
			add(p+"ffn_gate.weight", "ffn_gate", l, s.Std, E, F)
			add(p+"ffn_up.weight", "ffn_up", l, s.Std, E, F)
			add(p+"ffn_down.weight", "ffn_down", l, s.Std, F, E)
		}
		if gemma {
			add(p+"post_ffw_norm.weight", "norm", l, 0, E)
		}
	}
	add("output_norm.weight", "norm", 0, 0, E)
	if !s.Tied {
		add("output.weight", "output", 0, s.Std, E, V)
	}

	desc := fmt.Sprintf("shoal gen-model arch=%s n_embd=%d n_layer=%d n_head=%d n_head_kv=%d head_dim=%d n_ff=%d n_expert=%d n_expert_used=%d type=%s seed=%d std=%g tied=%v",
		s.Arch, E, s.NLayer, s.NHead, s.NHeadKV, hd, F, s.NExpert, s.NExpertUsed, s.Type, s.Seed, s.Std, s.Tied)
	modelName := s.Name
	if modelName == "" {
		modelName = fmt.Sprintf("shoal-random-%s-%dx%d-%s", s.Arch, s.NLayer, E, s.Type)
	}
	p := name + "."
	ffLen := F
	if glm {
		ffLen = s.NFFDense // the dense layers'; the experts' is expert_feed_forward_length
	}
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: name},
		{Key: "general.type", Value: "model"},
		{Key: "general.name", Value: modelName},
		{Key: "general.description", Value: desc},
		{Key: "general.file_type", Value: fileType(s.Type, tc.base)},
		{Key: "general.quantization_version", Value: uint32(2)},
		{Key: p + "vocab_size", Value: uint32(V)},
		{Key: p + "context_length", Value: uint32(s.Ctx)},
		{Key: p + "embedding_length", Value: uint32(E)},
		{Key: p + "block_count", Value: uint32(s.NLayer + s.NextN)},
		{Key: p + "feed_forward_length", Value: uint32(ffLen)},
		{Key: p + "attention.head_count", Value: uint32(s.NHead)},
		{Key: p + "attention.head_count_kv", Value: uint32(s.NHeadKV)},
		{Key: p + "rope.freq_base", Value: s.RopeTheta},
		{Key: p + "rope.dimension_count", Value: uint32(ropeDim)},
		{Key: p + "attention.layer_norm_rms_epsilon", Value: s.RMSEps},
	}
	switch {
	case ds:
		kvs = append(kvs, gguf.KV{Key: p + "attention.key_length", Value: uint32(s.KVLora + ropeDim)},
			gguf.KV{Key: p + "attention.value_length", Value: uint32(s.KVLora)},
			gguf.KV{Key: p + "attention.key_length_mla", Value: uint32(hd)},
			gguf.KV{Key: p + "attention.value_length_mla", Value: uint32(s.VDim)},
			gguf.KV{Key: p + "attention.kv_lora_rank", Value: uint32(s.KVLora)})
		if s.QLora > 0 {
			kvs = append(kvs, gguf.KV{Key: p + "attention.q_lora_rank", Value: uint32(s.QLora)})
		}
		if s.ExpertGroups > 1 {
			kvs = append(kvs, gguf.KV{Key: p + "expert_group_count", Value: uint32(s.ExpertGroups)},
				gguf.KV{Key: p + "expert_group_used_count", Value: uint32(s.ExpertGroupsUsed)})
		}
	case hd != E/s.NHead:
		kvs = append(kvs, gguf.KV{Key: p + "attention.key_length", Value: uint32(hd)}, gguf.KV{Key: p + "attention.value_length", Value: uint32(hd)})
	}
	if gemma || oai {
		kvs = append(kvs, gguf.KV{Key: p + "attention.sliding_window", Value: uint32(s.Window)})
	}
	if s.RopeScaling != "" {
		kvs = append(kvs, gguf.KV{Key: p + "rope.scaling.type", Value: s.RopeScaling}, gguf.KV{Key: p + "rope.scaling.factor", Value: s.RopeFactor})
		if s.RopeOrigCtx > 0 {
			kvs = append(kvs, gguf.KV{Key: p + "rope.scaling.original_context_length", Value: uint32(s.RopeOrigCtx)})
		}
		if s.YarnLogMul != 0 {
			kvs = append(kvs, gguf.KV{Key: p + "rope.scaling.yarn_log_multiplier", Value: s.YarnLogMul})
		}
	}
	if moe {
		kvs = append(kvs, gguf.KV{Key: p + "expert_count", Value: uint32(s.NExpert)}, gguf.KV{Key: p + "expert_used_count", Value: uint32(s.NExpertUsed)})
		if name != "llama" {
			kvs = append(kvs, gguf.KV{Key: p + "expert_feed_forward_length", Value: uint32(F)})
		}
		if name == "qwen2moe" {
			S := s.NFFShared
			if S == 0 {
				S = F
			}
			kvs = append(kvs, gguf.KV{Key: p + "expert_shared_feed_forward_length", Value: uint32(S)})
		}
		if glm {
			gating := uint32(2) // sigmoid
			if s.SoftmaxGate {
				gating = 1
			}
			kvs = append(kvs, gguf.KV{Key: p + "expert_shared_count", Value: uint32(s.NShared)},
				gguf.KV{Key: p + "leading_dense_block_count", Value: uint32(s.DenseLead)},
				gguf.KV{Key: p + "expert_weights_scale", Value: s.ExpertScale},
				gguf.KV{Key: p + "expert_weights_norm", Value: true},
				gguf.KV{Key: p + "expert_gating_func", Value: gating})
			if !ds {
				kvs = append(kvs, gguf.KV{Key: p + "nextn_predict_layers", Value: uint32(s.NextN)})
			}
		}
	}
	if s.Pooling > 0 {
		kvs = append(kvs, gguf.KV{Key: p + "pooling_type", Value: uint32(s.Pooling)})
	}
	kvs = append(kvs, s.Tokenizer...)
	return writeFile(w, kvs, plan, s.Seed, progress)
}

// writeFile writes the metadata kvs and the tensors of plan, generated
// from seed.
func writeFile(w io.Writer, kvs []gguf.KV, plan []tensorPlan, seed uint64, progress func(done, total int64)) error {
	gw := gguf.NewWriter(w)
	for _, kv := range kvs {
		if err := gw.AddKV(kv.Key, kv.Value); err != nil {
			return err
		}
	}
	var total int64
	for _, t := range plan {
		if err := gw.AddTensor(t.name, t.typ, t.dims...); err != nil {
			return err
		}
		n := int64(1)
		for _, d := range t.dims {
			n *= int64(d)
		}
		total += int64(t.typ.RowSize(int(t.dims[0]))) * (n / int64(t.dims[0]))
	}
	if err := gw.WriteHeader(); err != nil {
		return err
	}
	var done int64
	for _, t := range plan {
		data := generate(t, seed)
		if err := gw.WriteTensor(t.name, data); err != nil {
			return err
		}
		done += int64(len(data))
		if progress != nil {
			progress(done, total)
		}
	}
	return gw.Close()
}

// generate draws the tensor's values (N(mean, std), per-tensor stream seeded
// by seed and the name) and stores them in its type, rows in parallel.
func generate(t tensorPlan, seed uint64) []byte {
	cols := int(t.dims[0])
	rows := 1
	for _, d := range t.dims[1:] {
		rows *= int(d)
	}
	rs := t.typ.RowSize(cols)
	out := make([]byte, rows*rs)
	h := fnv.New64a()
	h.Write([]byte(t.name))
	base := seed ^ h.Sum64()
	// Rows are generated in groups with their own stream so the values do
	// not depend on the number of threads.
	const group = 64
	groups := (rows + group - 1) / group
	var wg sync.WaitGroup
	next := make(chan int, groups)
	for g := 0; g < groups; g++ {
		next <- g
	}
	close(next)
	for w := 0; w < runtime.NumCPU(); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]float32, cols)
			for g := range next {
				rng := rand.New(rand.NewPCG(base, uint64(g)))
				for r := g * group; r < min(rows, (g+1)*group); r++ {
					for i := range buf {
						buf[i] = t.mean + t.std*float32(rng.NormFloat64())
					}
					quant.QuantizeRow(t.typ, buf, out[r*rs:(r+1)*rs])
				}
			}
		}()
	}
	wg.Wait()
	return out
}
