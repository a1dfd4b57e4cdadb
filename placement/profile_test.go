package placement

import (
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/synth"
)

func writeSynth(t *testing.T, s synth.Spec) *gguf.File {
	t.Helper()
	f, err := gguf.Open(enginetest.Write(t, "", s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestProfileFromGGUF checks the profile of real synth files against their
// tensor tables.
func TestProfileFromGGUF(t *testing.T) {
	for _, tc := range []struct {
		spec              synth.Spec
		headUnit, ffnUnit int
		ffnDim            int
		experts           int
	}{
		// 8 heads in 2 KV groups of 4, head size 32: a group is 128 columns
		// of attn_output, not a whole Q4_K block (256), so a slice is 2 groups.
		{synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 3, NHead: 8, NHeadKV: 2, NFF: 512, Type: "q4_k", Name: "dense"}, 8, 256, 512, 0},
		// Q8_0 blocks are 32 wide: one GQA group (2 heads × 32) is enough.
		{synth.Spec{Arch: "qwen2", NEmbd: 256, NLayer: 2, NHead: 8, NHeadKV: 4, NFF: 320, Type: "q8_0", Name: "q8"}, 2, 32, 320, 0},
		{synth.Spec{Arch: "moe", NEmbd: 256, NLayer: 2, NHead: 8, NHeadKV: 8, NFF: 256, NExpert: 4, NExpertUsed: 2, Type: "q4_0", Name: "moe"}, 1, 1, 0, 4},
		{synth.Spec{Arch: "qwen2moe", NEmbd: 256, NLayer: 2, NHead: 4, NHeadKV: 4, NFF: 128, NFFShared: 384, NExpert: 4, NExpertUsed: 2, Type: "f16", Name: "shexp", Tied: true}, 1, 32, 384, 4},
	} {
		f := writeSynth(t, tc.spec)
		p, err := ProfileFromGGUF(f)
		if err != nil {
			t.Fatalf("%s: %v", tc.spec.Name, err)
		}
		var total uint64
		for _, ti := range f.Tensors {
			total += ti.Size
		}
		if got := p.WeightBytes(); got != total {
			t.Errorf("%s: weight bytes %d, tensors hold %d", tc.spec.Name, got, total)
		}
		if p.Name != tc.spec.Name || p.NLayer != tc.spec.NLayer || p.HeadUnit != tc.headUnit || p.FFNUnit != tc.ffnUnit || p.FFNDim != tc.ffnDim || p.NExpert != tc.experts {
			t.Errorf("%s: name %q layers %d head unit %d ffn unit %d ffn dim %d experts %d", tc.spec.Name, p.Name, p.NLayer, p.HeadUnit, p.FFNUnit, p.FFNDim, p.NExpert)
		}
		kv := tc.spec.NHeadKV * tc.spec.NEmbd / tc.spec.NHead
		if p.KVBytesPerToken != uint64(2*kv*2) {
			t.Errorf("%s: KV bytes/token %d, want %d", tc.spec.Name, p.KVBytesPerToken, 2*kv*2)
		}
		if p.Tied != tc.spec.Tied {
			t.Errorf("%s: tied %v", tc.spec.Name, p.Tied)
		}
		l := p.Layers[0]
		E := float64(tc.spec.NEmbd)
		wantAttn := 2 * (E*E + 2*E*float64(kv) + E*E) // q, k, v, o
		if l.AttnFLOPs != wantAttn {
			t.Errorf("%s: attention FLOPs %g, want %g", tc.spec.Name, l.AttnFLOPs, wantAttn)
		}
		if tc.experts > 0 && l.ExpertFLOPs != 2*3*E*float64(tc.spec.NFF) {
			t.Errorf("%s: expert FLOPs %g", tc.spec.Name, l.ExpertFLOPs)
		}
		// A plan on two nodes must be valid for the profile.
		nodes := []Node{{ID: "x", Status: StatusAlive, MemFree: 1 << 30}, {ID: "y", Status: StatusAlive, MemFree: 1 << 30}}
		strategy := Tensor
		if p.HeadUnits() == 1 {
			strategy = Pipeline // heads cannot be split
		}
		plan, err := Place(p, nodes, LinkMatrix{}, Options{Strategy: strategy, Overhead: 1 << 20, Context: 64})
		if err != nil {
			t.Fatalf("%s: %v", tc.spec.Name, err)
		}
		if err := plan.Validate(p); err != nil {
			t.Errorf("%s: %v\n%s", tc.spec.Name, err, plan)
		}
	}
}
