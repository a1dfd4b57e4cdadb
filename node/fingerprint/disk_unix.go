//go:build linux || darwin

package fingerprint

import "golang.org/x/sys/unix"

// DiskFree returns the bytes free to an unprivileged user on the file
// system of dir.
func DiskFree(dir string) (uint64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}
