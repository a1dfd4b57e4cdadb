// Package nodeaddr is the form of an address that names the node it must
// reach: ID@host:port. The coordinator resolves Raft servers to it and
// sends calls that carry keys or writes to it; the transport dials
// host:port and opens a stream only if the peer's certificate is that
// ID's, whatever gossip said lives at the address.
package nodeaddr

import "strings"

// Tag is the address of node id at addr (host:port).
func Tag(id, addr string) string {
	if id == "" {
		return addr
	}
	return id + "@" + addr
}

// Split undoes Tag; a plain host:port has no ID.
func Split(a string) (id, addr string) {
	if i := strings.LastIndexByte(a, '@'); i >= 0 {
		return a[:i], a[i+1:]
	}
	return "", a
}
