//go:build !linux && !darwin

package fingerprint

// memInfo is unknown on this platform.
func memInfo() (total, free uint64) { return 0, 0 }
