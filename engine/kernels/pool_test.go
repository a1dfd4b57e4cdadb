package kernels

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestPoolCoversRange(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8} {
		p := NewPool(threads)
		for _, n := range []int{0, 1, 5, 17, 1000} {
			for _, grain := range []int{1, 4, 64} {
				hits := make([]int32, n)
				p.Run(n, grain, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						atomic.AddInt32(&hits[i], 1)
					}
				})
				var seen [8]atomic.Bool
				p.RunWorker(n, grain, func(w, lo, hi int) {
					seen[w].Store(true)
					for i := lo; i < hi; i++ {
						atomic.AddInt32(&hits[i], 1)
					}
				})
				for i, h := range hits {
					if h != 2 {
						t.Fatalf("threads %d n %d grain %d: index %d visited %d times", threads, n, grain, i, h)
					}
				}
				for w := threads; w < len(seen); w++ {
					if seen[w].Load() {
						t.Fatalf("worker index %d out of range for %d threads", w, threads)
					}
				}
			}
		}
		p.Close()
	}
}

func TestPoolRunAllocs(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	var sum atomic.Int64
	fn := func(lo, hi int) { sum.Add(int64(hi - lo)) }
	if a := testing.AllocsPerRun(100, func() { p.Run(1000, 1, fn) }); a != 0 {
		t.Fatalf("Run allocates %v times per call", a)
	}
}

// A held pool runs jobs as an unheld one does (its workers poll instead of
// sleeping between them), holds nest, and after the last Release a worker
// goes back to sleep and is woken by the next job.
func TestPoolHold(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	sum := func() int64 {
		var s atomic.Int64
		p.Run(1000, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				s.Add(int64(i))
			}
		})
		return s.Load()
	}
	p.Hold()
	p.Hold()
	for i := 0; i < 100; i++ {
		if got := sum(); got != 999*1000/2 {
			t.Fatalf("held run %d: sum %d", i, got)
		}
	}
	p.Release()
	p.Release()
	time.Sleep(20 * time.Millisecond) // idle workers go to sleep
	if got := sum(); got != 999*1000/2 {
		t.Fatalf("after release: sum %d", got)
	}
}

// With fewer Ps than threads (GOMAXPROCS below the pool's size, as under a
// cgroup CPU quota) the polling caller and workers must hand each other the
// P: held or not, every job completes and covers its range.
func TestPoolCrowded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	p := NewPool(3)
	defer p.Close()
	if !p.crowded {
		t.Fatal("a pool of 3 threads on 1 P is not marked crowded")
	}
	var sum atomic.Int64
	fn := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			sum.Add(int64(i))
		}
	}
	for _, held := range []bool{false, true} {
		if held {
			p.Hold()
		}
		sum.Store(0)
		for k := 0; k < 200; k++ {
			p.Run(1000, 1, fn)
		}
		if got, want := sum.Load(), int64(200*999*1000/2); got != want {
			t.Errorf("held=%v: sum %d, want %d", held, got, want)
		}
		if held {
			p.Release()
		}
	}
}

// TestPoolStaleWake wakes a sleeping worker for a job it has already done,
// as a Run does when it bumps the generation, is descheduled while that
// worker does the job and goes back to sleep, and only then claims it:
// the worker must sleep again, and every later job must still cover its
// range exactly once.
func TestPoolStaleWake(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	w := p.workers[0]
	var sum atomic.Int64
	for round := range 20 {
		p.Run(64, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
		deadline := time.Now().Add(5 * time.Second)
		for !w.sleeping.Load() {
			if time.Now().After(deadline) {
				t.Fatal("the worker never went to sleep")
			}
			time.Sleep(time.Millisecond)
		}
		if w.sleeping.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
		time.Sleep(5 * time.Millisecond)
		if !w.sleeping.Load() {
			t.Fatalf("round %d: the worker stayed awake after a stale wake-up", round)
		}
	}
	if sum.Load() != 20*64 {
		t.Fatalf("covered %d items, want %d", sum.Load(), 20*64)
	}
}

// TestPoolWakeups runs many tiny jobs with pauses that let the workers go
// to sleep between them, so that nearly every job wakes them: a lost
// wake-up would hang the test (qemu-user did lose them while a worker's
// sleep flag was a plain store; see await).
func TestPoolWakeups(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	var done [3]int
	fn := func(w, lo, hi int) { done[w] += hi - lo }
	const runs = 20000
	for i := range runs {
		p.RunWorker(3, 1, fn)
		if i%64 == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	if got := done[0] + done[1] + done[2]; got != 3*runs {
		t.Fatalf("%d items done, want %d", got, 3*runs)
	}
}

// A worker that never looks at a job (descheduled by the OS while it
// polled) does not hold the job up: the caller takes its chunks. Before,
// Run waited for every worker to check in, so on a host with more busy
// threads than cores each job waited out a descheduled worker's
// timeslice; here the worker never runs at all, and Run must still return.
func TestPoolAbsentWorker(t *testing.T) {
	p := &Pool{n: 2}
	w := &worker{id: 1, wake: make(chan struct{}, 1)}
	p.workers = append(p.workers, w) // its goroutine is not started yet
	var sum atomic.Int64
	fn := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			sum.Add(int64(i))
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 10 {
			p.Run(1000, 1, fn)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run waited for a worker that never ran")
	}
	if got, want := sum.Load(), int64(10*999*1000/2); got != want {
		t.Fatalf("sum %d, want %d", got, want)
	}
	// The worker starts late, having seen none of the jobs: it finds
	// nothing to do in the last one, and takes part in the next ones.
	go p.loop(w, 0)
	defer p.Close()
	sum.Store(0)
	for range 100 {
		p.Run(1000, 1, fn)
	}
	if got, want := sum.Load(), int64(100*999*1000/2); got != want {
		t.Fatalf("after the late start: sum %d, want %d", got, want)
	}
}

// A claim is for one job: a worker that comes back with an older job's
// generation while a newer job runs takes none of its chunks (it would run
// them with whatever function and size it read for its own job).
func TestPoolStaleClaim(t *testing.T) {
	p := &Pool{n: 2}
	p.workers = append(p.workers, &worker{id: 1, wake: make(chan struct{}, 1)}) // never started
	hits := make([]int32, 64)
	var stale atomic.Int32
	first := true
	p.Run(64, 1, func(lo, hi int) {})
	old := p.gen.Load()
	p.Run(64, 1, func(lo, hi int) {
		if first {
			first = false
			// Chunks of this job are still unclaimed: a worker late
			// from the previous job must not take them.
			own := p.fn
			p.fn = func(lo, hi int) { stale.Add(1) }
			p.work(1, old)
			p.fn = own
		}
		for i := lo; i < hi; i++ {
			atomic.AddInt32(&hits[i], 1)
		}
	})
	if n := stale.Load(); n != 0 {
		t.Fatalf("a worker with the previous job's generation ran %d chunks of the next", n)
	}
	for i, h := range hits {
		if h != 1 {
			t.Fatalf("index %d visited %d times", i, h)
		}
	}
}
