package enginetest

import (
	"os"
	"sync"
	"testing"

	"shoal/engine/device/vulkan"
)

var (
	vkOnce sync.Once
	vkGPU  *vulkan.GPU
	vkErr  error
)

// VulkanOrSkip opens Vulkan device 0 once per test binary, or skips where
// Vulkan cannot run; with SHOAL_REQUIRE_VULKAN set (CI, where lavapipe is
// installed) it fails instead, so device tests cannot go unrun unnoticed.
func VulkanOrSkip(t testing.TB) *vulkan.GPU {
	t.Helper()
	vkOnce.Do(func() { vkGPU, vkErr = vulkan.Open(0) })
	if vkErr != nil {
		if os.Getenv("SHOAL_REQUIRE_VULKAN") != "" {
			t.Fatalf("SHOAL_REQUIRE_VULKAN is set and Vulkan cannot run: %v", vkErr)
		}
		t.Skipf("no Vulkan here: %v", vkErr)
	}
	return vkGPU
}
