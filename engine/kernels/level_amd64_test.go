//go:build amd64 && !noasm && gc

package kernels

import "golang.org/x/sys/cpu"

func expectedLevel() string {
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI {
		return "avx512"
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		return "avx2"
	}
	return "generic"
}
