// Package dist runs one model's plan across nodes: pipeline stages hand
// hidden states to the next stage over activation streams, tensor-parallel
// groups all-reduce through transport collectives, expert-parallel members
// each run their experts; single-node is the degenerate plan.
//
// A Host sits on a node's transport endpoint and serves the members
// (one per shard the node holds) that run there. A Cluster, made on any
// host, drives a plan: it opens a Session on every member, sends each
// numbered step's description (chunks, tokens, requested rows) over RPC,
// and receives the logits from the member that holds the output. Hidden
// states travel member to member over the activation mailbox; the driver
// never relays them. Every wait is bounded by the session's timeout; a
// failed step makes the session unusable on every member, not the hosts.
package dist
