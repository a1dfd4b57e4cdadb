package model

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"shoal/engine/gguf"
)

// TestRegisterRefusesDuplicates: a second registration of a name panics
// and leaves the first one in place; so does a registration without a name.
func TestRegisterRefusesDuplicates(t *testing.T) {
	before := archs["llama"]
	for _, a := range []Arch{{Name: "llama", Rope: RopeNeoX}, {Name: ""}} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "model: Register") {
					t.Errorf("Register(%+v) did not panic with a clear message (recovered %q)", a, msg)
				}
			}()
			Register(a)
		}()
	}
	if archs["llama"] != before {
		t.Errorf("llama is now %+v, was %+v", archs["llama"], before)
	}
	if slices.Contains(Archs(), "") {
		t.Error("an architecture without a name was registered")
	}
}

func TestLayerTensor(t *testing.T) {
	for _, c := range []struct {
		name  string
		layer int
		role  string
		ok    bool
	}{
		{"blk.12.attn_q.weight", 12, "attn_q.weight", true},
		{"blk.0.ffn_down_exps.weight", 0, "ffn_down_exps.weight", true},
		{"token_embd.weight", 0, "", false},
		{"blk.x.attn_q.weight", 0, "", false},
		{"blk.-1.attn_q.weight", 0, "", false},
		{"blk.3", 0, "", false},
	} {
		layer, role, ok := LayerTensor(c.name)
		if layer != c.layer || role != c.role || ok != c.ok {
			t.Errorf("LayerTensor(%q) = %d %q %v, want %d %q %v", c.name, layer, role, ok, c.layer, c.role, c.ok)
		}
	}
}

// deepseek2Header is a deepseek2 file's metadata (no tensors) with kvs
// replacing or, with a nil value, removing keys.
func deepseek2Header(t *testing.T, kvs map[string]any) *gguf.File {
	t.Helper()
	p := "deepseek2."
	base := []gguf.KV{
		{Key: "general.architecture", Value: "deepseek2"},
		{Key: p + "embedding_length", Value: uint32(256)}, {Key: p + "block_count", Value: uint32(4)},
		{Key: p + "attention.head_count", Value: uint32(8)}, {Key: p + "attention.head_count_kv", Value: uint32(1)},
		{Key: p + "attention.key_length", Value: uint32(160)}, {Key: p + "attention.value_length", Value: uint32(128)},
		{Key: p + "attention.key_length_mla", Value: uint32(96)}, {Key: p + "attention.value_length_mla", Value: uint32(64)},
		{Key: p + "attention.kv_lora_rank", Value: uint32(128)}, {Key: p + "attention.q_lora_rank", Value: uint32(192)},
		{Key: p + "rope.dimension_count", Value: uint32(32)}, {Key: p + "vocab_size", Value: uint32(512)},
		{Key: p + "expert_count", Value: uint32(8)}, {Key: p + "expert_used_count", Value: uint32(3)},
		{Key: p + "expert_feed_forward_length", Value: uint32(128)}, {Key: p + "feed_forward_length", Value: uint32(512)},
	}
	var b bytes.Buffer
	w := gguf.NewWriter(&b)
	for _, kv := range base {
		v, replaced := kvs[kv.Key]
		if !replaced {
			v = kv.Value
		}
		if v != nil {
			if err := w.AddKV(kv.Key, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, v := range kvs {
		if !slices.ContainsFunc(base, func(kv gguf.KV) bool { return kv.Key == k }) {
			if err := w.AddKV(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.WriteHeader(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A deepseek2 file is read into its latent attention's shape, and one that
// cannot be run says why: an unabsorbed file (no *_mla lengths), a cache
// row that is not the latent plus the rotated key, groups that do not fit.
func TestDeepSeek2Config(t *testing.T) {
	c, err := ConfigFromGGUF(deepseek2Header(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	m := c.MLA
	if m == nil || m.KVLora != 128 || m.Nope != 64 || m.VDim != 64 || m.QLora != 192 || c.HeadDim != 160 || c.KVHalves() != 1 || c.QHeadDim() != 96 || c.OutHeadDim() != 64 {
		t.Fatalf("config %+v, MLA %+v", c, m)
	}
	if c.SigmoidGate {
		t.Error("a deepseek2 file without expert_gating_func gates by sigmoid; llama.cpp takes softmax (DeepSeek-V2)")
	}
	for _, bad := range []struct {
		kvs  map[string]any
		want string
	}{
		{map[string]any{"deepseek2.attention.key_length_mla": nil}, "convert the model again"},
		{map[string]any{"deepseek2.attention.key_length": uint32(192)}, "are not the latent attention's"},
		{map[string]any{"deepseek2.attention.head_count_kv": uint32(8)}, "are not the latent attention's"},
		{map[string]any{"deepseek2.expert_group_count": uint32(3), "deepseek2.expert_group_used_count": uint32(1)}, "do not fit 8 experts"},
		{map[string]any{"deepseek2.expert_group_count": uint32(4), "deepseek2.expert_group_used_count": uint32(1)}, "do not fit 8 experts"},
	} {
		_, err := ConfigFromGGUF(deepseek2Header(t, bad.kvs))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want an error saying %q", bad.kvs, err, bad.want)
		}
	}
}
