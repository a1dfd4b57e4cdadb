package vulkan

import (
	"os"
	"sync"
	"testing"
)

var (
	testOnce sync.Once
	testGPU  *GPU
	testErr  error
)

// gpuOrSkip opens device 0 once for the package's tests, or skips where
// Vulkan cannot run (fails instead when SHOAL_REQUIRE_VULKAN is set, as in
// CI, so the kernels cannot go untested there unnoticed).
func gpuOrSkip(t testing.TB) *GPU {
	t.Helper()
	testOnce.Do(func() { testGPU, testErr = Open(0) })
	if testErr != nil {
		if os.Getenv("SHOAL_REQUIRE_VULKAN") != "" {
			t.Fatalf("SHOAL_REQUIRE_VULKAN is set and Vulkan cannot run: %v", testErr)
		}
		t.Skipf("no Vulkan here: %v", testErr)
	}
	return testGPU
}
