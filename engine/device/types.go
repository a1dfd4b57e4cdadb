package device

import "shoal/engine/kernels"

// Collective is the group communication of a tensor-parallel member. The
// transport implements it over QUIC; tests use an in-memory one.
//
// Every member of a group makes the same sequence of calls (the same
// operations with the same total lengths), so an implementation can match
// calls by their order.
type Collective interface {
	Rank() int
	Size() int
	// AllReduceSum replaces x on every member with the elementwise sum of
	// all members' x (same length everywhere).
	AllReduceSum(x []float32) error
	// AllGather concatenates every member's part in rank order into out;
	// parts may differ in length (uneven splits); len(out) = sum of part
	// lengths.
	AllGather(part []float32, out []float32) error
}

// Group is a tensor-parallel group's widths, per rank: the query columns
// (heads × head size) and FFN columns each member holds, and the output
// rows each computes of a gathered attn_output or ffn_down.
type Group struct {
	AttnCols, FFNCols, OutRows []int
	// DenseCols are the FFN columns of a MoE model's leading dense layers
	// (whose FFN is split apart from the shared expert's: see
	// model.Config.LayerFFN).
	DenseCols []int
}

// RopeMode selects how RoPE pairs dimensions.
type RopeMode int

// RoPE pairings: adjacent dimensions (llama) or halves (NeoX, qwen).
const (
	RopeNormal RopeMode = iota
	RopeNeoX
)

// Spec is what a device needs of a model's hyperparameters.
type Spec struct {
	NEmbd, NVocab                int
	NHead, NHeadKV, HeadDim      int
	NFF, NFFExpert, NFFShared    int
	NExpert, NExpertUsed         int
	RopeDim                      int
	RopeTheta, RopeScale, RMSEps float32
	Rope                         RopeMode
	RopeFreqs                    []float32 // per-dimension divisors, or nil
	NormExperts, SharedFFN       bool
	// Yarn, when set, is YaRN RoPE scaling (RopeScale the 1/factor).
	Yarn *Yarn
	// OAI is gpt-oss's routed FFN: the top experts by the router's logits
	// (with its bias) weighted by a softmax over those alone, each expert
	// with biases and the clamped SwiGLU x·σ(1.702x)·(y+1), x ≤ 7, |y| ≤ 7.
	OAI bool
	// SigmoidGate: the router's scores are sigmoids of its logits, not a
	// softmax; the experts are chosen by score plus the layer's ExpProbsB
	// (when it has one) and weighted by the scores alone. ExpertScale, when
	// not 0, multiplies the weights (after NormExperts).
	SigmoidGate bool
	ExpertScale float32
	// ExpertGroups, when more than 1, splits the routed experts into that
	// many runs of consecutive ids; a token's experts are chosen within
	// the ExpertGroupsUsed groups whose two best selection scores sum
	// highest (DeepSeek-V3's group-limited routing).
	ExpertGroups, ExpertGroupsUsed int

	// GELU: the FFN's gate goes through GELU (tanh form, as ggml's table
	// of half-precision values), not SiLU (gemma).
	GELU bool
	// AttnScale, when not 0, multiplies the queries before they are
	// rounded for the dot products with the keys, in place of the scores'
	// 1/√HeadDim (gemma's query_pre_attn_scalar).
	AttnScale float32
	// Window, when positive, limits the attention of the sliding-window
	// layers (see SWA) to the Window latest positions, the token's own
	// included.
	Window int
	// SWAPattern: with a Window, layer l slides when l % SWAPattern <
	// SWAPattern-1 (every layer when 0): gemma 3 has five sliding layers,
	// then a global one.
	SWAPattern int
	// RopeThetaSWA, when not 0, is the RoPE base of the sliding layers,
	// which then also take no position scaling.
	RopeThetaSWA float32
	// MLA, when set, is DeepSeek's multi-head latent attention in its
	// absorbed form: one KV "head" of HeadDim = KVLora + RopeDim values per
	// token (the normed latent, then the rotated shared key), NHeadKV 1,
	// and V the latent itself (the first KVLora values of the K row).
	MLA *MLA
}

// MLA is multi-head latent attention as llama.cpp runs it absorbed: per
// query head, q = [q_nope (Nope) | q_pe (RopeDim)] from attn_q (or
// attn_q_a, its norm, attn_q_b); q_nope·attn_k_b (KVLora values) joins the
// rotated q_pe as the head's query against the cached rows; the
// attention's output (KVLora values per head) goes through attn_v_b to
// VDim values per head, then attn_output. KQScale scales the scores.
type MLA struct {
	QLora, KVLora, Nope, VDim int
	KQScale                   float32
}

// QHeadDim is a query head's width as attn_q (or attn_q_b) gives it.
func (m *MLA) QHeadDim(ropeDim int) int { return m.Nope + ropeDim }

// Yarn is YaRN RoPE scaling as ggml computes it: dimensions rotating
// faster than BetaFast turns over OrigCtx keep their frequency
// (extrapolated), those slower than BetaSlow are interpolated by the
// factor, a ramp between; cos and sin are scaled by AttnFactor·(1 + 0.1
// ln factor).
type Yarn struct {
	OrigCtx                        int
	BetaFast, BetaSlow, AttnFactor float32
}

// IsMoE reports routed experts.
func (s *Spec) IsMoE() bool { return s.NExpert > 0 }

// SWA reports whether layer l attends only within the sliding window.
func (s *Spec) SWA(l int) bool {
	return s.Window > 0 && (s.SWAPattern <= 0 || l%s.SWAPattern < s.SWAPattern-1)
}

// Plain reports that the spec needs none of GELU, AttnScale, Window,
// RopeThetaSWA, OAI, SigmoidGate, ExpertScale, MLA and ExpertGroups (what a device
// without them can run).
func (s *Spec) Plain() bool {
	return !s.GELU && s.AttnScale == 0 && s.Window == 0 && s.RopeThetaSWA == 0 && !s.OAI && !s.SigmoidGate && s.ExpertScale == 0 && s.MLA == nil && s.ExpertGroups <= 1
}

// AttnOutDim is a query head's share of attn_output's input: HeadDim, or
// MLA's VDim.
func (s *Spec) AttnOutDim() int {
	if s.MLA != nil {
		return s.MLA.VDim
	}
	return s.HeadDim
}

// Part is the part of each layer a tensor-parallel member holds: query
// heads [HeadLo,HeadHi) and the KV heads [KVLo,KVHi) they use (all of
// them on a single member).
type Part struct {
	HeadLo, HeadHi int
	KVLo, KVHi     int
}

// Layer holds one transformer block's weights in host memory (views into
// the mapped file, or resident copies), as the loader binds them.
type Layer struct {
	AttnNorm   []float32
	Wq, Wk, Wv *kernels.Matrix
	Wo         *kernels.Matrix
	Bq, Bk, Bv []float32 // nil when the architecture has no biases
	Bo         []float32 // attn_output bias, or nil
	QNorm      []float32 // per-head RMSNorm weights (qwen3), else nil
	KNorm      []float32
	FFNNorm    []float32
	// AttnPostNorm and FFNPostNorm RMS-normalize a half's complete output
	// before the residual add (gemma), or are nil.
	AttnPostNorm, FFNPostNorm []float32
	// Sinks are gpt-oss's attention sinks: per query head (all NHead of
	// them, indexed globally) a logit that joins the softmax's sum and
	// takes no value. nil: none.
	Sinks []float32
	// RouterB is the router's bias (gpt-oss); ExpGateB, ExpUpB and
	// ExpDownB the routed experts' biases, expert e's at [e*F, (e+1)*F)
	// (NEmbd for down), all experts' whatever a member holds.
	RouterB, ExpGateB, ExpUpB, ExpDownB []float32
	// ExpProbsB biases the routed experts' selection, not their weights
	// (DeepSeek-V3, GLM-4.5), or is nil.
	ExpProbsB []float32

	// MLA (Spec.MLA): Wq is attn_q of the lite variant, else nil with WqA
	// (attn_q_a), QANorm and WqB (attn_q_b, the held heads' rows); WkvA
	// is attn_kv_a_mqa (KVLora + RopeDim rows), KVANorm the latent's norm;
	// WkB holds per held head KVLora rows of Nope columns, WvB per head
	// VDim rows of KVLora columns. Wk and Wv are nil.
	WqA, WqB, WkvA, WkB, WvB *kernels.Matrix
	QANorm, KVANorm          []float32

	// Dense FFN.
	Gate, Up, Down *kernels.Matrix

	// Routed experts: Router is [NExpert x NEmbd]; expert e's matrices are
	// rows [e*F, (e+1)*F) of GateExps/UpExps and [e*NEmbd, (e+1)*NEmbd) of DownExps.
	Router                     *kernels.Matrix
	GateExps, UpExps, DownExps *kernels.Matrix
	ShGate, ShUp, ShDown       *kernels.Matrix // shared expert (qwen2moe)
	ShGateInp                  *kernels.Matrix // 1 x NEmbd, sigmoid gate of the shared expert

	// Experts are views of GateExps/UpExps/DownExps per expert, or resident
	// copies of them in a model opened from a file (nil matrices for experts
	// not held).
	Experts []Expert

	// Set when a tensor-parallel member's column range of attn_output,
	// ffn_down or ffn_down_shexp is not block aligned: the matrix then holds
	// whole output rows, and the half gathers (see model.Slice).
	WoGather, DownGather, ShDownGather bool
}

// Expert is one routed expert's FFN.
type Expert struct{ Gate, Up, Down *kernels.Matrix }
