package servetest

import (
	"testing"
	"time"
)

// Wait bounds how long Until waits for the final event.
const Wait = 60 * time.Second

// Until reads ch until an event for which final is true and returns the
// values of the events before it, then that event. The test fails when ch
// closes first or no final event comes within Wait.
func Until[E, V any](t testing.TB, ch <-chan E, final func(E) bool, value func(E) V) ([]V, E) {
	t.Helper()
	var vals []V
	timeout := time.After(Wait)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("events ended without a final event")
			}
			if final(ev) {
				return vals, ev
			}
			vals = append(vals, value(ev))
		case <-timeout:
			t.Fatalf("no final event within %v", Wait)
		}
	}
}
