// Package transport owns a node's single QUIC endpoint: one UDP port, mutual
// TLS against the cluster CA, and typed streams. Every stream starts with a
// one-byte Kind so that raft, rpc and later activations, collectives, kv,
// weights and probe traffic share one connection per peer. Messages on a
// stream are length-prefixed frames with a hard maximum size.
//
// The package also holds the cluster PKI (CA, node certificates, CA pinning
// for join tokens) and a raft.StreamLayer over streams of kind KindRaft.
package transport
