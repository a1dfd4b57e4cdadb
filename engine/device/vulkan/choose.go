package vulkan

import (
	"fmt"
	"strconv"
	"strings"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/device/split"
	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// Fit is a GPU as an engine device that holds what its memory allows: a
// range that does not fit runs its first layers on the GPU and the rest on
// Rest (the CPU), as llama.cpp's -ngl does by hand.
type Fit struct {
	GPU *GPU
	// Rest runs the layers that do not fit; nil: a range must fit whole.
	Rest device.Device
	// Budget is the device memory all ranges on the GPU may take (0: 90%
	// of the device's largest heap).
	Budget uint64
}

// Name implements device.Device.
func (d Fit) Name() string { return Device{GPU: d.GPU}.Name() }

// Load implements device.Device.
func (d Fit) Load(ld device.Load) (device.Range, error) {
	budget := d.Budget
	if budget == 0 {
		budget = d.GPU.Info().Memory / 10 * 9
	}
	used := d.GPU.ctx.Allocated()
	free := uint64(0)
	if budget > used {
		free = budget - used
	}
	k := fitLayers(ld, free)
	if _, ok := unsupported(ld); (ok || lacks(ld) != "") && d.Rest != nil {
		k = 0 // a format or an operation without GPU kernels: the range stays on the CPU
	}
	gpu := Device{GPU: d.GPU}
	switch {
	case k == ld.Hi-ld.Lo:
		return gpu.Load(ld)
	case d.Rest == nil:
		return nil, fmt.Errorf("%s: layers [%d,%d) need more than the %d MiB of device memory free", d.Name(), ld.Lo, ld.Hi, free>>20)
	case k == 0:
		return d.Rest.Load(ld)
	}
	return split.Device{First: gpu, Layers: k, Rest: d.Rest}.Load(ld)
}

// lacks names the first operation ld needs that the GPU kernels do not
// have ("" when none): a quantized KV cache, gemma's GELU, query scale,
// sliding window, second RoPE base and post-norms, gpt-oss's sinks and
// experts, DeepSeek-V3's latent attention, its and GLM-4.5's gating and
// dense layers.
func lacks(ld device.Load) string {
	if t := ld.KV.Type; t != quant.F16 && t != quant.F32 {
		return "a " + t.String() + " KV cache"
	}
	switch sp := &ld.Spec; {
	case sp.MLA != nil:
		return "multi-head latent attention (DeepSeek-V3)"
	case sp.SigmoidGate || sp.ExpertScale != 0:
		return "sigmoid expert gating and scaled expert weights (DeepSeek-V3, GLM-4.5)"
	case sp.OAI:
		return "attention sinks and biased, clamped experts (gpt-oss)"
	case sp.GELU:
		return "a GELU-gated FFN (gemma)"
	case sp.AttnScale != 0:
		return "query scaling (gemma)"
	case sp.Window != 0 || sp.RopeThetaSWA != 0:
		return "sliding-window attention (gemma, gpt-oss)"
	case !sp.Plain():
		return "an operation of this architecture"
	}
	for i := range ld.Layers {
		ly := &ld.Layers[i]
		switch {
		case ly.AttnPostNorm != nil || ly.FFNPostNorm != nil:
			return "post-norms (gemma)"
		case ld.Spec.IsMoE() && ly.Router == nil:
			return "dense layers in a MoE model (DeepSeek-V3, GLM-4.5)"
		case ly.ExpProbsB != nil:
			return "biased expert selection (DeepSeek-V3, GLM-4.5)"
		}
	}
	return ""
}

// unsupported returns the first weight format of ld the GPU has no kernel
// for.
func unsupported(ld device.Load) (quant.Type, bool) {
	ms := []*kernels.Matrix{ld.Output}
	for i := range ld.Layers {
		ly := &ld.Layers[i]
		ms = append(ms, ly.Wq, ly.Wk, ly.Wv, ly.Wo, ly.Gate, ly.Up, ly.Down, ly.Router, ly.ShGate, ly.ShUp, ly.ShDown, ly.ShGateInp)
		for _, e := range ly.Experts {
			ms = append(ms, e.Gate, e.Up, e.Down)
		}
	}
	for _, m := range ms {
		if m != nil && !Supports(m.Type) {
			return m.Type, true
		}
	}
	return 0, false
}

// LayerBytes is the device memory layer i of ld takes: its matrices and
// its KV rows.
func LayerBytes(ld device.Load, i int) uint64 {
	ly := &ld.Layers[i]
	var b uint64
	for _, m := range []*kernels.Matrix{ly.Wq, ly.Wk, ly.Wv, ly.Wo, ly.Gate, ly.Up, ly.Down, ly.Router, ly.ShGate, ly.ShUp, ly.ShDown, ly.ShGateInp} {
		if m != nil {
			b += uint64(m.Rows * m.RowSize)
		}
	}
	for _, e := range ly.Experts {
		for _, m := range []*kernels.Matrix{e.Gate, e.Up, e.Down} {
			if m != nil {
				b += uint64(m.Rows * m.RowSize)
			}
		}
	}
	return b + uint64(4*ld.KV.NumBlocks*ld.KV.BlockSize*ld.KV.KVDim)
}

// fitLayers is how many of ld's layers, from its first, fit in free bytes
// (the output head counted when all do, and a margin for activations).
func fitLayers(ld device.Load, free uint64) int {
	const margin = 64 << 20
	if free < margin {
		return 0
	}
	free -= margin
	var used uint64
	for i := range ld.Layers {
		used += LayerBytes(ld, i)
		if used > free {
			return i
		}
	}
	if ld.Output != nil && used+uint64(ld.Output.Rows*ld.Output.RowSize) > free {
		return len(ld.Layers) - 1
	}
	return len(ld.Layers)
}

// Choose resolves a --device value: "cpu"; "vulkan" or "vulkan:N" (that
// Vulkan device, an error when it cannot run); "auto" or "" (the first
// Vulkan GPU that is not itself a CPU driver such as lavapipe, else the
// CPU). It returns the device and one line saying what was chosen and, on
// the CPU under auto, why no GPU was.
func Choose(spec string) (device.Device, string, error) {
	switch spec = strings.TrimSpace(strings.ToLower(spec)); {
	case spec == "cpu":
		return cpu.Device{}, "cpu", nil
	case spec == "" || spec == "auto":
		gs, err := vk.GPUs()
		if err != nil {
			return cpu.Device{}, fmt.Sprintf("cpu (no Vulkan: %v)", err), nil
		}
		var skipped []string
		for _, g := range gs {
			if g.Type == vk.DeviceCPU {
				skipped = append(skipped, g.Name)
				continue
			}
			d, line, err := open(g.Index)
			if err != nil {
				return cpu.Device{}, fmt.Sprintf("cpu (vulkan:%d %s did not open: %v)", g.Index, g.Name, err), nil
			}
			return d, line, nil
		}
		return cpu.Device{}, fmt.Sprintf("cpu (the only Vulkan devices, %s, run on the CPU; --device vulkan uses them anyway)", strings.Join(skipped, ", ")), nil
	case spec == "vulkan" || strings.HasPrefix(spec, "vulkan:"):
		idx := 0
		if s, ok := strings.CutPrefix(spec, "vulkan:"); ok {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return nil, "", fmt.Errorf("--device %s: the Vulkan device is a number (vulkan:0)", spec)
			}
			idx = n
		}
		return open(idx)
	}
	return nil, "", fmt.Errorf("--device %q: want auto, cpu, vulkan or vulkan:N", spec)
}

// open opens device idx as a Fit device with the CPU for what does not fit.
func open(idx int) (device.Device, string, error) {
	g, err := Open(idx)
	if err != nil {
		return nil, "", fmt.Errorf("vulkan:%d: %w", idx, err)
	}
	i := g.Info()
	return Fit{GPU: g, Rest: cpu.Device{}}, fmt.Sprintf("vulkan:%d %s (%s, %d MiB)", idx, i.Name, i.TypeName(), i.Memory>>20), nil
}
