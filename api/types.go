package api

import (
	"context"
	"time"
)

// Node statuses as the cluster state records them.
const (
	StatusAlive   = "alive"
	StatusSuspect = "suspect"
	StatusFailed  = "failed"
	StatusLeft    = "left"
)

// Roles of a node.
const (
	RoleServer = "server"
	RoleClient = "client"
)

// Token kinds.
const (
	TokenJoin      = "join"
	TokenAdmin     = "admin"
	TokenInference = "inference" // the OpenAI endpoint only, optionally for named models
	TokenRead      = "read"      // status, nodes, models, the dashboard
	TokenBootstrap = "bootstrap" // the secret the bootstrap servers share
)

// Node is one machine of the cluster (GET /v1/nodes).
type Node struct {
	ID           string       `json:"id"`
	Name         string       `json:"name"`
	Role         string       `json:"role"`
	Version      string       `json:"version"`
	Protocol     int          `json:"protocol"` // the newest protocol it speaks (1: a build from before protocols were named)
	Status       string       `json:"status"`   // alive, suspect, failed or left
	Draining     bool         `json:"draining"`
	StatusSince  time.Time    `json:"status_since"`
	RegisteredAt time.Time    `json:"registered_at"`
	Addr         string       `json:"addr"`      // gossip host:port
	RPCAddr      string       `json:"rpc_addr"`  // QUIC host:port
	HTTPAddr     string       `json:"http_addr"` // admin API host:port
	Caps         Capabilities `json:"caps"`
}

// Capabilities a node measured at start.
type Capabilities struct {
	MemTotal uint64  `json:"mem_total"` // bytes
	MemFree  uint64  `json:"mem_free"`  // bytes, at start (after --memory-limit)
	Cores    int     `json:"cores"`
	GFLOPS   float64 `json:"gflops"`   // float32 matmul, all cores
	MemGBps  float64 `json:"mem_gbps"` // memory copy bandwidth
	Accel    string  `json:"accel,omitempty"`
	// The GPU --device chose: its name, the memory layers may take on it,
	// its measured decode rate, and whether that memory is the host's.
	GPU       string  `json:"gpu,omitempty"`
	GPUMem    uint64  `json:"gpu_mem,omitempty"`
	GPUGBps   float64 `json:"gpu_gbps,omitempty"`
	GPUShared bool    `json:"gpu_shared,omitempty"`
	Serves    string  `json:"serves,omitempty"` // pinned pool: prefill, decode, or empty for either
}

// Schedulable reports whether new placements may use the node.
func (n *Node) Schedulable() bool { return n.Status == StatusAlive && !n.Draining }

// Token is a join token or an admin API key (GET /v1/tokens); only a hash
// of the secret is kept.
type Token struct {
	ID          string     `json:"id"`
	Kind        string     `json:"kind"`             // join, admin, inference, read or bootstrap
	Models      []string   `json:"models,omitempty"` // an inference key's models (none: all)
	Role        string     `json:"role,omitempty"`   // a join token's role: client or server
	Description string     `json:"description,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	Revoked     bool       `json:"revoked"`
	RevokedAt   *time.Time `json:"revoked_at,omitempty"`
	RotatedAt   *time.Time `json:"rotated_at,omitempty"` // when the secret last changed
	SecretHash  string     `json:"secret_hash"`          // sha256 of the secret, hex
}

// Valid reports whether the token may be used at time now.
func (t *Token) Valid(now time.Time) bool {
	return !t.Revoked && (t.ExpiresAt == nil || now.Before(*t.ExpiresAt))
}

// Status is the answer of GET /v1/status.
type Status struct {
	Node             string         `json:"node"`      // the answering agent's ID
	NodeName         string         `json:"node_name"` // and name
	Role             string         `json:"role"`
	Leader           string         `json:"leader"` // leader node ID, empty when none
	LeaderName       string         `json:"leader_name"`
	LeaderAddr       string         `json:"leader_addr"`
	Health           string         `json:"health"` // healthy, degraded or no-leader
	FailureTolerance int            `json:"failure_tolerance"`
	Servers          []ServerStatus `json:"servers"`
	Nodes            int            `json:"nodes"`
	NodesAlive       int            `json:"nodes_alive"`
	Index            uint64         `json:"index"`
	// Protocol is the cluster's protocol: the newest every alive node
	// spoke when the leader last recorded it (0 from a server that
	// predates protocols: 1).
	Protocol int `json:"protocol"`
}

// ServerStatus is one Raft server.
type ServerStatus struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
	Status  string `json:"status"`
}

// Member is one entry of the raw gossip view.
type Member struct {
	ID       string       `json:"id"`
	Name     string       `json:"name"`
	Addr     string       `json:"addr"`
	RPCAddr  string       `json:"rpc_addr"`
	Role     string       `json:"role"`
	Status   string       `json:"status"`
	Version  string       `json:"version"`
	Protocol int          `json:"protocol"`
	Caps     Capabilities `json:"caps"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	Kind        string   `json:"kind"` // join (default), admin, inference or read
	Description string   `json:"description,omitempty"`
	TTL         string   `json:"ttl,omitempty"`    // Go duration; empty never expires
	Models      []string `json:"models,omitempty"` // inference keys: the models it may use (none: all)
	Role        string   `json:"role,omitempty"`   // join tokens: client (default) or server
}

// Scope is what an API call asks of its key: admin keys have every scope,
// read keys ScopeRead, inference keys ScopeInference (for their models).
type Scope string

const (
	ScopeAdmin     Scope = "admin"     // the cluster API's writes and its token list
	ScopeRead      Scope = "read"      // the cluster API's reads, the dashboard
	ScopeInference Scope = "inference" // the OpenAI endpoint
)

// NewToken is a freshly created token; Secret is shown only once.
type NewToken struct {
	Token
	Secret string `json:"token"`
}

// Backend is what the node provides to the API.
type Backend interface {
	// Authorize checks that an API key has scope.
	Authorize(ctx context.Context, key string, scope Scope) error
	Status(ctx context.Context) (*Status, error)
	Nodes(ctx context.Context) ([]*Node, error)
	Drain(ctx context.Context, id string, drain bool) error
	RemoveNode(ctx context.Context, id string) error
	// TransferLeader makes a server node the coordinator's Raft leader.
	TransferLeader(ctx context.Context, id string) error
	Members(ctx context.Context) ([]Member, error)
	CreateToken(ctx context.Context, req TokenRequest, ttl time.Duration) (*NewToken, error)
	Tokens(ctx context.Context) ([]*Token, error)
	RevokeToken(ctx context.Context, id string) error
	// RotateToken gives a token a new secret; the old one stops working.
	RotateToken(ctx context.Context, id string) (*NewToken, error)
	ModelBackend
}

// LoadModelRequest is the body of POST /v1/cluster/models.
type LoadModelRequest struct {
	// Path is the GGUF file on the node that loads it: Node (an ID,
	// unique ID prefix or name), or the agent that answers when empty.
	Path string `json:"path"`
	// Hub, instead of Path, is a hub reference (REPO:QUANT or
	// REPO/FILE.gguf, single-file GGUF only) read in place from the hub
	// the loading agent is configured with (HF_ENDPOINT, HF_TOKEN): no
	// node downloads the whole file; each reads its shards' byte ranges
	// from the hub. Revision is the hub revision ("" = main).
	Hub      string `json:"hub,omitempty"`
	Revision string `json:"revision,omitempty"`
	Name     string `json:"name,omitempty"` // default: the file name without .gguf
	Node     string `json:"node,omitempty"`
	// Ctx is the context length per sequence the plan reserves KV cache
	// for (the planner's 4096 when 0); Overhead is memory per node beyond
	// weights and KV (512 MiB when 0).
	Ctx      int    `json:"ctx,omitempty"`
	Overhead uint64 `json:"overhead,omitempty"`
	// MaxSeqs is the number of sequences of Ctx tokens the plan reserves
	// KV cache for and the driver runs at once (1 when 0); Queue is how
	// many requests wait beyond them before the next is answered 429
	// with Retry-After (4 x MaxSeqs when 0).
	MaxSeqs int `json:"max_seqs,omitempty"`
	Queue   int `json:"queue,omitempty"`
	// Lookup, when positive, decodes speculatively by prompt lookup: up
	// to that many tokens a step drafted from the sequence's own context
	// and verified through the plan in one pass (at most 16).
	Lookup int `json:"lookup,omitempty"`
	// Draft is a GGUF file on the same node as Path with the same
	// vocabulary (a smaller model of the family, or a lower-bit file of
	// the same model): the driver's node holds it whole and drafts with
	// it, up to DraftMax tokens a step (coordinator.DefaultDraftMax if
	// 0, at most 16), verified through the plan in one pass. Not with
	// Lookup or Hub.
	Draft    string `json:"draft,omitempty"`
	DraftMax int    `json:"draft_max,omitempty"`
	// PlanPrompt, when positive, plans for prompts of that many tokens:
	// stages balanced for their prefill, the plan chosen by the predicted
	// time to first token plus PlanGen decode steps (placement.Options.Prompt).
	PlanPrompt int `json:"plan_prompt,omitempty"`
	PlanGen    int `json:"plan_gen,omitempty"`
	// Strategy forces the planner's choice: "pipeline" (one node per
	// stage) or "tensor" (one tensor-parallel group); empty or "auto"
	// lets it choose.
	Strategy string `json:"strategy,omitempty"`
	// Disagg says whether prompts are prefilled on a separate pool of
	// nodes that hands the KV cache to the decode pool: "auto" (when
	// operators pinned nodes to prefill with shoal agent --role prefill),
	// "on", or "off" (empty: auto).
	Disagg string `json:"disagg,omitempty"`
	// DisaggFailure is what a request whose prompt's prefill on the
	// prefill pool failed gets: "recompute" (the decode pool prefills it;
	// the default) or "fail" (an error).
	DisaggFailure string `json:"disagg_failure,omitempty"`
	// Wire is how hidden states and tensor-parallel all-reduces travel
	// between the plan's nodes: "f16" (the default: half of f32's bytes,
	// logits within the oracle tolerances), "f32" (exact: a single node's
	// logits bit for bit) or "q8_0" (about a quarter of f32's bytes).
	Wire string `json:"wire,omitempty"`
	// KVType is how every node's KV cache stores K and V: "f16" (the
	// default), "q8_0" (about half the memory: 1.88x the context in the
	// same room) or "q4_0" (about a quarter), as llama.cpp's
	// --cache-type-k/-v. Quantized caches need heads of a multiple of 32
	// values, and run on the CPU of a node with a GPU for now.
	KVType string `json:"kv_type,omitempty"`
	// Replicas is how many live nodes should have the whole file: the
	// node that loads it and Replicas-1 nodes that copy it in the
	// background once it is hashed, when they have the disk (2 when 0;
	// 1: the loading node only).
	Replicas int `json:"replicas,omitempty"`
	// Nodes, when set, are the nodes (names or IDs) the model runs on:
	// the plan uses every one of them and no other (a pipeline stage each,
	// or one tensor-parallel group with Strategy "tensor"), and the file
	// is not copied elsewhere.
	Nodes []string `json:"nodes,omitempty"`
}

// FileHolder is a node with a model's whole file: the source (the node it
// was loaded on) or a node that copied it (--replicas).
type FileHolder struct {
	Node       string `json:"node"`
	NodeName   string `json:"node_name"`
	NodeStatus string `json:"node_status"` // alive, suspect, failed, left
	Source     bool   `json:"source,omitempty"`
	// State is ready (has the file, verified), copying, no-room (lacks
	// the disk; skipped) or failed (Error says why).
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}
type ModelInfo struct {
	Name string `json:"name"`
	// Status: hashing, planning, loading, verifying (a hub file held by
	// its nodes, being checked), ready, degraded (a shard failed),
	// unservable or failed; Reason explains verifying and the last three.
	Status              string  `json:"status"`
	Reason              string  `json:"reason,omitempty"`
	Path                string  `json:"path"`
	SourceNode          string  `json:"source_node"`
	SourceName          string  `json:"source_name"`
	Digest              string  `json:"digest,omitempty"`
	Bytes               uint64  `json:"bytes"`
	Layers              int     `json:"layers"`
	Ctx                 int     `json:"ctx,omitempty"`
	MaxSeqs             int     `json:"max_seqs,omitempty"`
	Queue               int     `json:"queue,omitempty"`
	PlanVersion         uint64  `json:"plan_version,omitempty"`
	PredictedMsPerToken float64 `json:"predicted_ms_per_token,omitempty"`
	// Fallback: the plan relaxed the load's strategy or exact nodes, and
	// why (PlacementInfo.Fallback).
	Fallback string      `json:"fallback,omitempty"`
	Progress float64     `json:"progress"` // bytes present over bytes needed, 0..1
	Shards   []ShardInfo `json:"shards"`
	// Replicas is how many live nodes should have the whole file; Holders
	// the nodes that have it or are copying it (the source first), and
	// Copies how many of them are alive with the file ready.
	Replicas int          `json:"replicas"`
	Copies   int          `json:"copies"`
	Holders  []FileHolder `json:"holders"`
	// Draft is the model's draft model (model load --draft), if any.
	Draft *DraftInfo `json:"draft,omitempty"`
	// CreatedAt is when the model was registered (loaded) last.
	CreatedAt time.Time `json:"created_at"`
}

// DraftInfo is a model's draft model: its file on the model's source
// node, and its shard on the node that drives the plan (NodeName, State
// as a ShardInfo's: pending until that node reports it).
type DraftInfo struct {
	Path     string `json:"path"`
	Digest   string `json:"digest,omitempty"`
	Bytes    uint64 `json:"bytes"`
	Layers   int    `json:"layers"`
	Max      int    `json:"max"`
	NodeName string `json:"node_name,omitempty"`
	State    string `json:"state,omitempty"`
	Error    string `json:"error,omitempty"`
}

// ShardInfo is one node's part of a model and how far it got.
type ShardInfo struct {
	Node      string  `json:"node"`
	NodeName  string  `json:"node_name"`
	Pool      string  `json:"pool,omitempty"`       // prefill or decode in a disaggregated plan
	GPULayers int     `json:"gpu_layers,omitempty"` // of its layers, how many run on the node's GPU
	Lo        int     `json:"lo"`
	Hi        int     `json:"hi"`
	State     string  `json:"state"` // pending (no report for this plan yet), fetching, ready, failed
	Bytes     uint64  `json:"bytes"`
	Done      uint64  `json:"done"`
	Progress  float64 `json:"progress"`
	Source    string  `json:"source,omitempty"` // "local" or the node the ranges came from
	Fetched   uint64  `json:"fetched,omitempty"`
	Refetched int     `json:"refetched,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// PlacementInfo is the answer of GET /v1/cluster/models/{name}/placement.
type PlacementInfo struct {
	Model    string `json:"model"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	Version  uint64 `json:"version"`
	Strategy string `json:"strategy"`
	Context  int    `json:"context"`
	Batch    int    `json:"batch"` // sequences of Context tokens the plan reserves KV for (max-seqs)
	Queue    int    `json:"queue"` // requests that wait beyond Batch before 429
	// PlanPrompt is the prompt length the plan was made for (model load
	// --plan-prompt), 0 for decode.
	PlanPrompt int    `json:"plan_prompt,omitempty"`
	KVBytes    uint64 `json:"kv_bytes"` // KV reserved over every node
	// KVType is how the cache stores K and V (f16, q8_0, q4_0), and
	// KVBytesPerToken what one token's K and V take over every layer.
	KVType          string           `json:"kv_type"`
	KVBytesPerToken uint64           `json:"kv_bytes_per_token"`
	Cost            Cost             `json:"cost"`
	Stages          []PlacementStage `json:"stages"`
	Nodes           []NodeMemory     `json:"nodes"`
	Links           []Link           `json:"links,omitempty"` // measured links among the plan's nodes and from them to the other live nodes
	Replicas        int              `json:"replicas"`        // live nodes that should have the whole file
	Holders         []FileHolder     `json:"holders"`         // the nodes with the whole file, the source first
	Explain         []string         `json:"explain"`
	Moved           []string         `json:"moved,omitempty"`
	MovedBytes      uint64           `json:"moved_bytes,omitempty"`
	// Fallback, when set, says that the load's options (its strategy or
	// its exact nodes) fit no plan, which constraint failed, and what the
	// plan does instead.
	Fallback string `json:"fallback,omitempty"`
	// Measured is what the driver measures beside the prediction
	// (placement show asks the driver; absent when it could not answer).
	Measured *Measured `json:"measured,omitempty"`
	// Prefill is the predicted prefill of a prompt (placement show
	// --prompt N asks for it).
	Prefill *PrefillPrediction `json:"prefill,omitempty"`
}

// PrefillPrediction is the answer of GET
// /v1/cluster/models/{name}/prefill?tokens=N: the plan's predicted prefill
// of one prompt of N tokens on the nodes' and links' figures now, cut into
// Pieces pieces of Piece tokens that flow through the stages at once (1
// and 0 for a prompt run as one step), beside the same prompt run as one
// step; StageMs is each stage's time for one piece.
type PrefillPrediction struct {
	Model       string    `json:"model"`
	PlanVersion uint64    `json:"plan_version"`
	Tokens      int       `json:"tokens"`
	Piece       int       `json:"piece"`
	Pieces      int       `json:"pieces"`
	Ms          float64   `json:"ms"`
	OneStepMs   float64   `json:"one_step_ms"`
	StageMs     []float64 `json:"stage_ms"`
}

// MaxPrefillTokens bounds the prompt of a prefill prediction.
const MaxPrefillTokens = 1 << 20

// PrefillPredictor predicts a model's prefill (GET
// /v1/cluster/models/{name}/prefill?tokens=N).
type PrefillPredictor interface {
	PredictPrefill(ctx context.Context, model string, tokens int) (*PrefillPrediction, error)
}

// PlacementStage is one pipeline stage of a plan.
type PlacementStage struct {
	Pool    string            `json:"pool"`
	Index   int               `json:"index"`
	Lo      int               `json:"lo"`
	Hi      int               `json:"hi"`
	Ms      float64           `json:"ms"`
	Members []PlacementMember `json:"members"`
}

// Cost is a plan's predicted decode step (see placement.Cost).
type Cost struct {
	MsPerToken   float64 `json:"ms_per_token"`
	ComputeMs    float64 `json:"compute_ms"`
	MemoryMs     float64 `json:"memory_ms"`
	NetworkMs    float64 `json:"network_ms"`
	BottleneckMs float64 `json:"bottleneck_ms"` // the slowest stage
}

// PlacementMember is one node's part of a stage, with the node's name.
type PlacementMember struct {
	Node      string  `json:"node"`
	TPRank    int     `json:"tp_rank"`
	TPSize    int     `json:"tp_size"`
	HeadLo    int     `json:"head_lo"`
	HeadHi    int     `json:"head_hi"`
	FFNLo     int     `json:"ffn_lo"`
	FFNHi     int     `json:"ffn_hi"`
	Experts   []int   `json:"experts,omitempty"`
	Embedding bool    `json:"embedding,omitempty"`  // holds the token embedding
	Output    bool    `json:"output,omitempty"`     // holds the output head, computes logits
	MemBytes  uint64  `json:"mem_bytes"`            // predicted: weights + KV + overhead
	KVBytes   uint64  `json:"kv_bytes"`             // of MemBytes, the KV cache reserved
	Ms        float64 `json:"ms"`                   // predicted time of one decode step
	GPULayers int     `json:"gpu_layers,omitempty"` // of the member's layers, how many, from its first, run on its node's GPU
	NodeName  string  `json:"node_name"`
}

// Link is a measured one-way link, by node name: Gbit and LatencyMs are
// what the planner uses; the rest says where they come from.
type Link struct {
	From      string  `json:"from"`
	To        string  `json:"to"`
	Gbit      float64 `json:"gbit"`
	LatencyMs float64 `json:"latency_ms"`
	ProbeGbit float64 `json:"probe_gbit,omitempty"` // the last active probe
	LiveGbit  float64 `json:"live_gbit,omitempty"`  // the most real traffic achieved since
	// DirectGbit is what a direct link (TCP, a tensor-parallel group's
	// all-reduces) achieved: the planner's all-reduce bandwidth when set.
	DirectGbit float64 `json:"direct_gbit,omitempty"`
	RTTMs      float64 `json:"rtt_ms,omitempty"`    // QUIC's smoothed round trip
	Source     string  `json:"source,omitempty"`    // probe or traffic: which set Gbit
	Iface      string  `json:"iface,omitempty"`     // the interface From reaches To through
	Telemetry  string  `json:"telemetry,omitempty"` // ebpf-tcx, ebpf-tc or quic
	TxBytes    uint64  `json:"tx_bytes,omitempty"`  // From sent To since From started
	RxBytes    uint64  `json:"rx_bytes,omitempty"`
	AgeSec     float64 `json:"age_s"` // since it was measured
}

// NodeMemory is a node's predicted memory use under a plan.
type NodeMemory struct {
	Node     string `json:"node"`
	Name     string `json:"name"`
	Status   string `json:"status"`
	MemBytes uint64 `json:"mem_bytes"` // weights + KV + overhead the plan gives it
	KVBytes  uint64 `json:"kv_bytes"`  // of MemBytes, the KV cache reserved
	MemFree  uint64 `json:"mem_free"`  // what the node advertises (after --memory-limit)
}

// ModelBackend is the model part of the admin API.
type ModelBackend interface {
	LoadModel(ctx context.Context, req LoadModelRequest) (*ModelInfo, error)
	Models(ctx context.Context) ([]ModelInfo, error)
	UnloadModel(ctx context.Context, name string) error
	Placement(ctx context.Context, name string) (*PlacementInfo, error)
}

// LogitsRequest is the body of POST /v1/cluster/models/{name}/logits: token
// ids evaluated as one prompt (positions 0..n-1, one batch).
type LogitsRequest struct {
	Tokens []int32 `json:"tokens"`
}

// Logits is the answer: NTokens rows of NVocab raw logits, row i the
// logits after token i. Over HTTP the rows travel as little-endian float32
// (application/octet-stream) with the shape in the X-Shoal-Tokens and
// X-Shoal-Vocab headers.
type Logits struct {
	NTokens int
	NVocab  int
	Data    []float32
}

// BenchRequest is the body of POST /v1/cluster/models/{name}/bench: as
// `shoal bench`, prompt sizes (ppN) and generation lengths (tgN), each
// measured Reps times after one warm-up.
type BenchRequest struct {
	Prompt []int `json:"prompt"`
	Gen    []int `json:"gen"`
	Reps   int   `json:"reps"`
}

// BenchRow is one test of a cluster benchmark.
type BenchRow struct {
	Test      string    `json:"test"` // "pp64", "tg64"
	TokPerSec float64   `json:"tok_per_sec"`
	StdDev    float64   `json:"stddev"`
	Samples   []float64 `json:"samples"`
	// MsPerToken is 1000 / TokPerSec; BytesPerToken the payload the
	// plan's nodes sent per token over the measured runs (hidden states,
	// collectives, logits and step control, frame overhead excluded).
	MsPerToken    float64 `json:"ms_per_token"`
	BytesPerToken float64 `json:"bytes_per_token"`
	// ComputeMs is the compute per token on the plan's critical path
	// (each stage's slowest member, its waits for input and inside
	// collectives excluded); MsPerToken less it is the network, the waits
	// and the driver.
	ComputeMs float64 `json:"compute_ms"`
	// PredictedMsPerToken is the plan's prediction for the row: for ppN
	// the predicted prefill of N tokens (placement.PredictPrefill) over N,
	// for tgN the decode step of one sequence (absent when none).
	PredictedMsPerToken float64 `json:"predicted_ms_per_token,omitempty"`
}

// BenchResult is the answer of a cluster benchmark, run on the model's
// driver through the committed plan.
type BenchResult struct {
	Model       string   `json:"model"`
	PlanVersion uint64   `json:"plan_version"`
	Strategy    string   `json:"strategy"`
	Nodes       int      `json:"nodes"`
	Stages      []string `json:"stages"` // "[0,11) node-a", "[11,22) node-b+node-c (tp)"
	Driver      string   `json:"driver"`
	Activations string   `json:"activations"` // wire dtype of hidden states
	// PredictedMsPerToken is the plan's decode step of one sequence (as
	// the tg rows run) on the nodes' and links' figures now.
	PredictedMsPerToken float64    `json:"predicted_ms_per_token"`
	Results             []BenchRow `json:"results"`
}

// ClusterRunner is what the driver of a distributed model runs for the
// admin API: logits and benchmarks through the cluster. Requests reach the
// model's driver (the node forwards them).
type ClusterRunner interface {
	ClusterLogits(ctx context.Context, model string, tokens []int32) (*Logits, error)
	ClusterBench(ctx context.Context, model string, req BenchRequest) (*BenchResult, error)
	// ClusterMeasured is what the model's driver measures of its decode
	// steps, beside its plan's prediction.
	ClusterMeasured(ctx context.Context, model string) (*Measured, error)
}

// Measured is the decode time a model's driver measures, beside the
// prediction of the plan it serves: the check of the planner's figures
// (a prediction off by more than OffBy is logged by the driver and shown
// by placement show).
type Measured struct {
	Model       string `json:"model"`
	Driver      string `json:"driver"` // the driving node's name
	PlanVersion uint64 `json:"plan_version"`
	// PredictedMsPerToken is the plan's decode step of one sequence, on
	// the nodes' and links' figures now (the plan's own cost is for its
	// whole batch, on the figures of when it was made).
	PredictedMsPerToken float64 `json:"predicted_ms_per_token"`
	// MeasuredMsPerToken is a decode step of one sequence, averaged
	// exponentially over DecodeSteps steps (0: none yet).
	MeasuredMsPerToken float64 `json:"measured_ms_per_token"`
	DecodeSteps        uint64  `json:"decode_steps"`
}

// OffBy is the factor between measured and predicted decode time past
// which the prediction is called off.
const OffBy = 2.0

// Off says whether the measurement (of at least 16 steps) is more than
// OffBy from the prediction, either way.
func (m *Measured) Off() bool {
	if m == nil || m.DecodeSteps < 16 || m.MeasuredMsPerToken <= 0 || m.PredictedMsPerToken <= 0 {
		return false
	}
	r := m.MeasuredMsPerToken / m.PredictedMsPerToken
	return r > OffBy || r < 1/OffBy
}
