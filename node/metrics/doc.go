// Package metrics is the agent's Prometheus collectors read at scrape
// time: each served model's scheduler (queue, batch, KV blocks, prefix
// cache) and engine across nodes (replays, member step times, remote
// prefills), the KV link's bytes, Raft leadership and gossip members as
// this agent sees them, and the control plane's Raft and memberlist events
// counted through go-metrics. It only reads: what it shows arrives as a
// Source of funcs, so it must not import node nor change what it reads.
package metrics
