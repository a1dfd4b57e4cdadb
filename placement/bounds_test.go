package placement

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"shoal/engine/quant"
)

// realShapes are the largest models the bounds must take: DeepSeek-V3
// (and R1), Kimi K2 and Llama 3.1 405B as their GGUF headers describe them.
var realShapes = []shape{
	{name: "deepseek-v3", layers: 61, embd: 7168, heads: 128, kv: 128, headD: 128, ff: 2048, shared: 2048, vocab: 129280, experts: 256, used: 8, typ: quant.Q4_K, out: quant.Q6_K},
	{name: "kimi-k2", layers: 61, embd: 7168, heads: 64, kv: 64, headD: 128, ff: 2048, shared: 2048, vocab: 163840, experts: 384, used: 8, typ: quant.Q4_K, out: quant.Q6_K},
	{name: "llama-3.1-405b", layers: 126, embd: 16384, heads: 128, kv: 8, ff: 53248, vocab: 128256, typ: quant.Q4_K, out: quant.Q6_K},
}

// TestProfileBoundsTakeRealModels: the bounds are generous enough for the
// largest real models, which Place then plans over big nodes.
func TestProfileBoundsTakeRealModels(t *testing.T) {
	for _, s := range realShapes {
		p, err := s.profile()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var nodes []Node
		for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			nodes = append(nodes, Node{ID: id, Status: StatusAlive, MemFree: 192 << 30, GFLOPS: 5000, MemGBps: 800})
		}
		plan, err := Place(p, nodes, LinkMatrix{}, Options{})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if err := plan.Validate(p); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if err := plan.CheckBounds(&p, 0); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
}

// boundsProfile is a small valid MoE profile for the table below.
func boundsProfile() ModelProfile {
	p := ModelProfile{Name: "m", Arch: "llama", NLayer: 4, NEmbd: 256, NHead: 8, NHeadKV: 2, HeadDim: 32, NVocab: 1000,
		FFNDim: 512, NExpert: 8, NExpertUsed: 2, HeadUnit: 4, FFNUnit: 32, KVBytesPerToken: 256, EmbedBytes: 1 << 20, OutputBytes: 1 << 20}
	for range p.NLayer {
		p.Layers = append(p.Layers, LayerProfile{AttnBytes: 1 << 18, FFNBytes: 1 << 18, ExpertBytes: 1 << 16, FixedBytes: 1024,
			AttnFLOPs: 1 << 19, FFNFLOPs: 1 << 19, ExpertFLOPs: 1 << 17, FixedFLOPs: 2048})
	}
	return p
}

// TestProfileValidate: every bound's violation fails with a message that
// names the field.
func TestProfileValidate(t *testing.T) {
	if p := boundsProfile(); p.Validate() != nil {
		t.Fatalf("the valid profile: %v", p.Validate())
	}
	if err := (*ModelProfile)(nil).Validate(); err == nil {
		t.Fatal("a nil profile passed")
	}
	for _, tc := range []struct {
		field string
		set   func(p *ModelProfile)
	}{
		{"n_expert", func(p *ModelProfile) { p.NExpert = 1 << 40 }},
		{"n_expert", func(p *ModelProfile) { p.NExpert = MaxExperts + 1 }},
		{"n_expert", func(p *ModelProfile) { p.NExpert = -1 }},
		{"n_expert_used", func(p *ModelProfile) { p.NExpertUsed = 9 }},
		{"n_expert_used", func(p *ModelProfile) { p.NExpertUsed = 0 }},
		{"n_layer", func(p *ModelProfile) { p.NLayer = 0 }},
		{"n_layer", func(p *ModelProfile) { p.NLayer = MaxLayers + 1 }},
		{"n_layer", func(p *ModelProfile) { p.NLayer = 5 }}, // 4 layer profiles
		{"n_embd", func(p *ModelProfile) { p.NEmbd = MaxEmbd + 1 }},
		{"n_embd", func(p *ModelProfile) { p.NEmbd = 0 }},
		{"n_head", func(p *ModelProfile) { p.NHead = MaxHeads + 1 }},
		{"n_head", func(p *ModelProfile) { p.NHead = -8 }},
		{"n_head_kv", func(p *ModelProfile) { p.NHeadKV = 3 }},
		{"n_head_kv", func(p *ModelProfile) { p.NHeadKV = 0 }},
		{"head_dim", func(p *ModelProfile) { p.HeadDim = MaxHeadDim + 1 }},
		{"n_vocab", func(p *ModelProfile) { p.NVocab = MaxVocab + 1 }},
		{"n_vocab", func(p *ModelProfile) { p.NVocab = -1 }},
		{"ffn_dim", func(p *ModelProfile) { p.FFNDim = MaxFFN + 1 }},
		{"ffn_unit", func(p *ModelProfile) { p.FFNUnit = 33 }},
		{"ffn_unit", func(p *ModelProfile) { p.FFNUnit = 0 }},
		{"ffn_dim", func(p *ModelProfile) { p.FFNDim, p.FFNUnit = MaxFFN, 1 }}, // 1M slices
		{"head_unit", func(p *ModelProfile) { p.HeadUnit = 3 }},
		{"head_unit", func(p *ModelProfile) { p.HeadUnit = 0 }},
		{"kv_bytes_per_token", func(p *ModelProfile) { p.KVBytesPerToken = MaxKVBytesPerToken + 1 }},
		{"embed_bytes", func(p *ModelProfile) { p.EmbedBytes = MaxBytes + 1 }},
		{"output_bytes", func(p *ModelProfile) { p.OutputBytes = math.MaxUint64 }},
		{"global_bytes", func(p *ModelProfile) { p.GlobalBytes = MaxBytes + 1 }},
		{"attn_bytes", func(p *ModelProfile) { p.Layers[2].AttnBytes = MaxBytes + 1 }},
		{"expert_bytes", func(p *ModelProfile) { p.Layers[0].ExpertBytes = math.MaxUint64 }},
		{"weights", func(p *ModelProfile) { p.Layers[1].ExpertBytes = MaxBytes / 4 }}, // x 8 experts
		{"ffn_flops", func(p *ModelProfile) { p.Layers[3].FFNFLOPs = math.NaN() }},
		{"attn_flops", func(p *ModelProfile) { p.Layers[3].AttnFLOPs = math.Inf(1) }},
		{"expert_flops", func(p *ModelProfile) { p.Layers[0].ExpertFLOPs = -1 }},
		{"fixed_flops", func(p *ModelProfile) { p.Layers[0].FixedFLOPs = 2e18 }},
		{"name", func(p *ModelProfile) { p.Name = strings.Repeat("x", MaxProfileText+1) }},
		{"arch", func(p *ModelProfile) { p.Arch = strings.Repeat("x", MaxProfileText+1) }},
	} {
		p := boundsProfile()
		tc.set(&p)
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line naming the field", tc.field, err)
		}
	}
}

// TestPlannerRefusesInvalidProfile: Place and Replan refuse the profile of
// issue #33 (n_expert = 2^40) before they allocate for it; Replan marks
// the model unservable and releases the nodes of its plan.
func TestPlannerRefusesInvalidProfile(t *testing.T) {
	nodes := []Node{{ID: "a", Status: StatusAlive, MemFree: 64 << 30}, {ID: "b", Status: StatusAlive, MemFree: 64 << 30}}
	good := boundsProfile()
	prev, err := Place(good, nodes, LinkMatrix{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	bad := boundsProfile()
	bad.NExpert = 1 << 40
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := Place(bad, nodes, LinkMatrix{}, Options{}); err == nil || !strings.Contains(err.Error(), "n_expert") {
			t.Fatalf("Place: %v", err)
		}
	})
	if allocs > 50 {
		t.Errorf("refusing the profile took %v allocations", allocs)
	}
	d := Replan(bad, nodes, LinkMatrix{}, Options{}, &prev, "a")
	if !strings.Contains(d.Unservable, "n_expert") || d.Keep || len(d.Plan.Pools) != 0 || len(d.Plan.Moved) != len(prev.Nodes()) {
		t.Fatalf("Replan: %+v", d)
	}
	for _, o := range []Options{{Context: MaxContext + 1}, {Batch: MaxBatch + 1}, {Overhead: MaxBytes + 1}, {SafetyMargin: math.NaN()}, {MessageMs: math.Inf(1)}} {
		if _, err := Place(good, nodes, LinkMatrix{}, o); err == nil {
			t.Errorf("options %+v were taken", o)
		}
	}
}

// TestPlanCheckBounds: the planner's plans pass; a plan out of the
// model's bounds fails.
func TestPlanCheckBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 1))
	for range 100 {
		prof, nodes, links, o := randomCase(r)
		plan, err := Place(prof, nodes, links, o)
		if err != nil {
			continue
		}
		if err := plan.CheckBounds(&prof, 0); err != nil {
			t.Fatalf("a plan of the planner: %v\n%s", err, plan)
		}
		if err := plan.CheckBounds(nil, prof.NLayer); err != nil {
			t.Fatalf("a plan of the planner, the layers alone: %v\n%s", err, plan)
		}
	}
	prof := boundsProfile()
	nodes := []Node{{ID: "a", Status: StatusAlive, MemFree: 1 << 30}, {ID: "b", Status: StatusAlive, MemFree: 1 << 30}}
	base, err := Place(prof, nodes, LinkMatrix{}, Options{Strategy: Tensor})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&Plan{Version: 2, Model: "m"}).CheckBounds(&prof, 0); err != nil {
		t.Fatalf("a plan that releases the nodes: %v", err)
	}
	for _, tc := range []struct {
		want string
		set  func(p *Plan)
	}{
		{"pools", func(p *Plan) { p.Pools = append(p.Pools, p.Pools[0], p.Pools[0], p.Pools[0]) }},
		{"two shared pools", func(p *Plan) { p.Pools = append(p.Pools, p.Pools[0]) }},
		{"role", func(p *Plan) { p.Pools[0].Role = "x" }},
		{"layers [0,5)", func(p *Plan) { p.Pools[0].Stages[0].Hi = 5 }},
		{"layers [1,4)", func(p *Plan) { p.Pools[0].Stages[0].Lo = 1 }},
		{"stages end at layer 3", func(p *Plan) { p.Pools[0].Stages[0].Hi = 3 }},
		{"tp_size", func(p *Plan) { p.Pools[0].Stages[0].Members[0].TPSize = 3 }},
		{"tp_rank", func(p *Plan) { p.Pools[0].Stages[0].Members[1].TPRank = 0 }},
		{"heads", func(p *Plan) { p.Pools[0].Stages[0].Members[1].HeadHi = 9 }},
		{"FFN", func(p *Plan) { p.Pools[0].Stages[0].Members[1].FFNLo = -1 }},
		{"expert 8", func(p *Plan) { p.Pools[0].Stages[0].Members[1].Experts = []int{8} }},
		{"experts", func(p *Plan) { p.Pools[0].Stages[0].Members[1].Experts = make([]int, 9) }},
		{"mem_bytes", func(p *Plan) { p.Pools[0].Stages[0].Members[1].MemBytes = MaxBytes + 1 }},
		{"ms", func(p *Plan) { p.Pools[0].Stages[0].Members[1].Ms = math.NaN() }},
		{"cost", func(p *Plan) { p.Cost.MsPerToken = -1 }},
		{"members", func(p *Plan) { p.Pools[0].Stages[0].Members = nil }},
		{"lines", func(p *Plan) { p.Explain = make([]string, MaxPlanLines+1) }},
		{"line of", func(p *Plan) { p.Moved = []string{strings.Repeat("x", MaxPlanLine+1)} }},
	} {
		p := base
		p.Pools = []Pool{base.Pools[0]}
		p.Pools[0].Stages = []Stage{base.Pools[0].Stages[0]}
		p.Pools[0].Stages[0].Members = append([]Member(nil), base.Pools[0].Stages[0].Members...)
		tc.set(&p)
		if err := p.CheckBounds(&prof, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v", tc.want, err)
		}
	}
}
