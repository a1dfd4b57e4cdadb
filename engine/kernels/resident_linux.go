package kernels

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentBytes returns n bytes, 64-byte aligned, for a resident matrix.
// Where the kernel gives transparent huge pages on request (the "madvise"
// setting), the untouched allocation is marked for them before the copy
// faults it in, so that the decode kernels' streams cross 2 MB pages instead
// of 4 KB ones (TinyLlama F16 tg32 on one thread of an AMD EPYC, Zen 4,
// four interleaved pairs: 9.5-10.2 tok/s with 4 KB pages, 10.5-10.75 in
// three of the four with huge pages).
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
