package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a persistent set of worker goroutines that split index ranges
// between them. The goroutine calling Run works too (as worker 0), so a Pool
// of n threads starts n-1 goroutines. Run calls must not overlap.
//
// Between jobs a worker polls for the next one (1024 polls, about a
// microsecond) before it sleeps on its channel. Longer spins were measured:
// a 2 ms spin gave no better decode rate (TinyLlama-shaped Q4_0, 2 threads,
// three interleaved runs: 9.5/12.8/11.9 tok/s spinning against
// 11.4/13.0/13.9 without) and burns a core between requests.
//
// Passing a func value that was built once (not a fresh closure per call)
// keeps Run free of allocations.
type Pool struct {
	n       int
	workers []*worker
	done    sync.WaitGroup
	gen     atomic.Uint64 // job generation, bumped by every Run
	closed  atomic.Bool

	fn    func(lo, hi int)
	fnw   func(w, lo, hi int)
	total int
	chunk int
	next  atomic.Int64
}

type worker struct {
	id       int
	sleeping atomic.Bool
	wake     chan struct{}
}

// spinFor is how long an idle worker keeps polling for the next job, past
// its first 1024 polls, before sleeping.
const spinFor = 0

// NewPool starts a pool of n threads (runtime.NumCPU() if n <= 0).
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{n: n}
	for i := 1; i < n; i++ {
		w := &worker{id: i, wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		// The generation is read here, not in the goroutine, so a worker
		// that starts late still takes part in the first job.
		go p.loop(w, p.gen.Load())
	}
	return p
}

// Threads is the pool's size.
func (p *Pool) Threads() int { return p.n }

// Close stops the workers.
func (p *Pool) Close() {
	if p.closed.Swap(true) {
		return
	}
	p.gen.Add(1)
	for _, w := range p.workers {
		close(w.wake)
	}
}

func (p *Pool) loop(w *worker, seen uint64) {
	for {
		g, ok := p.await(w, seen)
		if !ok {
			return
		}
		seen = g
		p.work(w.id)
		p.done.Done()
	}
}

// await returns the next job generation after seen, spinning first and then
// sleeping until Run wakes the worker. It reports false when the pool closes.
func (p *Pool) await(w *worker, seen uint64) (uint64, bool) {
	start := time.Now()
	for i := 0; ; i++ {
		if g := p.gen.Load(); g != seen {
			return g, !p.closed.Load()
		}
		if i&1023 == 1023 && time.Since(start) > spinFor {
			break
		}
	}
	w.sleeping.Store(true)
	if g := p.gen.Load(); g != seen {
		// A job came while we decided to sleep: cancel the sleep, unless
		// Run already claimed us and sent a wake-up, which we consume.
		if !w.sleeping.CompareAndSwap(true, false) {
			if _, ok := <-w.wake; !ok {
				return 0, false
			}
		}
		return g, !p.closed.Load()
	}
	if _, ok := <-w.wake; !ok {
		return 0, false
	}
	return p.gen.Load(), !p.closed.Load()
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
	if len(p.workers) == 0 || n <= grain || p.closed.Load() {
		if fnw != nil {
			fnw(0, 0, n)
		} else {
			fn(0, n)
		}
		return
	}
	// Four chunks per thread balance uneven work without much contention.
	chunk := max(grain, (n+4*p.n-1)/(4*p.n))
	p.fn, p.fnw, p.total, p.chunk = fn, fnw, n, chunk
	p.next.Store(0)
	// Every worker takes part in every job (one with nothing left to do
	// returns at once), so each sees every generation exactly once.
	p.done.Add(len(p.workers))
	p.gen.Add(1)
	for _, w := range p.workers {
		if w.sleeping.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
	p.work(0)
	p.done.Wait()
	p.fn, p.fnw = nil, nil
}
