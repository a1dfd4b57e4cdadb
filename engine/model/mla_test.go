package model_test

import (
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/kv"
	"shoal/engine/model"
)

// Must-show (issue #37): a latent-attention model's KV cache holds, per
// token and layer, the latent and the rotated key once ((kv_lora_rank +
// rope_dim) F16 values, read as key and value): measured from the cache's
// memory and from an exported block (placement's TestMLAProfile checks the
// planner's count).
func TestMLACacheBytes(t *testing.T) {
	oc := enginetest.ArchCase(t, "deepseek2-f16")
	m := enginetest.OpenPath(t, oc.Model)
	mla := m.Config.MLA
	if mla == nil {
		t.Fatal("deepseek2 without latent attention")
	}
	want := int64((mla.KVLora + m.Config.RopeDim) * m.Config.NLayer * 2)
	const tokens = 64
	r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := r.Cache()
	store, ok := c.Store().(*kv.HostStore)
	if !ok {
		t.Fatalf("store %T", c.Store())
	}
	cfg := c.Config()
	positions := int64(cfg.NumBlocks * cfg.BlockSize)
	if got := store.Bytes() / positions; got != want {
		t.Errorf("the cache takes %d bytes per token, want (%d + %d) x %d layers x 2 = %d", got, mla.KVLora, m.Config.RopeDim, m.Config.NLayer, want)
	}
	if _, err := r.Prompt(0, oc.Tokens[:cfg.BlockSize], nil); err != nil {
		t.Fatal(err)
	}
	b, err := c.ExportBlock(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	const framing = 4 + 5*4 + 4 // magic, header, checksum
	if got := int64(len(b)-framing) / int64(cfg.BlockSize); got != want {
		t.Errorf("an exported block carries %d bytes per token, want %d", got, want)
	}
	plain := m.Config.NHead * (mla.Nope + m.Config.RopeDim + mla.VDim) * m.Config.NLayer * 2
	t.Logf("MLA cache: %d bytes per token over %d layers ((%d + %d) x 2 each); its %d heads' keys and values would take %d", want, m.Config.NLayer, mla.KVLora, m.Config.RopeDim, m.Config.NHead, plain)
}
