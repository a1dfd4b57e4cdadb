package grammar

import "syscall"

// processCPU returns the process's CPU time in ns (user+system, all threads,
// so it includes GC), letting benchmarks report work independent of other
// load on the machine.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
