package grantcache

import (
	"crypto/sha256"
	"sync"
	"time"
)

// Max bounds the answers kept: past it, the stale ones go, then all.
const Max = 4096

// Cache keeps values (what the authority granted) by secret and scope.
// The zero value is ready; Now, when set, is its clock.
type Cache[V any] struct {
	Now func() time.Time

	mu sync.Mutex
	m  map[ID]entry[V]
}

// ID names a secret with a scope.
type ID [sha256.Size]byte

type entry[V any] struct {
	v  V
	at time.Time
}

// IDOf is the ID of secret with scope.
func IDOf(secret, scope string) ID {
	return sha256.Sum256([]byte(scope + "\x00" + secret))
}

// Get returns the value kept for id if it was put within maxAge.
func (c *Cache[V]) Get(id ID, maxAge time.Duration) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[id]
	if !ok || c.clock().Sub(e.at) > maxAge {
		var zero V
		return zero, false
	}
	return e.v, true
}

// Put keeps v for id; stale is the age past which entries may be dropped
// to make room.
func (c *Cache[V]) Put(id ID, v V, stale time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	if c.m == nil {
		c.m = make(map[ID]entry[V])
	}
	if len(c.m) >= Max {
		for k, e := range c.m {
			if now.Sub(e.at) > stale {
				delete(c.m, k)
			}
		}
		if len(c.m) >= Max {
			clear(c.m)
		}
	}
	c.m[id] = entry[V]{v: v, at: now}
}

// Drop forgets id (the authority said no).
func (c *Cache[V]) Drop(id ID) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
}

func (c *Cache[V]) clock() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}
