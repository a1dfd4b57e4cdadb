//go:build linux

package kernels

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU returns the CPU time the calling OS thread has used.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuBench runs f b.N times on a locked thread and reports the throughput of
// bytes per call over the thread's CPU time as "GB/s-cpu": on a loaded
// machine it shows what the kernel does when it runs.
func cpuBench(b *testing.B, bytes int, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	for b.Loop() {
		f()
	}
	if d := threadCPU() - t0; d > 0 {
		b.ReportMetric(float64(bytes)*float64(b.N)/d.Seconds()/1e9, "GB/s-cpu")
	}
}
