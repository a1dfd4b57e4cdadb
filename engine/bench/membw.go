package bench

import (
	"sync"
	"time"
)

// MemBandwidth measures a STREAM-style triad (a[i] = b[i] + s·c[i]) over
// float64 arrays of arrayMB megabytes each, far larger than any cache, with
// the given number of threads. It returns the best of reps runs in bytes per
// second, counting 24 bytes per element as STREAM does.
func MemBandwidth(threads, arrayMB, reps int) float64 {
	if threads < 1 {
		threads = 1
	}
	n := arrayMB << 20 / 8
	a, b, c := probeArrays(n, threads)
	// One untimed pass first: it faults every page in.
	parallel(threads, n, func(lo, hi int) { triadKernel(a[lo:hi], b[lo:hi], c[lo:hi], 3) })
	best := 0.0
	for r := 0; r < reps; r++ {
		t0 := time.Now()
		parallel(threads, n, func(lo, hi int) { triadKernel(a[lo:hi], b[lo:hi], c[lo:hi], 3) })
		if bw := float64(24*n) / time.Since(t0).Seconds(); bw > best {
			best = bw
		}
	}
	return best
}

// triadKernel is the triad loop: SIMD assembly where the CPU has it (as a
// compiled STREAM does), else Go.
var triadKernel = triadGo

var probe struct {
	sync.Mutex
	a, b, c []float64
}

// probeArrays returns the triad arrays, kept for the life of the process: on
// virtual machines the first touch of fresh memory costs a fault in the
// host, and a probe that paid it on every call would measure that instead
// of the memory's bandwidth.
func probeArrays(n, threads int) (a, b, c []float64) {
	probe.Lock()
	defer probe.Unlock()
	if len(probe.a) != n {
		probe.a, probe.b, probe.c = make([]float64, n), make([]float64, n), make([]float64, n)
		a, b, c := probe.a, probe.b, probe.c
		// Distinct values on every page, so that no layer below can share
		// identical pages between the arrays.
		parallel(threads, n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				a[i], b[i], c[i] = float64(i), 2+float64(i)*1e-9, 0.5-float64(i)*1e-9
			}
		})
	}
	return probe.a, probe.b, probe.c
}

func triadGo(a, b, c []float64, s float64) {
	c = c[:len(a)]
	b = b[:len(a)]
	i := 0
	for ; i+4 <= len(a); i += 4 {
		a[i] = b[i] + s*c[i]
		a[i+1] = b[i+1] + s*c[i+1]
		a[i+2] = b[i+2] + s*c[i+2]
		a[i+3] = b[i+3] + s*c[i+3]
	}
	for ; i < len(a); i++ {
		a[i] = b[i] + s*c[i]
	}
}

func parallel(threads, n int, fn func(lo, hi int)) {
	var wg sync.WaitGroup
	per := (n + threads - 1) / threads
	for t := 0; t < threads; t++ {
		lo, hi := t*per, min(n, (t+1)*per)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}
