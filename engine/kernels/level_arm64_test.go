//go:build arm64 && !noasm && gc

package kernels

import "golang.org/x/sys/cpu"

func expectedLevel() string {
	if cpu.ARM64.HasASIMDDP {
		return "neon-dot"
	}
	return "neon"
}
