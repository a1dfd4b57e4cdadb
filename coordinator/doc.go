// Package coordinator owns the cluster's one truth: a Raft group whose FSM
// holds nodes, join tokens, models, placement plans and shard status.
// Commands are a table keyed by a one-byte type; the leader loop reconciles
// gossip membership into the state and manages voters (bootstrap on the
// expected count, promote non-voters to keep an odd voter count, remove
// dead voters after a grace period, rewrite the address of a server that
// came back on a new IP). A server is its node ID: the Raft transport dials
// it where gossip and the state say it is now, the configured address being
// only the fallback.
package coordinator
