package logging

import (
	"fmt"
	"slices"
	"testing"
)

func TestRingKeepsTheLastLinesInOrder(t *testing.T) {
	r := NewRing(3)
	if got := r.Lines(); len(got) != 0 {
		t.Fatalf("empty ring: %q", got)
	}
	_, _ = r.Write([]byte("a\nb\n"))
	if got := r.Lines(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("before wrapping: %q", got)
	}
	for i := range 5 {
		_, _ = fmt.Fprintf(r, "l%d\n", i)
	}
	if got := r.Lines(); !slices.Equal(got, []string{"l2", "l3", "l4"}) {
		t.Fatalf("after wrapping: %q", got)
	}
	if got := r.Lines(); len(got) != 0 {
		t.Fatalf("Lines empties the ring: %q", got)
	}
}
