package vk

import "testing"

// gpuOrSkip returns the first device, or skips where Vulkan cannot run.
func gpuOrSkip(t testing.TB) GPU {
	t.Helper()
	gs, err := GPUs()
	if err != nil {
		t.Skipf("no Vulkan here: %v", err)
	}
	return gs[0]
}

func TestGPUs(t *testing.T) {
	g := gpuOrSkip(t)
	t.Logf("%d: %s (%s) %d MiB, subgroup %d (arithmetic %v), storage buffers up to %d MiB, shared %d KiB, groups %v",
		g.Index, g.Name, g.TypeName(), g.Memory>>20, g.SubgroupSize, g.SubgroupArithmetic, g.MaxStorageBuffer>>20, g.MaxSharedMemory>>10, g.MaxGroups)
	if g.Name == "" || g.SubgroupSize == 0 || g.MaxStorageBuffer == 0 || g.MaxGroups[0] < 65535 {
		t.Fatalf("implausible properties: %+v", g)
	}
}
