package kernels

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Pool is a persistent set of worker goroutines that split index ranges
// between them. The goroutine calling Run works too (as worker 0), so a Pool
// of n threads starts n-1 goroutines. Run calls must not overlap.
//
// Between jobs a worker polls for the next one (1024 polls, about a
// microsecond) before it sleeps on its channel, unless the pool is held
// (Hold): then it keeps polling, so the hundreds of short jobs of a model
// step never wait for a wake-up. Holding during a step measured +5-15%
// decode (TinyLlama-shaped Q4_0, 2 threads, three interleaved runs:
// 36.2/37.7/37.3 tok/s held against 31.4/35.9/35.2); a fixed spin after
// every job instead burns a core between requests.
//
// Passing a func value that was built once (not a fresh closure per call)
// keeps Run free of allocations.
//
// A job is over when its chunks are done, not when every worker has looked
// at it: a worker the OS has descheduled while it polled for work holds
// nothing up, and the caller and the running workers take its share. A
// claim names the job it is for (see claim), so a worker that comes back
// late cannot take a chunk of a newer job with the old one's function.
// Before, Run waited for every worker to check in: on a host with more
// busy threads than cores, each of a step's hundreds of jobs waited for a
// descheduled worker's next timeslice. Beside 4 busy loops on 2 cores
// (Zen 4), 2 threads decoded the built-in model at 103-733 tokens/s in three
// runs before and at 2,231-2,434 now (one thread: 2,520-3,724); unloaded
// both decode at about 10,500.
type Pool struct {
	n       int
	crowded bool // fewer Ps than threads: pollers yield at once
	workers []*worker
	gen     atomic.Uint64 // job generation, bumped by every Run
	closed  atomic.Bool
	held    atomic.Int32 // > 0: idle workers keep polling (Hold)

	// claim is the current job's generation (high 32 bits), its number
	// of chunks (next 16) and the next unclaimed chunk (low 16). A
	// worker takes a chunk by compare-and-swap on the whole word, so a
	// claim succeeds only for the job the worker saw start. The fields
	// below are written before the word is published and read only after
	// a successful claim: the job cannot end, and the next one cannot
	// overwrite them, until that chunk is counted in done.
	claim atomic.Uint64
	_     [56]byte     // the workers' claims and the caller's polls of done use separate cache lines
	done  atomic.Int32 // chunks of the current job finished
	_     [60]byte

	fn    func(lo, hi int)
	fnw   func(w, lo, hi int)
	total int
	chunk int
}

// maxChunks bounds a job's chunks to what the claim word counts.
const maxChunks = 1<<16 - 1

func packClaim(gen uint64, chunks, next int) uint64 {
	return gen<<32 | uint64(chunks)<<16 | uint64(next)
}

type worker struct {
	id       int
	sleeping atomic.Bool
	wake     chan struct{}
}

// spinFor is how long an idle worker keeps polling for the next job, past
// its first 1024 polls, before sleeping.
const spinFor = 0

// holdSpinMax bounds the polling of a held pool: a worker that saw no job
// for this long sleeps anyway (a forgotten Release costs a core only
// briefly).
const holdSpinMax = 50 * time.Millisecond

// Hold keeps idle workers polling for the next job instead of sleeping,
// until the matching Release. A model step brackets its hundreds of short
// jobs with it: waking a sleeping worker costs tens of microseconds each
// time, which adds up to a large share of a decode step. Holds nest. A held
// pool keeps its threads' cores busy between jobs, so hold only while jobs
// are coming.
func (p *Pool) Hold() { p.held.Add(1) }

// Release ends a Hold.
func (p *Pool) Release() { p.held.Add(-1) }

// NewPool starts a pool of n threads (runtime.NumCPU() if n <= 0).
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{n: n, crowded: runtime.GOMAXPROCS(0) < n}
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
		p.work(w.id, g)
	}
}

// await returns the next job generation after seen, spinning first and then
// sleeping until Run wakes the worker. It reports false when the pool closes.
func (p *Pool) await(w *worker, seen uint64) (uint64, bool) {
	start := time.Now()
	yielded := time.Duration(0)
	for i := 0; ; i++ {
		if g := p.gen.Load(); g != seen {
			return g, !p.closed.Load()
		}
		if i&1023 == 1023 {
			el := time.Since(start)
			if p.held.Load() <= 0 || el > holdSpinMax {
				if el > spinFor {
					break
				}
			} else if p.crowded || el-yielded > yieldEvery {
				yielded = el
				runtime.Gosched() // let this P's other goroutines run
			}
		}
	}
	for {
		// A swap, not a store: the flag must be visible before the
		// generation is read (Run bumps the generation, then reads the
		// flag). Go's atomics promise that order, but qemu-user running
		// arm64 on an x86 host does not keep a release store (STLR)
		// before a later acquire load (LDAR): this worker then slept on
		// a job Run never woke it for, and a kernel test under
		// QEMU_CPU=cortex-a53 hung for 10 minutes in CI. An atomic
		// read-modify-write is a full barrier there too.
		w.sleeping.Swap(true)
		if g := p.gen.Load(); g != seen {
			// A job came while we decided to sleep: cancel the sleep,
			// unless Run already claimed us and sent a wake-up, which we
			// consume.
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
		if g := p.gen.Load(); g != seen || p.closed.Load() {
			return g, !p.closed.Load()
		}
		// A wake-up for a job this worker already saw: a Run that bumped
		// the generation, was descheduled before waking its workers, and
		// claimed this one after it had looked at the job and gone back
		// to sleep. Sleep again.
	}
}

// work takes and runs chunks of job gen until none is left, or until
// another job has replaced it.
// It counts its chunks in done once it has no more to take.
func (p *Pool) work(w int, gen uint64) {
	ran := int32(0)
	for {
		c := p.claim.Load()
		if uint32(c>>32) != uint32(gen) {
			break
		}
		next, chunks := int(c&0xffff), int(c>>16&0xffff)
		if next >= chunks {
			break
		}
		if !p.claim.CompareAndSwap(c, c+1) {
			continue
		}
		lo := next * p.chunk
		hi := min(lo+p.chunk, p.total)
		if p.fnw != nil {
			p.fnw(w, lo, hi)
		} else {
			p.fn(lo, hi)
		}
		ran++
	}
	if ran > 0 {
		p.done.Add(ran)
	}
}

// finish waits until the job's chunks are all done. It polls rather
// than parks: a parked caller is woken through the scheduler and a futex,
// tens of microseconds on a VM, at each of the hundreds of jobs of a model
// step (TinyLlama-shaped Q4_0 decode on 2 threads spent 3-5% of its time in
// that wake-up path with a WaitGroup here). Past yieldEvery it lets the
// P's other goroutines run now and then; with fewer Ps than threads a
// worker may be waiting for this P, so it yields at every poll.
func (p *Pool) finish(chunks int32) {
	start := time.Now()
	yielded := time.Duration(0)
	for i := 0; p.done.Load() < chunks; i++ {
		if p.crowded {
			runtime.Gosched()
		} else if i&1023 == 1023 {
			if el := time.Since(start); el-yielded > yieldEvery {
				yielded = el
				runtime.Gosched()
			}
		}
	}
}

// yieldEvery is how often a polling worker or caller yields its P when the
// pool has a P per thread (GOMAXPROCS, which Go lowers to a cgroup's CPU
// quota, can be below the pool's size): with fewer, a held worker yields
// every 1024 polls, and the caller at every poll (Qwen-shaped Q8_0 decode
// with GOMAXPROCS=1 and 2 threads lost 27% when both waited 50us instead).
const yieldEvery = 50 * time.Microsecond

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
	chunk := max(grain, (n+4*p.n-1)/(4*p.n), (n+maxChunks-1)/maxChunks)
	chunks := (n + chunk - 1) / chunk
	p.fn, p.fnw, p.total, p.chunk = fn, fnw, n, chunk
	p.done.Store(0)
	// The claim word is published before the generation: a worker that
	// sees the new generation finds its chunks.
	g := p.gen.Load() + 1
	p.claim.Store(packClaim(g, chunks, 0))
	p.gen.Store(g)
	for _, w := range p.workers {
		if w.sleeping.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
	p.work(0, g)
	p.finish(int32(chunks))
	p.fn, p.fnw = nil, nil
}
