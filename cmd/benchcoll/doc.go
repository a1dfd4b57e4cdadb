// Command benchcoll measures a tensor-parallel group's all-reduce between
// processes, each in its own network namespace in the benchmarks (make
// bench-cluster's COLLECTIVES table, over the delay line): one process per
// member, all given the same --members list and secret. For every size in
// --floats it runs the same calls through a group whose collectives stay on
// QUIC and through one that takes direct links (TCP), and rank 0 prints
// the time per call: mean, p50 and p99. It is a benchmark tool, not part
// of shoal.
package main
