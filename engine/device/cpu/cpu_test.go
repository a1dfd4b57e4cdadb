package cpu_test

import (
	"math"
	"slices"
	"testing"

	"shoal/engine/device"
	"shoal/engine/enginetest"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/synth"
)

// specs are small dense, GQA and MoE (with a shared expert) models.
var specs = []synth.Spec{
	{Arch: "llama", NEmbd: 64, NLayer: 3, NHead: 4, NHeadKV: 2, NFF: 128, Ctx: 96, Type: "q8_0"},
	{Arch: "qwen3", NEmbd: 64, NLayer: 2, NHead: 4, NHeadKV: 1, NFF: 96, Ctx: 96, Type: "q4_k_m"},
	{Arch: "qwen2moe", NEmbd: 64, NLayer: 2, NHead: 4, NHeadKV: 2, NFF: 64, NExpert: 4, NExpertUsed: 2, Ctx: 96, Type: "f16"},
}

func newRunner(t *testing.T, m *model.Model) *model.Runner {
	t.Helper()
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 96, BlockSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func tokens(n, seed int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*7 + seed*13 + 1) % 32)
	}
	return out
}

// embedded reserves b on r and returns its tokens' embeddings.
func embedded(t *testing.T, r *model.Runner, b *model.Batch) []float32 {
	t.Helper()
	if err := r.Reserve(b); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, b.Len()*r.Model().NEmbd)
	if err := r.Embed(b.Tokens, x); err != nil {
		t.Fatal(err)
	}
	return x
}

// byHalves runs every layer of r on b through the device's halves and
// residuals, as a tensor-parallel runner composes them (with no group,
// nothing to reduce).
func byHalves(t *testing.T, r *model.Runner, b *model.Batch, x []float32) {
	t.Helper()
	d := r.Device()
	var db device.Batch
	for _, c := range b.Chunks {
		db.Chunks = append(db.Chunks, device.Chunk{Pos: c.Pos, N: c.N, Blocks: r.Cache().Blocks(c.Seq)})
	}
	if err := d.Begin(&db); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(x))
	lo, hi := r.Range()
	for l := lo; l < hi; l++ {
		for _, h := range []device.Half{device.AttnHalf, device.FFNHalf} {
			run := d.Attention
			if h == device.FFNHalf {
				run = d.FFN
			}
			if _, err := run(l, x, out); err != nil {
				t.Fatal(err)
			}
			d.Residual(l, h, x, out)
		}
	}
}

func sameBits(t *testing.T, what string, a, b []float32) {
	t.Helper()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s: value %d is %v whole, %v by halves", what, i, a[i], b[i])
		}
	}
}

// The whole-range Forward and the per-layer halves composed give the same
// hidden states and logits, bit for bit: over a prompt, then a batch mixing
// a decode token and a second prompt.
func TestForwardEqualsHalves(t *testing.T) {
	for _, sp := range specs {
		t.Run(sp.Arch, func(t *testing.T) {
			m := enginetest.Open(t, sp)
			whole, halves := newRunner(t, m), newRunner(t, m)
			batches := []model.Batch{
				{Tokens: tokens(19, 1), Chunks: []model.Chunk{{Seq: 1, N: 19}}},
				{Tokens: append([]int32{5}, tokens(9, 2)...), Chunks: []model.Chunk{{Seq: 1, N: 1}, {Seq: 2, N: 9}}},
			}
			for i := range batches {
				b1, b2 := batches[i], batches[i]
				b1.Chunks, b2.Chunks = slices.Clone(b1.Chunks), slices.Clone(b2.Chunks)
				x1, x2 := embedded(t, whole, &b1), embedded(t, halves, &b2)
				if err := whole.Forward(&b1, 0, m.NLayer, x1); err != nil {
					t.Fatal(err)
				}
				byHalves(t, halves, &b2, x2)
				sameBits(t, "hidden states", x1, x2)
				rows := []int{0, b1.Len() - 1}
				l1, l2 := make([]float32, 2*m.NVocab), make([]float32, 2*m.NVocab)
				if err := whole.Device().Logits(x1, rows, l1); err != nil {
					t.Fatal(err)
				}
				if err := halves.Device().Logits(x2, rows, l2); err != nil {
					t.Fatal(err)
				}
				sameBits(t, "logits", l1, l2)
			}
		})
	}
}

// A sequence's KV exported block by block from one runner's device store
// and imported through another's host block tables decodes on exactly as
// the original does; so does one moved by position ranges.
func TestKVExportImportThroughDevice(t *testing.T) {
	for _, sp := range specs {
		t.Run(sp.Arch, func(t *testing.T) {
			m := enginetest.Open(t, sp)
			src, byBlock, byRange := newRunner(t, m), newRunner(t, m), newRunner(t, m)
			prompt := tokens(21, 3) // two full blocks of 8 and a partial one
			if _, err := src.Prompt(7, prompt, []int{0}); err != nil {
				t.Fatal(err)
			}
			c := src.Cache()
			for i := range c.Blocks(7) {
				blk, err := c.ExportBlock(7, i)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := byBlock.Cache().ImportBlock(4, blk); err != nil {
					t.Fatal(err)
				}
				again, err := byBlock.Cache().ExportBlock(4, i)
				if err != nil || !slices.Equal(again, blk) {
					t.Fatalf("block %d exported again differs (%v)", i, err)
				}
			}
			moveRanges(t, src, byRange, 7, 4, len(prompt))
			for step := range 3 {
				tok := int32(3 + step)
				want, err := src.Decode(7, tok)
				if err != nil {
					t.Fatal(err)
				}
				want = slices.Clone(want)
				for _, r := range []*model.Runner{byBlock, byRange} {
					got, err := r.Decode(4, tok)
					if err != nil {
						t.Fatal(err)
					}
					sameBits(t, "decode logits after import", want, got)
				}
			}
		})
	}
}

// moveRanges copies n positions of seq from src to seq to of dst, layer by
// layer, in runs that straddle blocks.
func moveRanges(t *testing.T, src, dst *model.Runner, from, to kv.SeqID, n int) {
	t.Helper()
	if _, err := dst.Cache().Reserve(to, n); err != nil {
		t.Fatal(err)
	}
	D := src.Model().HeadDim
	heads := src.Cache().Config().KVDim / D
	lo, hi := src.Range()
	for l := lo; l < hi; l++ {
		for p := 0; p < n; p += 5 {
			run := min(5, n-p)
			k, v := make([]uint16, kv.RangeLen(run, 0, heads, D)), make([]uint16, kv.RangeLen(run, 0, heads, D))
			if err := src.Cache().ExportRange(from, l, p, run, 0, heads, D, k, v); err != nil {
				t.Fatal(err)
			}
			if err := dst.Cache().ImportRange(to, l, p, run, 0, heads, D, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
}
