// Package telemetry owns the per-peer network counters of the cluster's
// traffic: bytes and packets sent to and received from each peer address on
// the agent's QUIC port, measured by eBPF classifiers on the interfaces that
// carry cluster traffic (TCX, or legacy tc clsact on kernels without TCX) or,
// where eBPF is not available (not Linux, no privileges, an old kernel),
// summed from quic-go's own connection statistics. It also tells which
// interface routes to a peer. It measures and reports only: it must not
// decide anything, since the planner and the metrics consume its numbers.
package telemetry
