//go:build !linux

package kernels

// residentBytes returns n bytes, 64-byte aligned, for a resident matrix.
func residentBytes(n int) []byte { return alignedBytes(n) }
