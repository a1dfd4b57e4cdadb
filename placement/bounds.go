package placement

import (
	"errors"
	"fmt"
	"math"
)

// Bounds of what the planner accepts. A profile comes from a GGUF header
// a node read, and the state keeps it in the Raft log, so every number the
// planner allocates or loops in proportion to is checked against these
// first (ModelProfile.Validate): no allocation proportional to an
// unchecked number. They are far above any real model (DeepSeek-V3 and
// Kimi K2: 61 layers, 256 and 384 experts, 7168 wide, 163,840 tokens of
// vocabulary, 128 heads; Llama 3.1 405B: 126 layers, FFN 53,248).
const (
	MaxLayers   = 4096
	MaxExperts  = 4096
	MaxHeads    = 4096 // query heads; KV heads are at most as many
	MaxHeadDim  = 1 << 14
	MaxEmbd     = 1 << 20
	MaxVocab    = 1 << 22
	MaxFFN      = 1 << 20 // FFN columns
	MaxFFNUnits = 1 << 16 // FFN slices a TP group divides (FFNDim / FFNUnit)
	// MaxBytes bounds every size in bytes: a tensor group, the model's
	// weights in all, a node's memory, a plan member's share: 1 PiB.
	MaxBytes = uint64(1) << 50
	// MaxKVBytesPerToken bounds one token's K and V in one layer: 1 GiB.
	MaxKVBytesPerToken = uint64(1) << 30
	// MaxFLOPs bounds a part of a layer's FLOPs per token.
	MaxFLOPs = 1e18
	// MaxContext and MaxBatch bound the options' KV cache: tokens per
	// sequence and sequences decoded together.
	MaxContext = 1 << 24
	MaxBatch   = 1 << 16
	// MaxStageMembers bounds a stage's tensor-parallel group.
	MaxStageMembers = 1024
	// MaxProfileText bounds the profile's name and architecture.
	MaxProfileText = 1024
	// MaxPlanLines bounds a plan's Explain and Moved lines, MaxPlanLine
	// each line's bytes.
	MaxPlanLines = 4096
	MaxPlanLine  = 64 << 10
)

// Validate reports why the planner must not plan p, or nil: every count
// and size within the bounds above, the shapes consistent (n_layer layer
// profiles, head and FFN units that divide their dimensions, experts used
// among the experts) and every float finite and not negative. Place and
// Replan refuse a profile that fails it before they allocate anything.
func (p *ModelProfile) Validate() error {
	if p == nil {
		return errors.New("profile is missing")
	}
	if len(p.Name) > MaxProfileText {
		return fmt.Errorf("profile name is %d bytes, limit %d", len(p.Name), MaxProfileText)
	}
	if len(p.Arch) > MaxProfileText {
		return fmt.Errorf("profile arch is %d bytes, limit %d", len(p.Arch), MaxProfileText)
	}
	ints := []struct {
		field   string
		v       int
		min, mx int
	}{
		{"n_layer", p.NLayer, 1, MaxLayers},
		{"n_embd", p.NEmbd, 1, MaxEmbd},
		{"n_head", p.NHead, 1, MaxHeads},
		{"n_head_kv", p.NHeadKV, 1, MaxHeads},
		{"head_dim", p.HeadDim, 1, MaxHeadDim},
		{"n_vocab", p.NVocab, 0, MaxVocab},
		{"ffn_dim", p.FFNDim, 0, MaxFFN},
		{"n_expert", p.NExpert, 0, MaxExperts},
		{"n_expert_used", p.NExpertUsed, 0, MaxExperts},
		{"head_unit", p.HeadUnit, 1, MaxHeads},
		{"ffn_unit", p.FFNUnit, 0, MaxFFN},
	}
	for _, c := range ints {
		if c.v < c.min || c.v > c.mx {
			return fmt.Errorf("profile %s %d is outside [%d, %d]", c.field, c.v, c.min, c.mx)
		}
	}
	switch {
	case p.NHeadKV > p.NHead || p.NHead%p.NHeadKV != 0:
		return fmt.Errorf("profile n_head_kv %d does not divide n_head %d", p.NHeadKV, p.NHead)
	case p.HeadUnit > p.NHead || p.NHead%p.HeadUnit != 0:
		return fmt.Errorf("profile head_unit %d does not divide n_head %d", p.HeadUnit, p.NHead)
	case p.FFNDim > 0 && (p.FFNUnit < 1 || p.FFNUnit > p.FFNDim || p.FFNDim%p.FFNUnit != 0):
		return fmt.Errorf("profile ffn_unit %d does not divide ffn_dim %d", p.FFNUnit, p.FFNDim)
	case p.FFNDim > 0 && p.FFNDim/p.FFNUnit > MaxFFNUnits:
		return fmt.Errorf("profile ffn_dim %d / ffn_unit %d is %d FFN slices, limit %d", p.FFNDim, p.FFNUnit, p.FFNDim/p.FFNUnit, MaxFFNUnits)
	case p.NExpert > 0 && (p.NExpertUsed < 1 || p.NExpertUsed > p.NExpert):
		return fmt.Errorf("profile n_expert_used %d is outside [1, n_expert %d]", p.NExpertUsed, p.NExpert)
	case p.KVBytesPerToken > MaxKVBytesPerToken:
		return fmt.Errorf("profile kv_bytes_per_token %d is above the limit %d", p.KVBytesPerToken, MaxKVBytesPerToken)
	case len(p.Layers) != p.NLayer:
		return fmt.Errorf("profile has %d layer profiles for n_layer %d", len(p.Layers), p.NLayer)
	}
	for _, b := range []struct {
		field string
		v     uint64
	}{{"embed_bytes", p.EmbedBytes}, {"output_bytes", p.OutputBytes}, {"global_bytes", p.GlobalBytes}} {
		if b.v > MaxBytes {
			return fmt.Errorf("profile %s %d is above the limit %d (1 PiB)", b.field, b.v, MaxBytes)
		}
	}
	// The weights in all, summed in floats so that no sum wraps: every
	// uint64 sum of them (WeightBytes, the planner's) then stays exact.
	total := float64(p.EmbedBytes) + float64(p.OutputBytes) + float64(p.GlobalBytes)
	for i := range p.Layers {
		l := &p.Layers[i]
		for _, b := range []struct {
			field string
			v     uint64
		}{{"attn_bytes", l.AttnBytes}, {"ffn_bytes", l.FFNBytes}, {"expert_bytes", l.ExpertBytes}, {"fixed_bytes", l.FixedBytes}} {
			if b.v > MaxBytes {
				return fmt.Errorf("profile layers[%d].%s %d is above the limit %d (1 PiB)", i, b.field, b.v, MaxBytes)
			}
		}
		for _, f := range []struct {
			field string
			v     float64
		}{{"attn_flops", l.AttnFLOPs}, {"ffn_flops", l.FFNFLOPs}, {"expert_flops", l.ExpertFLOPs}, {"fixed_flops", l.FixedFLOPs}} {
			if !(f.v >= 0 && f.v <= MaxFLOPs) { // NaN fails both
				return fmt.Errorf("profile layers[%d].%s %g is outside [0, %g]", i, f.field, f.v, MaxFLOPs)
			}
		}
		total += float64(l.AttnBytes) + float64(l.FFNBytes) + float64(l.FixedBytes) + float64(p.NExpert)*float64(l.ExpertBytes)
		if total > float64(MaxBytes) {
			return fmt.Errorf("profile weights reach %.0f bytes by layer %d, limit %d (1 PiB)", total, i, MaxBytes)
		}
	}
	return nil
}

// validate reports why the planner cannot use options o (normalized), or nil.
func (o Options) validate() error {
	switch {
	case o.Context < 0 || o.Context > MaxContext:
		return fmt.Errorf("placement: context %d is outside [0, %d]", o.Context, MaxContext)
	case o.Batch < 0 || o.Batch > MaxBatch:
		return fmt.Errorf("placement: batch %d is outside [0, %d]", o.Batch, MaxBatch)
	case o.Prompt < 0 || o.Prompt > MaxContext:
		return fmt.Errorf("placement: prompt of %d tokens is outside [0, %d]", o.Prompt, MaxContext)
	case o.Generate < 0 || o.Generate > MaxContext:
		return fmt.Errorf("placement: %d generated tokens is outside [0, %d]", o.Generate, MaxContext)
	case o.Overhead > MaxBytes:
		return fmt.Errorf("placement: overhead %d is above the limit %d (1 PiB)", o.Overhead, MaxBytes)
	case o.DriverBytes > MaxBytes || o.DriverKVBytesPerToken > MaxBytes:
		return fmt.Errorf("placement: driver bytes %d (and %d a position) are above the limit %d (1 PiB)", o.DriverBytes, o.DriverKVBytesPerToken, MaxBytes)
	case math.IsNaN(o.SafetyMargin) || o.SafetyMargin >= 1:
		return fmt.Errorf("placement: safety margin %g is not below 1", o.SafetyMargin)
	case math.IsNaN(o.MessageMs) || math.IsInf(o.MessageMs, 0):
		return fmt.Errorf("placement: message cost %g ms is not a finite number", o.MessageMs)
	case o.KVType != "" && o.KVType != "f16" && o.KVType != "q8_0" && o.KVType != "q4_0":
		return fmt.Errorf("placement: KV cache type %.16q is not f16, q8_0 or q4_0", o.KVType)
	}
	return nil
}

// CheckBounds reports why p cannot be a plan of a model with profile prof
// (nil: a model whose profile is not known yet, of nLayer layers, 0 when
// that is not known either), or nil. It checks the plan's shape and
// bounds, not that it places the model completely (Validate does): at most
// one pool of each role; in each pool stages that tile [0, n_layer) in
// order (at most MaxLayers); in each stage 1 to MaxStageMembers members
// with tp sizes equal to the stage's and ranks 0..size-1, head and FFN
// ranges inside the model's and experts among its; every predicted number
// finite, not negative and within MaxBytes. A plan without pools (one
// that releases the model's nodes) passes.
func (p *Plan) CheckBounds(prof *ModelProfile, nLayer int) error {
	nHead, ffn, experts := MaxHeads, MaxFFN, MaxExperts
	if prof != nil {
		nLayer, nHead, ffn, experts = prof.NLayer, prof.NHead, prof.FFNDim, prof.NExpert
	}
	if nLayer <= 0 || nLayer > MaxLayers {
		nLayer = 0 // unknown: stages end anywhere up to MaxLayers
	}
	if len(p.Explain) > MaxPlanLines || len(p.Moved) > MaxPlanLines {
		return fmt.Errorf("plan has %d explain and %d moved lines, limit %d each", len(p.Explain), len(p.Moved), MaxPlanLines)
	}
	for _, lines := range [][]string{p.Explain, p.Moved} {
		for _, l := range lines {
			if len(l) > MaxPlanLine {
				return fmt.Errorf("plan has a line of %d bytes, limit %d", len(l), MaxPlanLine)
			}
		}
	}
	if len(p.Strategy) > MaxPlanLine {
		return fmt.Errorf("plan strategy is %d bytes, limit %d", len(p.Strategy), MaxPlanLine)
	}
	if p.Context < 0 || p.Context > MaxContext || p.Batch < 0 || p.Batch > MaxBatch {
		return fmt.Errorf("plan context %d or batch %d is outside [0, %d] and [0, %d]", p.Context, p.Batch, MaxContext, MaxBatch)
	}
	if p.MovedBytes > MaxBytes {
		return fmt.Errorf("plan moved_bytes %d is above the limit %d (1 PiB)", p.MovedBytes, MaxBytes)
	}
	if err := p.Cost.check("plan cost"); err != nil {
		return err
	}
	if len(p.Pools) > 3 {
		return fmt.Errorf("plan has %d pools, at most 3 (shared, prefill, decode)", len(p.Pools))
	}
	roles := map[string]bool{}
	for _, pool := range p.Pools {
		switch pool.Role {
		case RoleShared, RolePrefill, RoleDecode:
		default:
			return fmt.Errorf("plan pool role %.40q is not shared, prefill or decode", pool.Role)
		}
		if roles[pool.Role] {
			return fmt.Errorf("plan has two %s pools", pool.Role)
		}
		roles[pool.Role] = true
		if err := pool.Cost.check("plan pool " + pool.Role + " cost"); err != nil {
			return err
		}
		if len(pool.Stages) == 0 || len(pool.Stages) > MaxLayers {
			return fmt.Errorf("plan pool %s has %d stages, want 1 to %d", pool.Role, len(pool.Stages), MaxLayers)
		}
		next := 0
		for k, st := range pool.Stages {
			if st.Lo != next || st.Hi <= st.Lo || st.Hi > MaxLayers || nLayer > 0 && st.Hi > nLayer {
				bound := fmt.Sprintf("the model's %d layers", nLayer)
				if nLayer == 0 {
					bound = fmt.Sprintf("at most %d layers", MaxLayers)
				}
				return fmt.Errorf("plan pool %s stage %d has layers [%d,%d), want [%d, hi): stages must tile %s in order", pool.Role, k, st.Lo, st.Hi, next, bound)
			}
			next = st.Hi
			if !(st.Ms >= 0 && st.Ms <= math.MaxFloat64) {
				return fmt.Errorf("plan pool %s stage %d ms %g is not a finite number >= 0", pool.Role, k, st.Ms)
			}
			g := len(st.Members)
			if g == 0 || g > MaxStageMembers {
				return fmt.Errorf("plan pool %s stage %d has %d members, want 1 to %d", pool.Role, k, g, MaxStageMembers)
			}
			ranks := make([]bool, g)
			for _, m := range st.Members {
				if err := m.check(g, ranks, nHead, ffn, experts); err != nil {
					return fmt.Errorf("plan pool %s stage %d member %.40q: %w", pool.Role, k, m.Node, err)
				}
			}
		}
		if nLayer > 0 && next != nLayer {
			return fmt.Errorf("plan pool %s stages end at layer %d, the model has %d", pool.Role, next, nLayer)
		}
	}
	return nil
}

// check is one member's bounds in a stage of g members; ranks marks the
// ranks seen.
func (m *Member) check(g int, ranks []bool, nHead, ffn, experts int) error {
	switch {
	case m.Node == "" || len(m.Node) > MaxPlanLine:
		return fmt.Errorf("node id is empty or over %d bytes", MaxPlanLine)
	case m.TPSize != g:
		return fmt.Errorf("tp_size %d, the stage has %d members", m.TPSize, g)
	case m.TPRank < 0 || m.TPRank >= g || ranks[m.TPRank]:
		return fmt.Errorf("tp_rank %d is a duplicate or outside [0, %d)", m.TPRank, g)
	case m.HeadLo < 0 || m.HeadLo > m.HeadHi || m.HeadHi > nHead:
		return fmt.Errorf("heads [%d,%d) are outside [0, %d)", m.HeadLo, m.HeadHi, nHead)
	case m.FFNLo < 0 || m.FFNLo > m.FFNHi || m.FFNHi > ffn:
		return fmt.Errorf("FFN columns [%d,%d) are outside [0, %d)", m.FFNLo, m.FFNHi, ffn)
	case len(m.Experts) > experts:
		return fmt.Errorf("holds %d experts, the model has %d", len(m.Experts), experts)
	case m.MemBytes > MaxBytes || m.KVBytes > MaxBytes:
		return fmt.Errorf("mem_bytes %d or kv_bytes %d is above the limit %d (1 PiB)", m.MemBytes, m.KVBytes, MaxBytes)
	case !(m.Ms >= 0 && m.Ms <= math.MaxFloat64):
		return fmt.Errorf("ms %g is not a finite number >= 0", m.Ms)
	}
	ranks[m.TPRank] = true
	for _, x := range m.Experts {
		if x < 0 || x >= experts {
			return fmt.Errorf("expert %d is outside [0, %d)", x, experts)
		}
	}
	return nil
}

// check reports a cost with a number that is not finite or is negative.
func (c Cost) check(what string) error {
	for _, v := range []float64{c.MsPerToken, c.ComputeMs, c.MemoryMs, c.NetworkMs, c.BottleneckMs} {
		if !(v >= 0 && v <= math.MaxFloat64) {
			return fmt.Errorf("%s has %g: every number must be finite and >= 0", what, v)
		}
	}
	return nil
}
