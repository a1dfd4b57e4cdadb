// Package node is the agent: one long-running process per machine that
// wires the QUIC endpoint (transport), gossip membership (node/membership), the
// Raft coordinator (servers only), the model catalog (catalog: model
// files, copies, loading by path or hub reference), the shard manager
// (shard), the parallel runtime (parallel), the schedulers (serve), the
// request path (gateway) and the HTTP APIs (api), probes the machine's capabilities (node/fingerprint),
// measures the links to its peers (node/links) and wires the node's
// identity and secure join (node/identity: certificates, the join handler,
// HTTPS). It holds no serving logic of its own: a model given with --model
// is registered in the cluster state pinned to this node and served like
// any other.
package node
