//go:build !linux && !darwin

package fingerprint

// DiskFree is unknown on this platform.
func DiskFree(dir string) (uint64, bool) { return 0, false }
