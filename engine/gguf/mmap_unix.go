//go:build unix

package gguf

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

func mapFile(fh *os.File, size int64) ([]byte, func() error, error) {
	if size == 0 {
		return []byte{}, func() error { return nil }, nil
	}
	if int64(int(size)) != size {
		return nil, nil, syscall.EFBIG
	}
	b, err := syscall.Mmap(int(fh.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

// DropPages tells the kernel that the mapped file pages wholly inside b are
// not needed: they leave the process's resident set (the file's bytes stay;
// a later read faults them in again). It reports whether it did; b must
// be part of a read-only file mapping (File.Release checks that).
func DropPages(b []byte) bool {
	ps := uintptr(os.Getpagesize())
	if len(b) == 0 {
		return false
	}
	start := uintptrOf(b)
	lo := (start + ps - 1) &^ (ps - 1)
	hi := (start + uintptr(len(b))) &^ (ps - 1)
	if hi <= lo {
		return true
	}
	return unix.Madvise(b[lo-start:hi-start], unix.MADV_DONTNEED) == nil
}
