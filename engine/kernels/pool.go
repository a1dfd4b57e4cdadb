package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Pool is a persistent set of worker goroutines that split index ranges
// between them. The goroutine calling Run works too (as worker 0), so a Pool
// of n threads starts n-1 goroutines. Run calls must not overlap.
//
// Passing a func value that was built once (not a fresh closure per call)
// keeps Run free of allocations.
type Pool struct {
	n     int
	start []chan struct{}
	done  sync.WaitGroup

	fn    func(lo, hi int)
	fnw   func(w, lo, hi int)
	total int
	chunk int
	next  atomic.Int64
}

// NewPool starts a pool of n threads (runtime.NumCPU() if n <= 0).
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{n: n, start: make([]chan struct{}, n-1)}
	for i := range p.start {
		p.start[i] = make(chan struct{}, 1)
		go p.worker(i+1, p.start[i])
	}
	return p
}

// Threads is the pool's size.
func (p *Pool) Threads() int { return p.n }

// Close stops the workers.
func (p *Pool) Close() {
	for _, c := range p.start {
		close(c)
	}
	p.start = nil
}

func (p *Pool) worker(w int, start chan struct{}) {
	for range start {
		p.work(w)
		p.done.Done()
	}
}

func (p *Pool) work(w int) {
	for {
		lo := int(p.next.Add(int64(p.chunk))) - p.chunk
		if lo >= p.total {
			return
		}
		hi := min(lo+p.chunk, p.total)
		if p.fnw != nil {
			p.fnw(w, lo, hi)
		} else {
			p.fn(lo, hi)
		}
	}
}

// Run calls fn on disjoint subranges covering [0,n), at least grain items
// per call, spread over the pool's threads, and returns when all are done.
func (p *Pool) Run(n, grain int, fn func(lo, hi int)) {
	p.run(n, grain, fn, nil)
}

// RunWorker is Run with the index of the calling worker (0..Threads()-1)
// passed to fn, for per-thread scratch space.
func (p *Pool) RunWorker(n, grain int, fn func(w, lo, hi int)) {
	p.run(n, grain, nil, fn)
}

func (p *Pool) run(n, grain int, fn func(lo, hi int), fnw func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	workers := len(p.start)
	if workers == 0 || n <= grain {
		if fnw != nil {
			fnw(0, 0, n)
		} else {
			fn(0, n)
		}
		return
	}
	// Four chunks per thread balance uneven work without much contention.
	chunk := max(grain, (n+4*p.n-1)/(4*p.n))
	used := min(workers, (n+chunk-1)/chunk-1)
	p.fn, p.fnw, p.total, p.chunk = fn, fnw, n, chunk
	p.next.Store(0)
	p.done.Add(used)
	for i := 0; i < used; i++ {
		p.start[i] <- struct{}{}
	}
	p.work(0)
	p.done.Wait()
	p.fn, p.fnw = nil, nil
}
