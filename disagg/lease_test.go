package disagg

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// releases counts release calls per lease id.
type releases struct {
	mu sync.Mutex
	n  map[uint64]int
}

func (r *releases) fn(id uint64) func() {
	return func() {
		r.mu.Lock()
		r.n[id]++
		r.mu.Unlock()
	}
}

func (r *releases) count(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[id]
}

type ended struct {
	id     uint64
	end    LeaseEnd
	reason string
}

// TestLeasePaths: every way a lease ends releases it exactly once, and
// ending it again does nothing.
func TestLeasePaths(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	rel := &releases{n: map[uint64]int{}}
	var log []ended
	l := NewLeases(LeaseOptions{
		Now:   func() time.Time { return t0 },
		OnEnd: func(id uint64, e LeaseEnd, reason string) { log = append(log, ended{id, e, reason}) },
	})
	for id := uint64(1); id <= 6; id++ {
		if err := l.Hold(id, t0.Add(time.Duration(id)*time.Second), rel.fn(id)); err != nil {
			t.Fatal(err)
		}
	}
	if l.Held() != 6 {
		t.Fatalf("held %d, want 6", l.Held())
	}
	if err := l.Hold(3, t0, rel.fn(3)); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("holding 3 twice: %v", err)
	}
	if err := l.Hold(9, t0, nil); err == nil {
		t.Fatal("a lease without a release function")
	}

	if !l.Ack(1) || l.Ack(1) {
		t.Fatal("ack 1: want true once, then false")
	}
	if !l.Cancel(2, "prefill failed") || l.Cancel(2, "again") || l.Ack(2) {
		t.Fatal("cancel 2: want true once, then false")
	}
	if !l.Extend(4, t0.Add(time.Hour)) || l.Extend(1, t0.Add(time.Hour)) {
		t.Fatal("extend: want true for a held lease, false for an ended one")
	}
	// At t0+3.5s leases 3 (deadline 3 s) expires; 4 was extended; 5 and 6 are not due.
	if n := l.Sweep(t0.Add(3500 * time.Millisecond)); n != 1 {
		t.Fatalf("sweep at 3.5 s ended %d leases, want 1", n)
	}
	if l.Ack(3) {
		t.Fatal("ack after expiry reported the lease held")
	}
	// A deadline equal to now is due.
	if n := l.Sweep(t0.Add(5 * time.Second)); n != 1 {
		t.Fatalf("sweep at 5 s ended %d, want 1 (lease 5)", n)
	}
	if l.Held() != 2 {
		t.Fatalf("held %d, want 2 (4 and 6)", l.Held())
	}
	l.Close()
	l.Close()
	if err := l.Hold(7, t0.Add(time.Hour), rel.fn(7)); !errors.Is(err, ErrLeasesClosed) {
		t.Fatalf("hold after close: %v", err)
	}
	if l.Sweep(t0.Add(24*time.Hour)) != 0 || l.Ack(4) || l.Cancel(6, "x") {
		t.Fatal("a closed table still ended leases")
	}
	for id := uint64(1); id <= 6; id++ {
		if n := rel.count(id); n != 1 {
			t.Errorf("lease %d released %d times, want 1", id, n)
		}
	}
	if n := rel.count(7); n != 0 {
		t.Errorf("refused lease 7 released %d times", n)
	}
	want := []ended{
		{1, LeaseAcked, "acknowledged"},
		{2, LeaseCanceled, "prefill failed"},
		{3, LeaseExpired, "not acknowledged by its deadline (500ms late)"},
		{5, LeaseExpired, "not acknowledged by its deadline (0s late)"},
		{4, LeaseClosed, "lease table closed"},
		{6, LeaseClosed, "lease table closed"},
	}
	if len(log) != len(want) {
		t.Fatalf("ends %v, want %v", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Errorf("end %d: %+v, want %+v", i, log[i], want[i])
		}
	}
	if s := l.Stats(); s != (LeaseStats{Held: 0, Acked: 1, Canceled: 1, Expired: 2, Closed: 2}) {
		t.Fatalf("stats %+v", s)
	}
}

// TestSweepOrder: leases due together are released earliest deadline
// first, and a lease held again under an ended id is a new lease.
func TestSweepOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var order []uint64
	l := NewLeases(LeaseOptions{OnEnd: func(id uint64, _ LeaseEnd, _ string) { order = append(order, id) }})
	for _, c := range []struct {
		id uint64
		at time.Duration
	}{{10, 3}, {11, 1}, {12, 2}, {13, 1}, {14, 9}} {
		if err := l.Hold(c.id, t0.Add(c.at*time.Second), func() {}); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.Sweep(t0.Add(5 * time.Second)); n != 4 {
		t.Fatalf("swept %d, want 4", n)
	}
	if want := []uint64{11, 13, 12, 10}; len(order) != 4 || order[0] != want[0] || order[1] != want[1] || order[2] != want[2] || order[3] != want[3] {
		t.Fatalf("order %v, want %v", order, want)
	}
	if err := l.Hold(11, t0.Add(time.Hour), func() {}); err != nil {
		t.Fatalf("hold an ended id again: %v", err)
	}
	if l.Held() != 2 {
		t.Fatalf("held %d, want 2", l.Held())
	}
}

// TestReleaseMayCallTable: a release function runs outside the lock and
// may use the table (hold the next transfer, read the gauge).
func TestReleaseMayCallTable(t *testing.T) {
	l := NewLeases(LeaseOptions{})
	done := make(chan int, 1)
	if err := l.Hold(1, time.Now().Add(time.Hour), func() {
		if err := l.Hold(2, time.Now().Add(time.Hour), func() {}); err != nil {
			t.Error(err)
		}
		done <- l.Held()
	}); err != nil {
		t.Fatal(err)
	}
	go l.Ack(1)
	select {
	case n := <-done:
		if n != 1 {
			t.Fatalf("held %d inside the release, want 1 (lease 2)", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("release calling the table deadlocked")
	}
}

// TestLeasesRace: acks, cancels, sweeps and a close race over many leases;
// each is released exactly once and the counts add up.
func TestLeasesRace(t *testing.T) {
	const n = 2000
	t0 := time.Unix(0, 0)
	rel := &releases{n: map[uint64]int{}}
	var ends atomic.Int64
	l := NewLeases(LeaseOptions{OnEnd: func(uint64, LeaseEnd, string) { ends.Add(1) }})
	for id := uint64(0); id < n; id++ {
		if err := l.Hold(id, t0.Add(time.Duration(id)*time.Millisecond), rel.fn(id)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, 1))
			for i := 0; i < n; i++ {
				id := rnd.Uint64N(n)
				switch rnd.IntN(3) {
				case 0:
					l.Ack(id)
				case 1:
					l.Cancel(id, "race")
				case 2:
					l.Extend(id, t0.Add(time.Duration(rnd.IntN(n))*time.Millisecond))
				}
			}
		}(uint64(g))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ms := 0; ms < n; ms += 50 {
			l.Sweep(t0.Add(time.Duration(ms) * time.Millisecond))
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.Close()
	}()
	wg.Wait()
	l.Close()
	for id := uint64(0); id < n; id++ {
		if c := rel.count(id); c != 1 {
			t.Fatalf("lease %d released %d times, want 1", id, c)
		}
	}
	s := l.Stats()
	if s.Held != 0 || s.Acked+s.Canceled+s.Expired+s.Closed != n || ends.Load() != n {
		t.Fatalf("stats %+v, %d ends, want %d leases ended once each", s, ends.Load(), n)
	}
}

// TestRunExpires: Run sweeps with the table's clock and stops on Close.
func TestRunExpires(t *testing.T) {
	var now atomic.Int64 // seconds
	l := NewLeases(LeaseOptions{Now: func() time.Time { return time.Unix(now.Load(), 0) }})
	released := make(chan struct{})
	if err := l.Hold(1, time.Unix(10, 0), func() { close(released) }); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		l.Run(context.Background(), time.Millisecond)
		close(stopped)
	}()
	// Before the deadline nothing expires, however often Run sweeps.
	for i := 0; i < 20; i++ {
		l.Sweep(time.Unix(now.Load(), 0))
	}
	if l.Held() != 1 {
		t.Fatal("expired before its deadline")
	}
	now.Store(10)
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not expire a lease past its deadline")
	}
	l.Close()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop on Close")
	}

	ctx, cancel := context.WithCancel(context.Background())
	l2 := NewLeases(LeaseOptions{})
	stopped2 := make(chan struct{})
	go func() {
		l2.Run(ctx, time.Hour)
		close(stopped2)
	}()
	cancel()
	select {
	case <-stopped2:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop when its context ended")
	}
}
