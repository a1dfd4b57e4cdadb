package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Pool is a persistent set of worker goroutines that split index ranges
// between them. The goroutine calling Run works too, so a Pool of n threads
// starts n-1 workers. Run calls must not overlap.
type Pool struct {
	n     int
	start []chan struct{}
	done  sync.WaitGroup

	fn    func(lo, hi int)
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
		go p.worker(p.start[i])
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

func (p *Pool) worker(start chan struct{}) {
	for range start {
		p.work()
		p.done.Done()
	}
}

func (p *Pool) work() {
	for {
		lo := int(p.next.Add(int64(p.chunk))) - p.chunk
		if lo >= p.total {
			return
		}
		p.fn(lo, min(lo+p.chunk, p.total))
	}
}

// Run calls fn on disjoint subranges covering [0,n), grain items at least per
// call, spread over the pool's threads, and returns when all are done.
func (p *Pool) Run(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	workers := len(p.start)
	if workers == 0 || n <= grain {
		fn(0, n)
		return
	}
	// Four chunks per thread balance uneven work without much contention.
	chunk := max(grain, (n+4*p.n-1)/(4*p.n))
	used := min(workers, (n+chunk-1)/chunk-1)
	p.fn, p.total, p.chunk = fn, n, chunk
	p.next.Store(0)
	p.done.Add(used)
	for i := 0; i < used; i++ {
		p.start[i] <- struct{}{}
	}
	p.work()
	p.done.Wait()
	p.fn = nil
}
