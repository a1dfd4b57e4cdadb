// Package nodeaddr is the form of an address that names the node it must
// reach: ID@host:port. The coordinator resolves Raft servers to it and
// sends calls that carry keys or writes to it; the transport dials
// host:port and opens a stream only if the peer's certificate is that
// ID's, whatever gossip said lives at the address. It parses and
// formats; it must not dial or check anything itself.
package nodeaddr
