package parallel

import (
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
