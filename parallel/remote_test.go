package parallel

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestHandoffChunk sizes handoff chunks by the prefill pool's speed within
// the step timeout.
func TestHandoffChunk(t *testing.T) {
	for _, c := range []struct {
		rate    float64
		timeout time.Duration
		want    int
	}{
		{70, 10 * time.Second, 245},     // 3.5 s of a 10 s step timeout
		{70, 30 * time.Second, 280},     // 4 s
		{1000, 10 * time.Second, 512},   // at most DefaultHandoffChunk
		{5, 10 * time.Second, 32},       // at least minHandoffChunk
		{70, 0, 280},                    // no timeout: 4 s
		{math.NaN(), time.Second, 32},   // a rate that is no number
		{math.Inf(1), time.Second, 512}, // nor this one
	} {
		if got := handoffChunk(c.rate, c.timeout); got != c.want {
			t.Errorf("handoffChunk(%v, %v) = %d, want %d", c.rate, c.timeout, got, c.want)
		}
	}
}

// TestSessionErrDoesNotWaitForAStep: a session's lock is held for a whole
// step, and a prefill pool's handoff step runs for seconds; the decode
// scheduler asks the prefill session whether it is usable before sending a
// prompt there, and stalled every stream until the step ended.
func TestSessionErrDoesNotWaitForAStep(t *testing.T) {
	s := &Session{id: "test"}
	s.mu.Lock() // a step in flight
	got := make(chan error, 1)
	go func() { got <- s.Err() }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("a usable session's Err: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Err waited for the step in flight")
	}
	boom := errors.New("boom")
	s.fail(boom)
	s.mu.Unlock()
	if err := s.Err(); err != boom {
		t.Fatalf("after a failed step Err is %v, want %v", err, boom)
	}
}
