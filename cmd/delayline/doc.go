// Command delayline adds a fixed one-way latency to every IP packet routed
// through it: the latency the benchmarks' emulated links need on a kernel
// without the netem qdisc (this project's test machines have only tbf and
// htb). It is a benchmark tool, not part of shoal.
//
// It opens two TUN devices in its network namespace, reads every packet
// the routing sends into the first (--in) and writes it to the second
// (--out) once --delay has passed since it arrived, in arrival order.
// The caller routes the traffic to delay into --in and lets packets coming
// out of --out take the main table (see cmd/shoal/scripts/bench-cluster.sh):
//
//	ip rule add iif HOSTPORT lookup 100
//	ip route add default dev dlin table 100
//
// A packet waits in a timer-driven queue, so the delay is at least --delay
// (the Go timer's overshoot, printed at exit, comes on top); the line's
// own throughput is measured and printed too, since a userspace relay is
// a rate limit of its own.
package main
