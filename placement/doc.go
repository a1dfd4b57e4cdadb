// Package placement decides where a model runs: a pure function (Place)
// from a model profile, node capacities, link measurements and operator
// options to a Plan with its predicted cost, and another (Replan) that,
// given the previous plan too, decides whether to keep it or move. No I/O; the same inputs give
// the same plan (nodes are sorted by ID, no map order leaks, ties break on
// node IDs). Costs are float64, so bit-identical plans are guaranteed on one
// architecture; the Raft leader plans and replicates the result, so
// followers never need to recompute it.
//
// # Plan
//
// A Plan has pools (one "shared" pool today; "prefill" and "decode" pools
// fit the same type), each a pipeline of stages. A stage is a layer range
// [Lo,Hi) run by one node or a tensor-parallel (TP) group; each member has
// a TP rank/size, a range of query heads (whole GQA groups where there are
// enough of them, else parts of a group whose KV head is replicated on each
// member holding part of it, and a whole number of attn_output quant
// blocks), a
// range of FFN columns (on quant-block boundaries: 256 with K-quants, else
// 32) and, for MoE models, a contiguous set of whole experts. Rank 0 of the
// first stage holds the embedding, rank 0 of the last the output.
//
// # Cost model
//
// The predicted time is one decode step: each of Batch sequences advances
// one token through every stage in turn. For a member holding fraction h of
// the heads, f of the FFN columns and x of the experts of layers [lo,hi):
//
//	FLOPs  = Batch × (h·(attn matmuls + 4·n_head·head_dim·Context/2) + f·FFN
//	         + x·n_expert_used·expert + router) + output (rank 0, last stage)
//	read   = h·(attn weights + Batch·Context/2·KV bytes/token) + f·FFN weights
//	         + x·n_expert·P(expert used by the batch)·expert weights + norms
//	         + output weights (rank 0, last stage)
//	member = max(FLOPs ÷ measured GFLOPS, read ÷ measured memory GB/s)
//
// (2 FLOPs per weight element; the KV cache is F16; P = 1−(1−k/n)^Batch.)
// A stage takes its slowest member plus its communication: the hop into the
// stage (one hidden vector per token, Batch × n_embd × 4 bytes, from rank 0
// of the previous stage to each member: max latency + Σ bytes ÷ bandwidth)
// and, for a TP group of g, two ring all-reduces of that vector per layer,
// each 2(g−1) × (message + latency + bytes/g ÷ bandwidth) over the ring's
// slowest link. Every message also costs Options.MessageMs of software time
// (framing, the QUIC stream, waking the receiver; DefaultMessageMs 0.1 ms,
// measured with transport's BenchmarkAllReduce on loopback), which is what
// makes many small all-reduces expensive next to a pipeline's few hops. A
// link with a measured direct bandwidth (Link.DirectGbit: nodes of protocol
// 4, whose all-reduces go over TCP) carries the all-reduces at that
// bandwidth and DirectMessageMs a message instead. The sampled token's return to the first stage adds one latency.
// MsPerToken is the sum over stages; Cost also reports the compute, memory
// and network parts and the slowest stage (the step interval of a full
// pipeline).
//
// Memory admission: a member holds its weights, its share of the KV cache
// for Context × Batch tokens and Options.Overhead, which must stay within
// free memory × (1 − SafetyMargin). Unmeasured nodes get low defaults, and
// unknown links 1 Gbit/s and 1 ms.
//
// # Calibration
//
// The terms are only as good as the numbers the cluster measures (the
// coordinator turns its state into Nodes and a LinkMatrix):
//
//   - compute, FLOPs ÷ GFLOPS: Node.GFLOPS is the agent's start-up probe
//     (node/probe.go: the engine's Q8_0 matmul kernel against 8 activation
//     rows on every core, cached in the data dir), gossiped as a
//     capability;
//   - memory, bytes read ÷ GB/s: Node.MemGBps is the same probe streaming
//     Q8_0 weights far larger than caches through the engine's decode
//     kernel on every core (the rate a decode step reads memory at);
//   - admission: Node.MemFree is free memory at agent start, capped by the
//     agent's --memory-limit;
//   - network, latency and bytes ÷ bandwidth per hop and all-reduce: the
//     link matrix comes from the link probes agents run over the QUIC
//     endpoint (transport.Endpoint.Probe: median ping round trip halved,
//     time to push 1 MiB) and record in the cluster state; a pair not yet
//     probed takes DefaultLink.
//
// Both probes run the engine's own kernels (an earlier float32 loop and a
// buffer copy put predictions 5-9x above measured step times). The
// remaining gaps are measured by `make bench-cluster`, which prints the
// predicted beside the measured ms/token.
//
// # Search
//
// Only alive, non-draining, non-excluded (and, when pinned, pinned) nodes
// are used. Candidates: every node alone; for a node set, the pure pipeline,
// one TP group, groups of nodes whose mutual links are at least as fast as
// each measured bandwidth (so TP groups stay on fast links), and fixed-size
// groups. A group's members are ranked by usable memory (rank 0 holds the
// embedding or output); each arrangement is also tried with the first and
// last stages led by the member that runs those fastest (a GPU node with a
// little less free memory than a CPU node), which wins only when cheaper.
// The set starts as all eligible nodes and drops, one at a time,
// the node whose removal lowers the cost most. For each arrangement, layers
// are split across stages to minimize the slowest stage within memory (a
// bisection on stage time with a greedy fill: uneven counts proportional to
// speed), and within a stage heads, FFN columns and experts are shared so
// members finish together (continuous water-filling with memory caps, then
// whole units by largest remainder, then moves off over-full and slowest
// members). The cheapest feasible arrangement wins; ties go to fewer nodes.
// A forced strategy keeps only pipelines or single TP groups. When nothing
// fits, a FitError says how much memory the model needs and how much the
// eligible nodes offer.
//
// # Re-planning
//
// When nodes join, drain, fail or are measured again, Replan weighs the
// fastest plan, the previous plan (while all its nodes are schedulable) and
// a plan pinned to the previous plan's surviving nodes. Among those within
// ReplanSlack (10%) of the fastest predicted ms/token it keeps the one that
// moves the fewest weight bytes (MovedBytes: per node, the heads, FFN
// columns, experts and replicated tensors it did not hold; the node with
// the file fetches nothing), so a small speed-up never costs a full
// reload. The previous plan is weighed at the cost predicted when it was
// made. The Decision says keep or move (with the moves, one line per node)
// or why the model is unservable (then the previous plan's nodes are
// released). testdata/replan_*.txt show each case.
package placement
