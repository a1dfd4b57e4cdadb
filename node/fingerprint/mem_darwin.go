package fingerprint

import "golang.org/x/sys/unix"

// memInfo returns total and free memory in bytes.
func memInfo() (total, free uint64) {
	total, _ = unix.SysctlUint64("hw.memsize")
	pages, err := unix.SysctlUint32("vm.page_free_count")
	if err == nil {
		free = uint64(pages) * uint64(unix.Getpagesize())
	}
	return total, free
}
