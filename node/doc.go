// Package node is the agent: one long-running process per machine that
// wires the QUIC endpoint (transport), gossip membership (memberlist), the
// Raft coordinator (servers only) and the admin API, probes the machine's
// capabilities and handles secure join.
package node
