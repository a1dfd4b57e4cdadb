// Package version names this build: its release (semantic version), the
// commit it was built from, and the protocol it speaks to other nodes.
//
// The protocol is one number for everything a node of another build reads:
// the QUIC streams (negotiated per connection through ALPN, "shoal/N"), the
// join handshake, the gossiped metadata, the Raft log entries and the
// snapshots. A build speaks Protocol and works with every protocol from
// MinProtocol up to it, so a cluster can hold two adjacent releases at
// once during a rolling upgrade; a node outside that window is refused at
// the connection with both versions named. Protocol 1 is every build from
// before versions were named (they report "dev-<commit>").
package version
