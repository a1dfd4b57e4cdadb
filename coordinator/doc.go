// Package coordinator owns the cluster's one truth: a Raft group whose FSM
// holds nodes, join tokens, models, placement plans and shard status.
// Commands are a table keyed by a one-byte type; the leader loop reconciles
// gossip membership into the state and manages voters (bootstrap on the
// expected count, promote non-voters to keep an odd voter count, remove
// dead voters after a grace period).
package coordinator
