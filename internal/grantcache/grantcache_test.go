package grantcache

import (
	"fmt"
	"testing"
	"time"
)

// TestBounded: a cache full of answers drops the stale ones first, then
// all, and never holds more than Max.
func TestBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := Cache[int]{Now: func() time.Time { return now }}
	for i := range Max {
		c.Put(IDOf(fmt.Sprint(i), "s"), i, time.Minute)
	}
	now = now.Add(2 * time.Minute)
	c.Put(IDOf("fresh", "s"), 1, time.Minute) // the others are stale: they go
	if _, ok := c.Get(IDOf("0", "s"), time.Hour); ok {
		t.Error("a stale answer was kept past Max")
	}
	if v, ok := c.Get(IDOf("fresh", "s"), time.Second); !ok || v != 1 {
		t.Errorf("the fresh answer: %d %v", v, ok)
	}
	if _, ok := c.Get(IDOf("fresh", "other scope"), time.Hour); ok {
		t.Error("an answer for another scope")
	}
	for i := range Max {
		c.Put(IDOf(fmt.Sprint("b", i), "s"), i, time.Hour) // none stale: all go at Max
	}
	if n := len(c.m); n > Max {
		t.Errorf("%d answers kept, Max %d", n, Max)
	}
}
