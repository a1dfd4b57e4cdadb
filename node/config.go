package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"shoal/coordinator"
	"shoal/hub"
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
	Tuning        Tuning `json:"tuning"`
	// Hub is the client for models loaded by hub reference (nil: one
	// from the environment, HF_ENDPOINT and HF_TOKEN).
	Hub *hub.Client `json:"-"`
}

// Tuning holds timers. Zero values take LAN defaults; tests shorten them.
type Tuning struct {
	RaftTimeout         Duration `json:"raft_timeout"`         // heartbeat and election timeout
	GossipProbe         Duration `json:"gossip_probe"`         // memberlist probe interval
	ReconcileInterval   Duration `json:"reconcile_interval"`   // leader reconcile timer
	DeadServerGrace     Duration `json:"dead_server_grace"`    // before a failed voter is replaced
	ServerStabilization Duration `json:"server_stabilization"` // before a non-voter is promoted
	ProbeDuration       Duration `json:"probe_duration"`       // each capability measurement
	JoinTimeout         Duration `json:"join_timeout"`         // give up joining after this
	LinkProbe           Duration `json:"link_probe"`           // between link measurements to peers
	DistStep            Duration `json:"dist_step"`            // bounds a step of a model served across nodes (10s)
	HTTPBody            Duration `json:"http_body"`            // bounds reading an HTTP request's body (1m)
}

// Duration is a time.Duration written as "500ms" in config files.
type Duration time.Duration

// UnmarshalJSON accepts "1.5s" or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: want e.g. 500ms or 2s", s)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration %s: want e.g. \"500ms\"", b)
	}
	*d = Duration(n)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d Duration) or(def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return time.Duration(d)
}

// LoadConfigFile reads a JSON config file into c; flags applied later win.
func LoadConfigFile(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	// Keys as the flags name them are taken too: sizes as text
	// ("memory_limit": "8GiB"), "role" for serves, "insecure_http".
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("config file %s: %v", path, err)
	}
	if dec.More() {
		return fmt.Errorf("config file %s: more than one JSON object", path)
	}
	for _, k := range []string{"memory_limit", "disk_limit"} {
		var text string
		if v, ok := raw[k]; ok && json.Unmarshal(v, &text) == nil {
			n, err := ParseSize(text)
			if err != nil {
				return fmt.Errorf("config file %s: %s: %v", path, k, err)
			}
			raw[k], _ = json.Marshal(n)
		}
	}
	if v, ok := raw["role"]; ok {
		if _, both := raw["serves"]; both {
			return fmt.Errorf("config file %s: role and serves name the same setting: keep one", path)
		}
		raw["serves"] = v
		delete(raw, "role")
	}
	if v, ok := raw["insecure_http"]; ok {
		var on bool
		if err := json.Unmarshal(v, &on); err != nil {
			return fmt.Errorf("config file %s: insecure_http: want true or false", path)
		}
		if on {
			raw["https"], _ = json.Marshal(HTTPSOff)
		}
		delete(raw, "insecure_http")
	}
	norm, _ := json.Marshal(raw)
	strict := json.NewDecoder(strings.NewReader(string(norm)))
	strict.DisallowUnknownFields()
	if err := strict.Decode(c); err != nil {
		return fmt.Errorf("config file %s: %v", path, err)
	}
	return nil
}

// ParseSize reads a size such as 512MiB, 2GiB, 8GB or a number of bytes.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	units := []struct {
		suffix string
		mult   float64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
		{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size: want e.g. 512MiB or 2GiB", s)
	}
	return uint64(v * mult), nil
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
	if c.Token != "" && !isJoinToken(c.Token) && len(c.Token) < 16 {
		return errors.New("--token is too short: a bootstrap secret has at least 16 characters")
	}
	for _, j := range c.Join {
		if _, err := joinAddr(j); err != nil {
			return err
		}
	}
	names := map[string]bool{}
	for i := range c.Models {
		if err := c.Models[i].validate(); err != nil {
			return err
		}
		if n := c.Models[i].name(); names[n] {
			return fmt.Errorf("two served models are named %q: give one a different name", n)
		} else {
			names[n] = true
		}
	}
	return nil
}

// DefaultName is the name of an agent started without --name: the host
// name made a node name (see nodeName).
func DefaultName() string {
	h, _ := os.Hostname()
	return nodeName(h)
}

// nodeName makes a host name a node name (coordinator.CheckNodeName): a
// name longer than a node name may be is cut to its first label, every
// character a name may not hold becomes '-', leading punctuation goes,
// and what is left is cut to the limit ("node" if nothing is left).
func nodeName(host string) string {
	if len(host) > coordinator.MaxNodeNameLen {
		if i := strings.IndexByte(host, '.'); i > 0 {
			host = host[:i]
		}
	}
	b := []byte(host)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	name := strings.TrimLeft(string(b), "._-")
	if len(name) > coordinator.MaxNodeNameLen {
		name = name[:coordinator.MaxNodeNameLen]
	}
	if name == "" {
		return "node"
	}
	return name
}

// DefaultQUICPort is used for --join addresses without a port.
const DefaultQUICPort = 7947

func joinAddr(s string) (string, error) {
	if s == "" {
		return "", errors.New("--join address is empty")
	}
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s, nil
	}
	if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") { // bare IPv6
		return net.JoinHostPort(s, fmt.Sprint(DefaultQUICPort)), nil
	}
	if strings.Contains(s, ":") {
		return "", fmt.Errorf("--join %q: want host or host:port", s)
	}
	return net.JoinHostPort(s, fmt.Sprint(DefaultQUICPort)), nil
}
