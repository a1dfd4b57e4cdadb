package config

import (
	"errors"
	"fmt"
	"net"

	"shoal/coordinator"
	"shoal/hub"
	"shoal/internal/version"
	"shoal/node/identity"
	"shoal/node/links"
)

// Config of an agent. Ports of 0 pick a free port (tests); the CLI fills
// in the defaults.
type Config struct {
	Name            string   `json:"name"`
	DataDir         string   `json:"data_dir"`
	Bind            string   `json:"bind"`      // IP to listen on
	Advertise       string   `json:"advertise"` // IP others reach this node at
	GossipPort      int      `json:"gossip_port"`
	QUICPort        int      `json:"quic_port"`
	HTTPPort        int      `json:"http_port"`
	Join            []string `json:"join"` // QUIC addresses (host or host:port) of agents
	BootstrapExpect int      `json:"bootstrap_expect"`
	Server          bool     `json:"server"`
	Token           string   `json:"token"`
	// HTTPS of the HTTP API: HTTPSAuto ("" too) serves HTTPS unless Bind
	// is a loopback address, HTTPSOn always, HTTPSOff never
	// (--insecure-http).
	HTTPS string `json:"https"`
	// TLSCert and TLSKey are the operator's certificate and key (PEM) for
	// the HTTP API, in place of one the cluster's HTTPS CA signs.
	TLSCert string        `json:"tls_cert"`
	TLSKey  string        `json:"tls_key"`
	Models  []ModelConfig `json:"models"` // models served whole on this machine
	// MemoryLimit caps the memory this node advertises to the planner, in
	// bytes (0: what the machine has free).
	MemoryLimit uint64 `json:"memory_limit"`
	// Serves pins the node to a pool of disaggregated plans: "prefill",
	// "decode", or "" for either (shoal agent --role).
	Serves string `json:"serves,omitempty"`
	// DiskLimit caps the disk the copies of model files this node keeps
	// for the cluster (--replicas) may take, in bytes (0: the free disk).
	DiskLimit uint64 `json:"disk_limit"`
	// Threads is the worker threads of each shard this node runs for a
	// model spread over the cluster (0: all cores).
	Threads int `json:"threads"`
	// Device runs this node's layers: "auto" ("" too: the first Vulkan
	// GPU, else the CPU), "cpu", "vulkan" or "vulkan:N" (shoal agent
	// --device).
	Device string `json:"device"`
	// DrainTimeout bounds how long shoal agent lets requests in flight
	// finish after SIGTERM before it leaves (--drain-timeout).
	DrainTimeout Duration `json:"drain_timeout"`
	// NetTelemetry is where per-peer traffic counts come from: "auto"
	// (eBPF where it loads, else QUIC's own counts), "ebpf" (or fail to
	// start), "quic" ("" too: an in-process agent attaches nothing).
	NetTelemetry string `json:"net_telemetry"`
	// MetricsPublic serves /metrics to anyone who reaches the API
	// (--metrics-public); else it takes a read or admin key.
	MetricsPublic bool   `json:"metrics_public"`
	Version       string `json:"-"`
	// Protocols is the window of protocols the agent speaks (zero: this
	// build's, version.This): tests run an agent as another build.
	Protocols version.Window `json:"-"`
	Tuning    Tuning         `json:"tuning"`
	// Hub is the client for models loaded by hub reference (nil: one
	// from the environment, HF_ENDPOINT and HF_TOKEN).
	Hub *hub.Client `json:"-"`
	// DiskFree reads a folder's free disk (nil: the file system's own
	// count; tests give a node a smaller disk).
	DiskFree func(dir string) (uint64, bool) `json:"-"`
}

// HTTPS modes of Config.HTTPS.
const (
	HTTPSAuto = "auto" // HTTPS unless bound to a loopback address (the default)
	HTTPSOn   = "on"   // HTTPS even on loopback
	HTTPSOff  = "off"  // plain HTTP even on a network address (--insecure-http)
)

// Network telemetry modes (Config.NetTelemetry, shoal agent --net-telemetry).
const (
	NetTelemetryAuto = links.ModeAuto // eBPF where it can be loaded, else quic-go's counts
	NetTelemetryEBPF = links.ModeEBPF // eBPF or fail to start
	NetTelemetryQUIC = links.ModeQUIC // quic-go's counts only (the default of an in-process agent)
)

// HTTPSEnabled reports whether the HTTP API serves HTTPS.
func (c *Config) HTTPSEnabled() bool {
	switch {
	case c.TLSCert != "":
		return true
	case c.HTTPS == HTTPSOn:
		return true
	case c.HTTPS == HTTPSOff:
		return false
	}
	ip := net.ParseIP(c.Bind)
	return ip == nil || !ip.IsLoopback() // no --bind, or 0.0.0.0, is the network
}

// Tuning holds timers. Zero values take LAN defaults; tests shorten them.
type Tuning struct {
	RaftTimeout         Duration `json:"raft_timeout"`         // heartbeat and election timeout
	GossipProbe         Duration `json:"gossip_probe"`         // memberlist probe interval
	ReconcileInterval   Duration `json:"reconcile_interval"`   // leader reconcile timer
	DeadServerGrace     Duration `json:"dead_server_grace"`    // before a failed voter is replaced
	ServerStabilization Duration `json:"server_stabilization"` // before a non-voter is promoted
	ProbeDuration       Duration `json:"probe_duration"`       // each capability measurement
	Remeasure           Duration `json:"remeasure"`            // between background capability measurements (10m; < 0: never)
	JoinTimeout         Duration `json:"join_timeout"`         // give up joining after this
	LinkProbe           Duration `json:"link_probe"`           // between link measurements to peers
	DistStep            Duration `json:"dist_step"`            // bounds a step of a model served across nodes (10s)
	HTTPBody            Duration `json:"http_body"`            // bounds reading an HTTP request's body (1m)
	// SnapshotThreshold is the Raft log entries after which a server
	// snapshots its state (8192), checked every SnapshotInterval (2m, with
	// up to as much again of jitter): an operator who wants small logs, or
	// a test that needs a snapshot soon, lowers them.
	SnapshotThreshold uint64   `json:"snapshot_threshold"`
	SnapshotInterval  Duration `json:"snapshot_interval"`
	// GPUGBps, when set, is the GPU decode rate the node advertises in
	// place of measuring it: for test clusters whose nodes differ in speed
	// by design, not by the host's.
	GPUGBps float64 `json:"gpu_gbps"`
}

// Validate reports the first problem in one line.
func (c *Config) Validate() error {
	if c.Name == "" {
		return errors.New("--name is empty")
	}
	if err := coordinator.CheckNodeName(c.Name); err != nil {
		return fmt.Errorf("--name: %v", err)
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is required: the agent keeps its identity, certificates and Raft log there")
	}
	switch c.NetTelemetry {
	case "", NetTelemetryAuto, NetTelemetryEBPF, NetTelemetryQUIC:
	default:
		return fmt.Errorf("--net-telemetry %q: want auto, ebpf or quic", c.NetTelemetry)
	}
	if c.Bind != "" && net.ParseIP(c.Bind) == nil {
		return fmt.Errorf("--bind %q is not an IP address", c.Bind)
	}
	switch c.Serves {
	case "", "both":
		c.Serves = ""
	case "prefill", "decode":
	default:
		return fmt.Errorf("--role %q: want prefill, decode or both", c.Serves)
	}
	if c.Advertise != "" && net.ParseIP(c.Advertise) == nil {
		return fmt.Errorf("--advertise %q is not an IP address", c.Advertise)
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"--gossip-port", c.GossipPort}, {"--quic-port", c.QUICPort}, {"--http-port", c.HTTPPort}} {
		if p.v < 0 || p.v > 65535 {
			return fmt.Errorf("%s %d is not a port", p.name, p.v)
		}
	}
	switch c.HTTPS {
	case "", HTTPSAuto, HTTPSOn, HTTPSOff:
	default:
		return fmt.Errorf("https %q: want auto, on or off", c.HTTPS)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if c.TLSCert != "" && c.HTTPS == HTTPSOff {
		return errors.New("--tls-cert with --insecure-http: choose one")
	}
	if c.BootstrapExpect < 0 {
		return fmt.Errorf("--bootstrap-expect %d: want a positive number of servers", c.BootstrapExpect)
	}
	if c.BootstrapExpect > 0 && !c.Server {
		return errors.New("--bootstrap-expect needs --server: only servers bootstrap the cluster")
	}
	if c.BootstrapExpect > 1 && c.Token == "" {
		return fmt.Errorf("--bootstrap-expect %d needs --token: servers that bootstrap together must share one secret", c.BootstrapExpect)
	}
	if c.BootstrapExpect > 1 && len(c.Join) == 0 {
		return fmt.Errorf("--bootstrap-expect %d needs --join with the other servers' addresses", c.BootstrapExpect)
	}
	if c.Token != "" && !identity.IsJoinToken(c.Token) && len(c.Token) < 16 {
		return errors.New("--token is too short: a bootstrap secret has at least 16 characters")
	}
	for _, j := range c.Join {
		if _, err := JoinAddr(j); err != nil {
			return err
		}
	}
	names := map[string]bool{}
	for i := range c.Models {
		if err := c.Models[i].Validate(); err != nil {
			return err
		}
		if n := c.Models[i].ServedName(); names[n] {
			return fmt.Errorf("two served models are named %q: give one a different name", n)
		} else {
			names[n] = true
		}
	}
	return nil
}
