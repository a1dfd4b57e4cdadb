// Package fingerprint measures the machine an agent runs on: memory (the
// agent's cgroup limit where lower than the machine's), cores, the GFLOPS
// and memory bandwidth of the engine's own kernels (cached in the data dir),
// what the engine computes on, and the disk space free under a folder. It
// measures and reports only: what the cluster advertises, and what the
// planner does with it, is node's and coordinator's. It must not know the
// cluster (gossip, Raft, the network).
package fingerprint
