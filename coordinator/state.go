package coordinator

import (
	"encoding/json"
	"sort"
	"time"

	"shoal/internal/version"
	"shoal/placement"
)

// NodeStatus is a node's health as the leader last reconciled it.
type NodeStatus string

// Node statuses. Draining is a separate flag (a draining node can also fail).
const (
	StatusAlive   NodeStatus = "alive"
	StatusSuspect NodeStatus = "suspect"
	StatusFailed  NodeStatus = "failed"
	StatusLeft    NodeStatus = "left"
)

// Roles of a node.
const (
	RoleServer = "server"
	RoleClient = "client"
)

// Capabilities are measured at agent start and gossiped in node metadata.
type Capabilities struct {
	MemTotal uint64  `json:"mem_total"` // bytes
	MemFree  uint64  `json:"mem_free"`  // bytes, at start
	Cores    int     `json:"cores"`
	GFLOPS   float64 `json:"gflops"`   // float32 matmul, all cores
	MemGBps  float64 `json:"mem_gbps"` // memory copy bandwidth
	Accel    string  `json:"accel,omitempty"`
	// GPU is the GPU --device chose (its name; "" on the CPU), the memory
	// layers may take on it, its decode mat-vec rate measured at start,
	// and whether that memory is the host's (an integrated GPU, or a
	// Vulkan driver on the CPU such as lavapipe).
	GPU       string  `json:"gpu,omitempty"`
	GPUMem    uint64  `json:"gpu_mem,omitempty"`
	GPUGBps   float64 `json:"gpu_gbps,omitempty"`
	GPUShared bool    `json:"gpu_shared,omitempty"`
	// Serves is the pool the operator pinned the node to (shoal agent
	// --role): placement.ServesPrefill, ServesDecode, or "" for either.
	Serves string `json:"serves,omitempty"`
}

// Node is one machine of the cluster.
type Node struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Role     string `json:"role"`
	Addr     string `json:"addr"`      // gossip host:port
	RPCAddr  string `json:"rpc_addr"`  // QUIC host:port
	HTTPAddr string `json:"http_addr"` // admin API host:port
	Version  string `json:"version"`
	// Protocol is the newest protocol the node speaks (absent: 1, a build
	// from before protocol 2); see version.Protocol.
	Protocol     int          `json:"protocol,omitempty"`
	Status       NodeStatus   `json:"status"`
	Draining     bool         `json:"draining"`
	Caps         Capabilities `json:"caps"`
	RegisteredAt time.Time    `json:"registered_at"`
	StatusSince  time.Time    `json:"status_since"`
}

// Schedulable reports whether new placements may use the node. Placement
// reads this flag; a draining node keeps what it has but gets nothing new.
func (n *Node) Schedulable() bool { return n.Status == StatusAlive && !n.Draining }

// Token kinds.
const (
	TokenJoin      = "join"
	TokenAdmin     = "admin"
	TokenInference = "inference" // the OpenAI endpoint only (Models, when set, limits it)
	TokenRead      = "read"      // the cluster API's reads and the dashboard
	TokenBootstrap = "bootstrap" // the secret the bootstrap servers share; ID "bootstrap"
)

// Token is a join token or an admin API key. Only a hash of the secret is
// stored.
type Token struct {
	ID          string     `json:"id"`
	Kind        string     `json:"kind"`
	Models      []string   `json:"models,omitempty"` // an inference key's models (none: all)
	Role        string     `json:"role,omitempty"`   // the role a join token admits: client or server
	SecretHash  string     `json:"secret_hash"`
	Description string     `json:"description,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	Revoked     bool       `json:"revoked"`
	RevokedAt   *time.Time `json:"revoked_at,omitempty"`
	RotatedAt   *time.Time `json:"rotated_at,omitempty"`
}

// Valid reports whether the token may be used at time now.
func (t *Token) Valid(now time.Time) bool {
	return !t.Revoked && (t.ExpiresAt == nil || now.Before(*t.ExpiresAt))
}

// Model is a model the cluster serves.
type Model struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`           // the file's path on SourceNode
	Digest    string    `json:"digest,omitempty"` // hex sha256 of the whole file, once hashed
	Layers    int       `json:"layers,omitempty"`
	Bytes     uint64    `json:"bytes,omitempty"`
	CreatedAt time.Time `json:"created_at"`

	// SourceNode is the ID of the node that has the file and serves its
	// ranges to the others.
	SourceNode string `json:"source_node,omitempty"`
	// Manifest is the ID of the file's manifest (shard.Manifest: the sha256
	// of every unit), which lets nodes verify ranges from any holder, so the
	// model stays servable when SourceNode is down.
	Manifest string `json:"manifest,omitempty"`
	// Ctx is the KV cache length per sequence the plan reserves (the
	// planner's default when 0); Overhead the memory per node beyond
	// weights and KV (the planner's default when 0).
	Ctx      int    `json:"ctx,omitempty"`
	Overhead uint64 `json:"overhead,omitempty"`
	// MaxSeqs is the number of sequences the plan reserves Ctx tokens of
	// KV cache for and the driver runs at once (1 when 0); Queue the
	// requests that wait beyond them before the driver answers 429
	// (4 x MaxSeqs when 0).
	MaxSeqs int `json:"max_seqs,omitempty"`
	Queue   int `json:"queue,omitempty"`
	// Lookup, when positive, has the driver decode speculatively by
	// prompt lookup, drafting up to that many tokens a step (verified
	// through the plan in the same step: serve.Options.Lookup).
	Lookup int `json:"lookup,omitempty"`
	// Draft, when set, is a small model of the same vocabulary that the
	// driver's node holds whole and runs to draft the served model's
	// next tokens (model load --draft): the plan verifies them in one
	// step, as with Lookup.
	Draft *DraftFile `json:"draft,omitempty"`
	// PlanPrompt and PlanGen, when PlanPrompt is positive, plan for
	// requests of that many prompt tokens and PlanGen generated ones
	// (placement.Options.Prompt and Generate).
	PlanPrompt int `json:"plan_prompt,omitempty"`
	PlanGen    int `json:"plan_gen,omitempty"`
	// Strategy forces the planner's strategy (placement.Pipeline or
	// placement.Tensor); empty lets it choose.
	Strategy string `json:"strategy,omitempty"`
	// Disagg is placement.Options.Disagg: auto, on or off ("" is auto).
	Disagg string `json:"disagg,omitempty"`
	// DisaggFailure is api.LoadModelRequest.DisaggFailure.
	DisaggFailure string `json:"disagg_failure,omitempty"`
	// Wire is api.LoadModelRequest.Wire.
	Wire string `json:"wire,omitempty"`
	// KVType is api.LoadModelRequest.KVType ("" is f16).
	KVType string `json:"kv_type,omitempty"`
	// Pin, when set, is the exact set of nodes the plan uses: a model
	// given to an agent with --model is pinned to that agent's node.
	Pin []string `json:"pin,omitempty"`
	// Profile is what the planner needs of the file (shapes, bytes and
	// FLOPs per layer), taken by the source node from its GGUF header.
	Profile *placement.ModelProfile `json:"profile,omitempty"`
	// Replicas is how many live nodes should have the whole file: the
	// source and Replicas-1 copies nodes make in the background once the
	// file is hashed (DefaultReplicas when 0; 1: the source only). Holders
	// are the nodes other than the source that copied it, or tried to, by
	// node ID; only ModelHolderType writes them.
	Replicas int                     `json:"replicas,omitempty"`
	Holders  map[string]*ModelHolder `json:"holders,omitempty"`
	// Status is hashing (the source node is computing Digest), failed
	// (the file could not be read), unservable (no plan fits: Reason
	// says why) or planned. Reason explains failed and unservable.
	Status string `json:"status,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Hub, when set, is the hub file the model is read from in place: no
	// node has the file; SourceNode is the node that loaded it (it read
	// the header, and checks the file's sha256 against the hub's once the
	// nodes hold their ranges: see Unverified), and each node reads its
	// shards' ranges from the hub. Digest is the hub's LFS sha256.
	Hub *HubFile `json:"hub,omitempty"`
	// Unverified: Manifest is the table of a hub file that no node has
	// checked yet (shard.Manifest.Unverified). The model is planned and
	// its nodes read their ranges from the hub, held but not run, until
	// SourceNode has read the file back from them in order, checked its
	// sha256 against the hub's and recorded the full manifest; each node
	// then checks its ranges unit by unit.
	Unverified bool `json:"unverified,omitempty"`
}

// DraftFile is a model's draft model: a GGUF file on the model's
// SourceNode, hashed and served like the model's own file. The driver's
// node fetches it whole (its shard is reported under DraftShardModel).
type DraftFile struct {
	Source   string `json:"source"`             // the file's path on SourceNode
	Digest   string `json:"digest,omitempty"`   // hex sha256, once hashed
	Manifest string `json:"manifest,omitempty"` // the file's manifest ID, once hashed
	Bytes    uint64 `json:"bytes"`
	Layers   int    `json:"layers"`
	// KVBytesPerToken is the draft's KV cache per position over all its
	// layers (f16): the driver keeps the served model's context of it.
	KVBytesPerToken uint64 `json:"kv_bytes_per_token"`
	// Max is the most tokens drafted a step (DefaultDraftMax if 0).
	Max int `json:"max,omitempty"`
}

// DefaultDraftMax is the most tokens a draft model proposes a step when
// the model does not say: what the driver's scheduler drafts by default
// (serve.Options.DraftMax), for the API to show.
const DefaultDraftMax = 6

// DraftShardModel names the shard of model's draft in shard reports: no
// model can be called that ('#' is not in a model name).
func DraftShardModel(model string) string { return model + "#draft" }

// Hashed reports whether the draft's file is hashed (it can be fetched).
func (d *DraftFile) Hashed() bool { return d != nil && d.Digest != "" && d.Manifest != "" }

// HubFile is a file of a Hugging Face style hub repository.
type HubFile struct {
	Endpoint string `json:"endpoint,omitempty"` // the hub the loading node used ("" = its default)
	Repo     string `json:"repo"`
	Revision string `json:"revision,omitempty"` // "" = main
	File     string `json:"file"`
	SHA256   string `json:"sha256"` // the hub's LFS sha256 of the file
	Size     int64  `json:"size"`
}

// Model statuses written to the state.
const (
	ModelHashing    = "hashing"
	ModelPlanned    = "planned"
	ModelUnservable = "unservable"
	ModelFailed     = "failed"
)

// DefaultReplicas is the copies of a model file the cluster keeps when
// the model does not say.
const DefaultReplicas = 2

// WantReplicas is the number of live nodes that should have m's whole
// file. A pinned model runs on its pin only, so its file is not copied.
func (m *Model) WantReplicas() int {
	switch {
	case len(m.Pin) > 0:
		return 1
	case m.Replicas > 0:
		return m.Replicas
	}
	return DefaultReplicas
}

// Holder states a node reports about its copy of a model file.
const (
	HolderCopying = "copying" // fetching the file from a node that has it
	HolderReady   = "ready"   // has it, verified against Digest and Manifest; serves it
	HolderNoRoom  = "no-room" // lacks the disk for it; skipped
	HolderFailed  = "failed"  // the copy failed (Error says why); tried again later
)

// ModelHolder is a node's copy of a model's file, for the file with
// sha256 Digest.
type ModelHolder struct {
	Node      string    `json:"node"`
	Digest    string    `json:"digest"`
	State     string    `json:"state"`
	Error     string    `json:"error,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Shard states a node reports.
const (
	ShardFetching = "fetching"
	ShardReady    = "ready"
	ShardFailed   = "failed"
	// ShardVerifying: fetched under an unverified manifest (Model.Unverified).
	ShardVerifying = "verifying"
)

// ShardStatus is what a node reports about a shard it should hold.
type ShardStatus struct {
	Node      string    `json:"node"`
	Model     string    `json:"model"`
	Lo        int       `json:"lo"`
	Hi        int       `json:"hi"`
	State     string    `json:"state"` // fetching, ready, failed
	Bytes     uint64    `json:"bytes"`
	Error     string    `json:"error,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`

	// PlanVersion is the plan the report is about; Done the bytes present
	// (of Bytes); Source "local" when opened from the node's own copy of
	// the file, else the node ID the ranges came from; Fetched the bytes
	// received over the network by this attempt (refetches included).
	PlanVersion uint64 `json:"plan_version,omitempty"`
	Done        uint64 `json:"done,omitempty"`
	Source      string `json:"source,omitempty"`
	Fetched     uint64 `json:"fetched,omitempty"`
	Refetched   int    `json:"refetched,omitempty"`
	// NoRoom: the shard failed for want of disk on the node; the planner
	// leaves the node out of the model's plans for a while (noRoomFor).
	NoRoom bool `json:"no_room,omitempty"`
}

// LinkStat is a measured one-way link between two nodes (a probe from
// From to To over the QUIC endpoint).
type LinkStat struct {
	From       string    `json:"from"`
	To         string    `json:"to"`
	Gbit       float64   `json:"gbit"`
	LatencyMs  float64   `json:"latency_ms"`
	MeasuredAt time.Time `json:"measured_at"`
	// What the reporting node measured and observed: Gbit and LatencyMs
	// above are what the planner uses, from these. Zero or empty when an
	// older agent reported.
	ProbeGbit float64 `json:"probe_gbit,omitempty"` // the last active probe (1 MiB pushed)
	// DirectGbit is what a probe over a direct link (TCP, the path of a
	// tensor-parallel group's collectives between nodes of protocol 4)
	// achieved: the planner's bandwidth for all-reduces. 0: not measured
	// (an older node, or a TCP port it cannot reach).
	DirectGbit float64 `json:"direct_gbit,omitempty"`
	LiveGbit   float64 `json:"live_gbit,omitempty"` // the most real traffic achieved in a window since
	RTTMs      float64 `json:"rtt_ms,omitempty"`    // QUIC's smoothed round trip on the open connection
	Source     string  `json:"source,omitempty"`    // which set Gbit: "probe" or "traffic"
	Iface      string  `json:"iface,omitempty"`     // the interface that routes to the peer
	Telemetry  string  `json:"telemetry,omitempty"` // where byte counts come from: ebpf-tcx, ebpf-tc, quic
	TxBytes    uint64  `json:"tx_bytes,omitempty"`  // sent to the peer since the agent started
	RxBytes    uint64  `json:"rx_bytes,omitempty"`  // received from it
}

// ShardKey is the key of a shard status in State.Shards.
func ShardKey(node, model string) string { return node + "/" + model }

// State is the replicated cluster state.
type State struct {
	Nodes  map[string]*Node           `json:"nodes"`
	Tokens map[string]*Token          `json:"tokens"`
	Models map[string]*Model          `json:"models"`
	Plans  map[string]*placement.Plan `json:"plans"`           // by model name, written by the leader's planner
	Shards map[string]*ShardStatus    `json:"shards"`          // by ShardKey
	Links  map[string]*LinkStat       `json:"links,omitempty"` // by "from>to"
	// PlanInputs is, by model name, the signature of the nodes and model
	// settings its plan was decided on, so that a new leader does not
	// re-plan a model whose inputs did not change (its own view of the
	// links could move a healthy plan's driver, ending its requests).
	PlanInputs map[string]string `json:"plan_inputs,omitempty"`
	// RevokedNodes are the node IDs removed with `shoal node rm`: their
	// certificates are refused on every connection.
	RevokedNodes map[string]time.Time `json:"revoked_nodes,omitempty"`
	// HTTPSCA signs the agents' HTTPS certificates (nil until the first
	// leader creates it).
	HTTPSCA *HTTPSCA `json:"https_ca,omitempty"`
	Index   uint64   `json:"index"` // raft index of the last applied command
	// Protocol is the cluster's protocol: the newest every alive node
	// spoke when the leader last looked (absent: 1). See protocol.go.
	Protocol int `json:"protocol,omitempty"`
	// WrittenBy is the window of the server that wrote the snapshot the
	// state was read from (absent: a build from before protocol 2); only
	// snapshots carry it.
	WrittenBy *version.Window `json:"written_by,omitempty"`
}

// Redacted is a copy of the state for a client node: the tokens without
// their secret hashes, the HTTPS CA without its key.
func (s *State) Redacted() *State {
	out := *s
	if s.HTTPSCA != nil {
		out.HTTPSCA = &HTTPSCA{CertPEM: s.HTTPSCA.CertPEM}
	}
	out.Tokens = make(map[string]*Token, len(s.Tokens))
	for id, t := range s.Tokens {
		c := *t
		c.SecretHash = ""
		out.Tokens[id] = &c
	}
	return &out
}

// NewState returns an empty state.
func NewState() *State {
	return &State{
		Nodes:  map[string]*Node{},
		Tokens: map[string]*Token{},
		Models: map[string]*Model{},
		Plans:  map[string]*placement.Plan{},
		Shards: map[string]*ShardStatus{},
	}
}

// Clone returns a deep copy.
func (s *State) Clone() *State {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // the state is plain data
	}
	c := NewState()
	if err := json.Unmarshal(b, c); err != nil {
		panic(err)
	}
	return c
}

// SortedNodes returns the nodes ordered by name, then ID.
func (s *State) SortedNodes() []*Node {
	out := make([]*Node, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// SortedTokens returns the tokens ordered by creation time.
func (s *State) SortedTokens() []*Token {
	out := make([]*Token, 0, len(s.Tokens))
	for _, t := range s.Tokens {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}
