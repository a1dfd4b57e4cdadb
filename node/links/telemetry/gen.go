package telemetry

// The eBPF object and its loader are generated and committed (peers_bpfel.go,
// peers_bpfel.o). Regenerating needs clang and llvm-strip; bpf2go's version is
// the cilium/ebpf module version in go.mod (a tool directive there).
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem peers peers bpf/peers.c -- -Wall -Werror -Wno-unused-command-line-argument
