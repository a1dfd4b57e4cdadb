//go:build !linux && !darwin

package node

// memInfo is unknown on this platform.
func memInfo() (total, free uint64) { return 0, 0 }
