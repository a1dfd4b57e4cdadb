package model_test

import (
	"slices"
	"strings"
	"testing"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/device/split"
	"shoal/engine/device/vulkan"
	"shoal/engine/enginetest"
	"shoal/engine/kernels"
	"shoal/engine/model"
)

// TestOracleVulkan runs every case of ../shared/oracle with the whole model
// on the Vulkan device (lavapipe in CI), and with its first half of the
// layers there and the rest on the CPU, and compares the logits with
// llama.cpp's by the same tolerances as the CPU.
func TestOracleVulkan(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	for _, c := range enginetest.OracleCases(t) {
		for _, half := range []bool{false, true} {
			name := c.Name + "/whole"
			if half {
				name = c.Name + "/half"
			}
			t.Run(name, func(t *testing.T) {
				oracleOn(t, c, func(m *model.Model) device.Device {
					gpu := vulkan.Device{GPU: g}
					if half {
						return split.Device{First: gpu, Layers: m.NLayer / 2, Rest: cpu.Device{}}
					}
					return gpu
				})
			})
		}
	}
}

// TestOracleVulkanGroups runs every oracle case through a 2-member
// tensor-parallel group of a Vulkan member and a CPU member, and a 2-stage
// pipeline of a Vulkan stage and a CPU stage, each member on its shard as
// a node holds it.
func TestOracleVulkanGroups(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	gpu := vulkan.Device{GPU: g}
	first := func(stage, rank int) device.Device {
		if stage == 0 && rank == 0 {
			return gpu
		}
		return nil
	}
	for _, c := range enginetest.OracleCases(t) {
		ref := enginetest.OpenPath(t, c.Model)
		for _, p := range shapeOf(&ref.Config).Plans(c.Name) {
			if p.Name != "tp2" && p.Name != "pp2" {
				continue
			}
			t.Run(c.Name+"/"+p.Name, func(t *testing.T) {
				grp, err := tryBuild(t, c.Model, p.Plan, false, first)
				if err != nil {
					t.Fatal(err)
				}
				got, err := grp.step(5, c.Tokens, ref.NEmbd, ref.NVocab)
				if err != nil {
					t.Fatal(err)
				}
				mt := enginetest.Compare(c.Logits, got, c.NVocab)
				float := enginetest.IsFloat(ref.File)
				t.Logf("ORACLE %s vulkan+cpu %-14s float=%-5v %s%s", p.Name, c.Name, float, mt, describe(p.Plan))
				if err := mt.Check(float); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

// TestVulkanFit gives the GPU room for only some of a model's layers: the
// runner puts those on the device and the rest on the CPU, and the logits
// still match llama.cpp's; with room for none, all run on the CPU.
func TestVulkanFit(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	c := oracleCase(t, "llama-q8_0")
	{
		m := enginetest.OpenPath(t, c.Model)
		base := g.Allocated()
		for _, room := range []uint64{64<<20 + 2*layerBytes(m), 1} {
			r := runnerOn(t, m, vulkan.Fit{GPU: g, Rest: cpu.Device{}, Budget: base + room})
			_, isSplit := r.Device().(*split.Range)
			_, onCPU := r.Device().(*cpu.Range)
			if room > 1 && !isSplit || room == 1 && !onCPU {
				t.Errorf("room for %d MiB: the range is a %T", room>>20, r.Device())
			}
			got, err := r.Prompt(0, c.Tokens, nil)
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			mt := enginetest.Compare(c.Logits, got, c.NVocab)
			t.Logf("ORACLE fit in %d MiB (%T) %s", room>>20, r.Device(), mt)
			if err := mt.Check(false); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestVulkanFitUnsupportedFormat: a model in a format the GPU has no kernel
// for (Q2_K) loads on the CPU through Fit, and gives the CPU's logits.
func TestVulkanFitUnsupportedFormat(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	spec := denseQ4K
	spec.Type = "q2_k"
	m := enginetest.Open(t, spec)
	r := runnerOn(t, m, vulkan.Fit{GPU: g, Rest: cpu.Device{}})
	defer r.Close()
	if _, ok := r.Device().(*cpu.Range); !ok {
		t.Fatalf("a Q2_K model through Fit runs on a %T", r.Device())
	}
	if _, err := r.Prompt(0, []int32{1, 2, 3}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := runnerOnErr(m, vulkan.Device{GPU: g}); err == nil || !strings.Contains(err.Error(), "Q2_K") {
		t.Errorf("a Q2_K model straight on the GPU: %v, want an error naming the format", err)
	}
}

// layerBytes is the weights and KV rows (128 tokens) of one layer of m.
func layerBytes(m *model.Model) uint64 {
	ly := &m.W.Layers[0]
	var b uint64
	for _, x := range []*kernels.Matrix{ly.Wq, ly.Wk, ly.Wv, ly.Wo, ly.Gate, ly.Up, ly.Down} {
		b += uint64(x.Rows * x.RowSize)
	}
	return b + 4*128*uint64(m.NHeadKV*m.HeadDim)
}

// TestVulkanKVHandoff: a sequence's KV cache exported block by block from a
// runner on the Vulkan device and imported into another Vulkan runner
// decodes on bit for bit as the source does, and imported into a CPU
// runner (as a disaggregated pool of CPUs would take it) decodes on to
// the source's logits within float rounding.
func TestVulkanKVHandoff(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	c := oracleCase(t, "llama-f32")
	{
		m := enginetest.OpenPath(t, c.Model)
		open := func(d device.Device) *model.Runner {
			r := runnerOn(t, m, d)
			t.Cleanup(r.Close)
			return r
		}
		src, toGPU, toCPU := open(vulkan.Device{GPU: g}), open(vulkan.Device{GPU: g}), open(cpu.Device{})
		if _, err := src.Prompt(7, c.Tokens[:21], []int{0}); err != nil {
			t.Fatal(err)
		}
		for i := range src.Cache().Blocks(7) {
			blk, err := src.Cache().ExportBlock(7, i)
			if err != nil {
				t.Fatal(err)
			}
			for _, dst := range []*model.Runner{toGPU, toCPU} {
				if _, err := dst.Cache().ImportBlock(4, blk); err != nil {
					t.Fatal(err)
				}
			}
		}
		for step := range 3 {
			tok := c.Tokens[21+step]
			want, err := src.Decode(7, tok)
			if err != nil {
				t.Fatal(err)
			}
			want = slices.Clone(want)
			got, err := toGPU.Decode(4, tok)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(want, got) {
				t.Fatalf("step %d: the Vulkan runner that imported the KV decodes other logits than the source", step)
			}
			got, err = toCPU.Decode(4, tok)
			if err != nil {
				t.Fatal(err)
			}
			mt := enginetest.Compare(want, got, m.NVocab)
			t.Logf("step %d: Vulkan -> CPU handoff: %s", step, mt)
			if err := mt.Check(true); err != nil {
				t.Error(err)
			}
		}
	}
}

// runnerOn is a runner of m on d with room for 128 tokens.
func runnerOn(t *testing.T, m *model.Model, d device.Device) *model.Runner {
	t.Helper()
	r, err := runnerOnErr(m, d)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func runnerOnErr(m *model.Model, d device.Device) (*model.Runner, error) {
	return model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 128, Device: d})
}

// oracleCase is the ../shared/oracle case called name (skipping without it).
func oracleCase(t *testing.T, name string) enginetest.OracleCase {
	t.Helper()
	for _, c := range enginetest.OracleCases(t) {
		if c.Name == name {
			return c
		}
	}
	t.Skipf("no oracle case %s", name)
	return enginetest.OracleCase{}
}

// TestVulkanFitArchs: each newer architecture's case needs operations the
// GPU kernels do not have yet (gemma's GELU and post-norms, gpt-oss's
// sinks, glm4moe's dense layers and sigmoid gating, ...): through Fit it
// runs on the CPU with llama.cpp's logits, and straight on the GPU it is
// an error that names what is missing.
func TestVulkanFitArchs(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	for _, c := range enginetest.ArchCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			m := enginetest.OpenPath(t, c.Model)
			if m.Config.Arch.Name == "llama" {
				t.Skip("plain llama: the GPU runs it")
			}
			r := runnerOn(t, m, vulkan.Fit{GPU: g, Rest: cpu.Device{}})
			defer r.Close()
			if _, ok := r.Device().(*cpu.Range); !ok {
				t.Fatalf("%s through Fit runs on a %T", c.Name, r.Device())
			}
			got, err := r.Prompt(0, c.Tokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			mt := enginetest.Compare(c.Logits, got, c.NVocab)
			if err := c.Check(mt, enginetest.IsFloat(m.File)); err != nil {
				t.Error(err)
			}
			_, err = runnerOnErr(m, vulkan.Device{GPU: g})
			t.Logf("%s on the GPU: %v", c.Name, err)
			if err == nil || !strings.Contains(err.Error(), "(") {
				t.Errorf("%s straight on the GPU: %v, want an error naming the missing operation", c.Name, err)
			}
		})
	}
}
