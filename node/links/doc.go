// Package links measures the links from this agent to its peers: probes
// over the QUIC endpoint, the per-peer traffic counters (eBPF classifiers
// in links/telemetry, or QUIC's own counts) and their Prometheus metrics,
// and the estimator (Estimate) that turns probe readings and live counts
// into the LinkStat the planner reads, reporting it through a function the
// agent passes in. It measures and reports only: it must not import node
// (what it needs of the agent arrives in Config) or decide placement.
package links
