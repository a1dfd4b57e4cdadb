//go:build !linux && !darwin

package node

// diskFree is unknown on this platform.
func diskFree(dir string) (uint64, bool) { return 0, false }
