package node

import (
	"net/http"
	"time"

	"shoal/transport"
)

// A client agent holds no token hashes: it asks a server about each API
// key, and keeps the servers' yes (admin.keys, internal/grantcache) for
// keyFresh, and for keyStale while no server answers (Consul's client
// agents keep ACL tokens the same way). A no is not kept: a key just
// created works at once. The price: a key revoked or rotated may still
// work on a client agent for up to keyFresh.
const (
	keyFresh = 5 * time.Second
	keyStale = time.Minute
)

// refused says whether err is a server's answer that the key does not
// have the scope (as opposed to no server answering).
func refused(err error) bool {
	switch transport.StatusOf(err) {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusBadRequest:
		return true
	}
	return false
}
