package placement

import (
	"fmt"
	"math"
)

// Status is a node's health as the cluster state records it.
type Status string

// Node statuses (the same words as the coordinator's).
const (
	StatusAlive   Status = "alive"
	StatusSuspect Status = "suspect"
	StatusFailed  Status = "failed"
	StatusLeft    Status = "left"
)

// Node is one machine as the planner sees it: measured capacities and health.
type Node struct {
	ID       string  `json:"id"`
	Name     string  `json:"name,omitempty"` // shown in Replan's moves (the ID when empty)
	Status   Status  `json:"status"`
	Draining bool    `json:"draining"`
	MemFree  uint64  `json:"mem_free"` // bytes the node can give to models
	GFLOPS   float64 `json:"gflops"`   // measured matmul throughput, all cores
	MemGBps  float64 `json:"mem_gbps"` // measured memory bandwidth
	// GPUMem is the memory the node's GPU offers layers (0: no GPU): a
	// member's layers go there first, the rest stay on the CPU. GPUGBps is
	// the GPU's measured decode rate; GPUShared says the GPU's memory is
	// the host's (counted once, in MemFree).
	GPUMem    uint64  `json:"gpu_mem,omitempty"`
	GPUGBps   float64 `json:"gpu_gbps,omitempty"`
	GPUShared bool    `json:"gpu_shared,omitempty"`
	// Serves is the pool the operator pinned the node to (shoal agent
	// --role): ServesPrefill, ServesDecode, or "" for either.
	Serves string `json:"serves,omitempty"`
}

// Pool pins of a node (Node.Serves).
const (
	ServesPrefill = "prefill"
	ServesDecode  = "decode"
)

// Schedulable reports whether the planner may place anything on n: alive
// and not draining. (A suspect node gets nothing new either.)
func (n *Node) Schedulable() bool { return n.Status == StatusAlive && !n.Draining }

// Defaults for nodes whose capabilities were never measured: low, so an
// unmeasured node is used only when needed.
const (
	DefaultGFLOPS  = 10
	DefaultMemGBps = 5
)

// Link is a measured one-way network path between two nodes.
type Link struct {
	Gbit      float64 `json:"gbit"`       // bandwidth, Gbit/s
	LatencyMs float64 `json:"latency_ms"` // one-way latency
	// DirectGbit is the bandwidth of the direct link (TCP) a tensor-
	// parallel group's all-reduces take between nodes of protocol 4, at
	// DirectMessageMs a message; 0: they go as other messages do.
	DirectGbit float64 `json:"direct_gbit,omitempty"`
}

// DefaultLink is assumed for pairs nobody measured: 1 Gbit/s, 1 ms.
var DefaultLink = Link{Gbit: 1, LatencyMs: 1}

// LinkMatrix holds the links between pairs of nodes. The zero value knows no
// links and answers Default (or DefaultLink) for every pair.
type LinkMatrix struct {
	Default Link
	m       map[[2]string]Link
}

// Set records the link in both directions.
func (lm *LinkMatrix) Set(a, b string, l Link) {
	lm.SetOneWay(a, b, l)
	lm.SetOneWay(b, a, l)
}

// SetOneWay records the link from a to b only.
func (lm *LinkMatrix) SetOneWay(a, b string, l Link) {
	if lm.m == nil {
		lm.m = map[[2]string]Link{}
	}
	lm.m[[2]string{a, b}] = l
}

// Get returns the link from a to b. A node's link to itself is free.
func (lm LinkMatrix) Get(a, b string) Link {
	if a == b {
		return Link{Gbit: math.Inf(1)}
	}
	if l, ok := lm.m[[2]string{a, b}]; ok && l.Gbit > 0 {
		return l
	}
	if lm.Default.Gbit > 0 {
		return lm.Default
	}
	return DefaultLink
}

// Strategy restricts the plans considered.
type Strategy string

// Strategies.
const (
	Auto     Strategy = "auto"     // any mix of pipeline stages and TP groups
	Pipeline Strategy = "pipeline" // every stage is one node
	Tensor   Strategy = "tensor"   // one stage, one TP (and expert) group
)

// Options are the operator's choices.
type Options struct {
	Strategy Strategy // "" is Auto
	// Pin, when non-empty, is the exact set of nodes to use.
	Pin []string
	// Exclude lists nodes never to use.
	Exclude []string
	// Disagg says whether prompts are prefilled on a separate pool of
	// nodes (DisaggAuto if ""): see PlaceDisagg.
	Disagg string
	// Context is the KV cache length per sequence in tokens (4096 if 0);
	// Batch is the number of sequences decoded together (1 if 0).
	Context int
	Batch   int
	// KVType is how the KV cache stores K and V: "" or "f16", "q8_0" or
	// "q4_0" (see KVBytes).
	KVType string
	// SafetyMargin is the fraction of a node's free memory left unused
	// (0.10 if 0; negative for none).
	SafetyMargin float64
	// Overhead is memory per node beyond weights and KV: runtime, scratch,
	// activations (512 MiB if 0).
	Overhead uint64
	// Version is written into the plan (1 if 0); Replan sets it to the
	// previous plan's version + 1.
	Version uint64
	// MessageMs is the software cost of one message between nodes beyond the
	// link's latency and bandwidth: framing, the QUIC stream, waking the
	// receiver (DefaultMessageMs if 0; negative for none).
	MessageMs float64
	// Prompt, when positive, plans for requests with prompts of this many
	// tokens: each arrangement's layers are split so its stages prefill a
	// piece of the prompt in equal time (a decode split gives the last
	// stage fewer layers, for the output matrix a prefill runs for one row
	// only), and arrangements are compared by the predicted time of a
	// request, the prompt's time to first token plus Generate decode steps
	// of one sequence, rather than by ms/token. 0 plans for decode.
	Prompt   int
	Generate int
	// DriverBytes is memory the driver's node (rank 0 of the first stage,
	// which holds the embedding) needs beyond its share of the model, and
	// DriverKVBytesPerToken more for each of Context x Batch positions: a
	// draft model and its KV cache (0: none).
	DriverBytes           uint64
	DriverKVBytesPerToken uint64
}

// Defaults applied by Plan.
const (
	DefaultContext      = 4096
	DefaultSafetyMargin = 0.10
	DefaultOverhead     = 512 << 20
	// DefaultMessageMs is measured: an all-reduce of 2048 floats between two
	// members on loopback takes 114–160 µs (transport's BenchmarkAllReduce)
	// where the link's own latency is about 30 µs.
	DefaultMessageMs = 0.1
	// DirectMessageMs is the software cost of an all-reduce's message over
	// a direct link: 2,048 f16 values between two processes on loopback
	// take 18-32 µs a call (cmd/benchcoll), QUIC 210 µs.
	DirectMessageMs = 0.03
)

func (o Options) normalized() Options {
	if o.Strategy == "" {
		o.Strategy = Auto
	}
	if o.Context <= 0 {
		o.Context = DefaultContext
	}
	if o.Batch <= 0 {
		o.Batch = 1
	}
	switch {
	case o.SafetyMargin == 0:
		o.SafetyMargin = DefaultSafetyMargin
	case o.SafetyMargin < 0:
		o.SafetyMargin = 0
	}
	if o.Overhead == 0 {
		o.Overhead = DefaultOverhead
	}
	if o.Version == 0 {
		o.Version = 1
	}
	if o.KVType == "f16" {
		o.KVType = ""
	}
	switch {
	case o.MessageMs == 0:
		o.MessageMs = DefaultMessageMs
	case o.MessageMs < 0:
		o.MessageMs = 0
	}
	return o
}

// Pool roles. Plans have one shared pool today; disaggregated serving adds
// a prefill and a decode pool, each planned with its own options.
const (
	RoleShared  = "shared"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Plan is where every part of a model runs, with its predicted cost.
type Plan struct {
	Version  uint64   `json:"version"`
	Model    string   `json:"model"`
	Strategy string   `json:"strategy"` // single, pipeline, tensor, hybrid (as chosen)
	Pools    []Pool   `json:"pools"`
	Cost     Cost     `json:"cost"`
	Explain  []string `json:"explain"` // why this plan, in a few lines
	Context  int      `json:"context"` // the options the plan was made for
	Batch    int      `json:"batch"`
	KVType   string   `json:"kv_type,omitempty"` // "" is f16
	// Moved says what Replan changed against the previous plan, one line
	// per node, and MovedBytes how many weight bytes nodes must fetch.
	Moved      []string `json:"moved,omitempty"`
	MovedBytes uint64   `json:"moved_bytes,omitempty"`
	// Fallback is set when the operator's options fit no plan and this
	// one relaxes them (Place).
	Fallback *Fallback `json:"fallback,omitempty"`
}

// Fallback says which of the operator's options a plan relaxed, and why.
type Fallback struct {
	Reason   string   `json:"reason"`             // why the options as given fit no plan
	Strategy Strategy `json:"strategy"`           // the strategy the plan was made with
	Unpinned bool     `json:"unpinned,omitempty"` // the pinned node set was not kept
	Msg      string   `json:"message"`            // the reason and what was done instead, for people
}

// Pool is a pipeline of stages serving one role.
type Pool struct {
	Role   string  `json:"role"`
	Stages []Stage `json:"stages"`
	Cost   Cost    `json:"cost"`
}

// Stage is the contiguous layer range [Lo,Hi) run by its members, one node
// or a tensor-parallel group.
type Stage struct {
	Lo      int      `json:"lo"`
	Hi      int      `json:"hi"`
	Members []Member `json:"members"`
	Ms      float64  `json:"ms"` // predicted time of one decode step in this stage, all-reduces included
}

// Member is one node's part of a stage. Head ranges count query heads in
// whole HeadUnits: GQA groups where the model has enough KV heads, else
// parts of a group whose KV head every member holding part of it
// replicates; FFN ranges count FFN columns (of the dense
// FFN or the shared expert) and fall on quantization block boundaries.
// Experts lists the routed experts the member holds (nil for dense models;
// empty, not nil, for a member of an MoE plan that holds none: that is why
// it has no omitempty, which turned "none" into nil, "all", on its way
// through the Raft log, and two members then held expert 0).
type Member struct {
	Node      string  `json:"node"`
	TPRank    int     `json:"tp_rank"`
	TPSize    int     `json:"tp_size"`
	HeadLo    int     `json:"head_lo"`
	HeadHi    int     `json:"head_hi"`
	FFNLo     int     `json:"ffn_lo"`
	FFNHi     int     `json:"ffn_hi"`
	Experts   []int   `json:"experts"`
	Embedding bool    `json:"embedding,omitempty"` // holds token_embd and embeds the stage's input
	Output    bool    `json:"output,omitempty"`    // holds output_norm and output, computes logits
	MemBytes  uint64  `json:"mem_bytes"`           // predicted: weights + KV + overhead
	KVBytes   uint64  `json:"kv_bytes,omitempty"`  // of MemBytes, the KV cache for Context x Batch tokens of its layers and heads
	Ms        float64 `json:"ms"`                  // predicted compute/memory time of one decode step
	// GPULayers is how many of the member's layers, from its first, its
	// node's GPU holds (the rest run on the node's CPU).
	GPULayers int `json:"gpu_layers,omitempty"`
}

// Cost is a predicted decode step: every sequence of the batch advances
// one token. Each stage takes the larger of its slowest member's compute
// and memory time (they overlap), so MsPerToken = Σ stages max(compute,
// memory) + NetworkMs, and ComputeMs and MemoryMs sum the two sides of that
// maximum over the stages' slowest members.
type Cost struct {
	MsPerToken   float64 `json:"ms_per_token"`
	ComputeMs    float64 `json:"compute_ms"`    // arithmetic: FLOPs ÷ measured GFLOPS
	MemoryMs     float64 `json:"memory_ms"`     // weight and KV reads ÷ measured GB/s
	NetworkMs    float64 `json:"network_ms"`    // hops, all-reduces, the sampled token's return
	BottleneckMs float64 `json:"bottleneck_ms"` // the slowest stage: the step interval when the pipeline is kept full
}

// FitError is returned when no plan fits in memory.
type FitError struct {
	Model  string
	Need   uint64 // weights + KV cache
	Usable uint64 // across the eligible nodes after margin and overhead
	Nodes  int
	Msg    string
}

func (e *FitError) Error() string { return e.Msg }

// GiB formats bytes in GiB with one decimal (in MiB below 1 GiB).
func GiB(b uint64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// KVBytes is the KV cache bytes of a token in a layer with cache type
// kvType, from the F16 figure (ModelProfile.KVBytesPerToken): Q8_0 keeps
// 34 bytes and Q4_0 18 bytes per 32 values, F16 64.
func KVBytes(f16 uint64, kvType string) uint64 {
	switch kvType {
	case "q8_0":
		return f16 * 34 / 64
	case "q4_0":
		return f16 * 18 / 64
	}
	return f16
}
