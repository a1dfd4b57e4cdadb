package node

import (
	"crypto/sha256"
	"net/http"
	"sync"
	"time"

	"shoal/api"
	"shoal/transport"
)

// A client agent holds no token hashes: it asks a server about each API
// key. keyCache keeps the servers' yes for a while, so that a stream of
// requests through a client agent costs one round trip to a server per key
// and keyFresh, not one per request, and so that a client agent cut off
// from every server keeps serving the keys it checked lately (for
// keyStale; Consul's client agents keep ACL tokens the same way). A no is
// not kept: a key just created works at once. The price: a key revoked or
// rotated may still work on a client agent for up to keyFresh.
const (
	keyFresh = 5 * time.Second
	keyStale = time.Minute
	// keyCacheMax bounds the keys kept (a flood of made-up keys is never
	// kept: only keys a server accepted are).
	keyCacheMax = 4096
)

type keyCache struct {
	mu  sync.Mutex
	m   map[[sha256.Size]byte]keyEntry
	now func() time.Time
}

type keyEntry struct {
	g  keyGrant
	at time.Time
}

func keyCacheID(key string, scope api.Scope) [sha256.Size]byte {
	return sha256.Sum256([]byte(string(scope) + "\x00" + key))
}

// get returns the grant kept for id if a server gave it within maxAge.
func (c *keyCache) get(id [sha256.Size]byte, maxAge time.Duration) (keyGrant, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[id]
	if !ok || c.clock().Sub(e.at) > maxAge {
		return keyGrant{}, false
	}
	return e.g, true
}

func (c *keyCache) put(id [sha256.Size]byte, g keyGrant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	if c.m == nil {
		c.m = make(map[[sha256.Size]byte]keyEntry)
	}
	if len(c.m) >= keyCacheMax {
		for k, e := range c.m {
			if now.Sub(e.at) > keyStale {
				delete(c.m, k)
			}
		}
		if len(c.m) >= keyCacheMax {
			clear(c.m)
		}
	}
	c.m[id] = keyEntry{g: g, at: now}
}

func (c *keyCache) drop(id [sha256.Size]byte) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
}

func (c *keyCache) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// refused says whether err is a server's answer that the key does not
// have the scope (as opposed to no server answering).
func refused(err error) bool {
	switch transport.StatusOf(err) {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusBadRequest:
		return true
	}
	return false
}
