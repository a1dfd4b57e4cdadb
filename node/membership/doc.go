// Package membership is a node's gossip membership: the metadata a node
// gossips about itself (Meta, within memberlist's 512-byte limit), the
// memberlist delegate that tracks alive, suspect, failed and left members
// and refuses removed nodes (Gossip, the coordinator's Membership), and
// the memberlist it runs. Gossip carries liveness and hints only: it must
// not decide identity, which comes from certificates (node certifies a
// member by asking it for its Meta over mutual TLS), nor import node: what
// it needs of the agent arrives as funcs and Options.
package membership
