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
// One locked OS thread does all of it: it waits in ppoll on the input for
// at most the time left until the oldest packet is due (with a 1 µs timer
// slack), reads what arrived and writes what is due, so no packet waits
// for a hand-off between threads. --spin spends the end of each wait
// polling instead of sleeping: a timer's wake-up comes 40-50 µs late on a
// virtual machine, which --spin 60us takes off a ping's round trip
// (205 -> 152-171 µs at 50 µs each way, 22 µs without the line) at the
// cost of the line's core while packets are in flight. The delay is at least --delay (the
// wake-up's overshoot, printed at exit, comes on top); the line's own
// throughput is measured and printed too, since a userspace relay is a
// rate limit of its own.
package main
