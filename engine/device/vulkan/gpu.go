package vulkan

import (
	"embed"
	"fmt"
	"strings"
	"sync"

	"shoal/engine/device/vulkan/vk"
	"shoal/engine/quant"
)

//go:generate bash shaders/gen.sh

//go:embed spv/*.spv
var spv embed.FS

// GPU is one Vulkan device opened for compute, with its kernels built.
// Safe for concurrent use (one submission at a time).
type GPU struct {
	ctx *vk.Context
	// maxBinding is the most bytes one storage binding spans: the device's
	// limit, less in tests that exercise splitting.
	maxBinding uint64

	mu      sync.Mutex
	kernels map[string]*vk.Kernel
}

// wg is the workgroup size of the row kernels (a power of two).
const wg = 64

// Open opens device index (of vk.GPUs) for compute.
func Open(index int) (*GPU, error) {
	c, err := vk.Open(index)
	if err != nil {
		return nil, err
	}
	return &GPU{ctx: c, maxBinding: min(c.GPU.MaxStorageBuffer, 1<<30), kernels: map[string]*vk.Kernel{}}, nil
}

// Allocated is the device memory the GPU's buffers hold, in bytes.
func (g *GPU) Allocated() uint64 { return g.ctx.Allocated() }

// Info is what the driver reports of the device.
func (g *GPU) Info() vk.GPU { return g.ctx.GPU }

// Close frees the device.
func (g *GPU) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range g.kernels {
		k.Free()
	}
	g.kernels = nil
	g.ctx.Close()
}

// kernel returns the pipeline of spv/name.spv, built on first use.
func (g *GPU) kernel(name string, nbind, push int, spec ...uint32) (*vk.Kernel, error) {
	key := fmt.Sprint(name, spec)
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := g.kernels[key]; k != nil {
		return k, nil
	}
	code, err := spv.ReadFile("spv/" + name + ".spv")
	if err != nil {
		return nil, fmt.Errorf("no kernel %s: %w", name, err)
	}
	k, err := g.ctx.NewKernel(name, code, nbind, push, spec)
	if err != nil {
		return nil, err
	}
	g.kernels[key] = k
	return k, nil
}

// matvecFormats are the weight formats with a mat-vec kernel.
var matvecFormats = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_XS}

// Supports reports whether weights of type t run on the device.
func Supports(t quant.Type) bool {
	for _, f := range matvecFormats {
		if f == t {
			return true
		}
	}
	return false
}

func matvecKernel(t quant.Type) string { return "matvec_" + strings.ToLower(t.String()) }
