package servetest

import (
	"testing"
	"time"
)

// StreamRate runs submit once per benchmark iteration and reads each
// stream to its end, and returns the rate of its tokens after the first:
// n-1 tokens a stream (n generated) over the time from the first event to
// the end. err is an event's error (nil for none); a stream with one fails
// the benchmark.
func StreamRate[E any](b *testing.B, n int, submit func() (<-chan E, error), err func(E) error) float64 {
	b.Helper()
	var d time.Duration
	toks := 0
	for b.Loop() {
		ch, serr := submit()
		if serr != nil {
			b.Fatal(serr)
		}
		var first time.Time
		for ev := range ch {
			if e := err(ev); e != nil {
				b.Fatal(e)
			}
			if first.IsZero() {
				first = time.Now()
			}
		}
		d += time.Since(first)
		toks += n - 1
	}
	return float64(toks) / d.Seconds()
}
