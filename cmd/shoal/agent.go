package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"shoal/engine/kernels"
	"shoal/node"
)

func agentCmd() *cobra.Command {
	var cfg node.Config
	var configFile string
	var modelPaths []string
	var modelOpts node.ModelConfig
	var memLimit, diskLimit string
	var cpuProfile string
	var batchInvariant bool
	var insecureHTTP bool
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the shoal agent on this machine (one per machine)",
		Long: `Run the long-lived shoal agent. Every machine of the cluster runs one. Agents
find each other by gossip; servers keep the cluster state in Raft. All
node-to-node traffic goes over one QUIC port with mutual TLS.

Three servers that bootstrap together share a secret (at least 16 characters),
which also becomes the admin API key until you create admin keys:

  shoal agent --server --bootstrap-expect 3 --name mac1 --data-dir ~/.shoal \
      --token "$SECRET" --join mac2 --join mac3
  (the same on mac2 and mac3, each joining the other two)

Add a machine later with a join token from 'shoal token create':

  shoal agent --name linux1 --data-dir /var/lib/shoal --join mac1 \
      --token abc123.0123456789abcdef.<ca-hash>            # a client
  shoal agent --server ... --token <join token>             # another server

A single machine: shoal agent --server --bootstrap-expect 1 --data-dir d
(the generated secret is written to d/bootstrap-token).

Serving a model whole on this machine (OpenAI-compatible API on --http-port):
  shoal agent --server --bootstrap-expect 1 --data-dir d --model model.gguf
  curl --cacert d/tls/https-ca.pem -H "Authorization: Bearer $(cat d/bootstrap-token)" \
    https://localhost:7948/v1/chat/completions -d '{"model":"model","messages":[{"role":"user","content":"Hi"}]}'

The API (OpenAI endpoint, cluster API, dashboard, /metrics) is HTTPS unless
--bind is a loopback address. Its certificate is signed by the cluster's
HTTPS CA for the node's name, its addresses, localhost and 127.0.0.1; every
agent keeps the CA certificate in <data-dir>/tls/https-ca.pem: give that file
to clients (SHOAL_CACERT for the shoal CLI, curl --cacert, a browser's trust
store). --tls-cert/--tls-key serve a certificate of your own instead;
--insecure-http serves plain HTTP on any address. /metrics, like the
dashboard's data, takes a read or admin key (--metrics-public: none).

--join takes QUIC addresses (host or host:port, default port 7947).
Every flag can also come from the environment (SHOAL_NAME, SHOAL_DATA_DIR,
SHOAL_JOIN=a,b, SHOAL_AGENT_TOKEN, SHOAL_LOG_LEVEL, ...: SHOAL_ and the flag's
name with underscores; SHOAL_TOKEN stays the CLI's API key) or a JSON file given with --config
(keys as in the flags, with underscores: {"data_dir": "...", "join": [...], "memory_limit": "8GiB"}).
Precedence: flag, environment, config file.

As a service: SIGTERM (or Ctrl-C) drains the agent: new client requests get
503 with Retry-After and GET /v1/health?ready=1 turns 503, requests in flight
run to their end (up to --drain-timeout), then the agent leaves Raft and
gossip and exits 0. Under systemd (Type=notify) it sends READY=1 once it has
joined, a leader is known and it serves, STOPPING=1 when it drains, and
WATCHDOG=1 pings when the unit sets WatchdogSec. deploy/ has the unit, a
launchd job, a container image, compose and Kubernetes files.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			final := node.Config{}
			if configFile != "" {
				if err := node.LoadConfigFile(configFile, &final); err != nil {
					return err
				}
			}
			var err error
			if insecureHTTP {
				cfg.HTTPS = node.HTTPSOff
			}
			if err := mergeAgentFlags(cmd.Flags(), &cfg, &final); err != nil {
				return err
			}
			if len(modelPaths) == 0 && os.Getenv("SHOAL_MODEL") != "" {
				modelPaths = strings.Split(os.Getenv("SHOAL_MODEL"), ",")
			}
			if len(modelPaths) > 0 {
				final.Models = nil
				for _, p := range modelPaths {
					var name string
					if p, name, err = localModel(cmd.Context(), p, cmd.ErrOrStderr()); err != nil {
						return err
					}
					final.Models = append(final.Models, node.ModelConfig{Path: p, Name: name, Ctx: modelOpts.Ctx, Threads: modelOpts.Threads, MaxSeqs: modelOpts.MaxSeqs, Queue: modelOpts.Queue, NoPrefixCache: modelOpts.NoPrefixCache, Lookup: modelOpts.Lookup, Draft: modelOpts.Draft, DraftMax: modelOpts.DraftMax})
				}
			}
			if modelOpts.Threads > 0 {
				final.Threads = modelOpts.Threads
			}
			if memLimit != "" {
				if final.MemoryLimit, err = node.ParseSize(memLimit); err != nil {
					return fmt.Errorf("--memory-limit: %w", err)
				}
			} else if v := os.Getenv("SHOAL_MEMORY_LIMIT"); v != "" {
				if final.MemoryLimit, err = node.ParseSize(v); err != nil {
					return fmt.Errorf("SHOAL_MEMORY_LIMIT: %w", err)
				}
			}
			if diskLimit != "" {
				if final.DiskLimit, err = node.ParseSize(diskLimit); err != nil {
					return fmt.Errorf("--disk-limit: %w", err)
				}
			}
			if batchInvariant {
				kernels.SetBatchInvariant(true)
			}
			final.Version = shoalVersion()
			if final.Name == "" {
				final.Name = node.DefaultName()
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			a, err := node.Start(ctx, final)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "shoal agent %s (%s) running: id %s, quic %s, gossip %s, api %s\ndevice: %s\n",
				final.Name, roleName(final.Server), a.ID(), a.RPCAddr(), a.GossipAddr(), a.HTTPURL(), a.Device())
			if a.HTTPS() && final.TLSCert == "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "HTTPS with the cluster's CA: clients trust %s (e.g. SHOAL_CACERT=%s, curl --cacert)\n",
					node.HTTPSCAPath(final.DataDir), node.HTTPSCAPath(final.DataDir))
			}
			go notifyService(ctx, a)
			select {
			case <-ctx.Done():
				stop() // a second signal stops at once
				return drainAndLeave(a, time.Duration(final.DrainTimeout), cmd.ErrOrStderr())
			case <-a.Done():
				_ = a.Shutdown(true) // waits for the leave the removal started
				return codedError{exitRemoved, "this node was removed from the cluster ('shoal node rm'): start it with a fresh --data-dir and a new join token (exit status 3: restarting it as it is cannot help)"}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the agent's run to this file (written when it stops)")
	f.StringArrayVar(&modelPaths, "model", nil, "serve this GGUF model whole on this machine at the OpenAI-compatible endpoint (repeatable; SHOAL_MODEL=a,b)")
	f.IntVar(&modelOpts.Ctx, "ctx", 0, "KV cache capacity per served model in tokens, shared by its sequences (default: the model's context, at most 8192)")
	f.IntVar(&modelOpts.Threads, "threads", 0, "engine worker threads per served model and per shard this node runs of a model spread over the cluster (default: all cores)")
	f.IntVar(&modelOpts.MaxSeqs, "max-seqs", 0, "sequences decoded together per model (default 16)")
	f.BoolVar(&batchInvariant, "batch-invariant", os.Getenv("SHOAL_BATCH_INVARIANT") == "1", "compute every matrix product as a decode step does, so a sequence's logits do not depend on what shares its batch and a generation moved to another driver goes on with the tokens it would have had (prefill of most weight types is 2-4x slower) (SHOAL_BATCH_INVARIANT=1)")
	f.BoolVar(&modelOpts.NoPrefixCache, "no-prefix-cache", false, "compute every prompt in full instead of reusing the KV blocks of a prefix an earlier request computed")
	f.IntVar(&modelOpts.Lookup, "lookup", 0, "speculative decoding without a draft model for each --model: draft up to N tokens a step from what followed the latest earlier occurrence of the sequence's last few tokens, verified in the same step (the output is unchanged; repetitive text, code and edits decode faster); 0: off")
	f.StringVar(&modelOpts.Draft, "draft", "", "speculative decoding with a draft model for each --model: this GGUF file (the same vocabulary: a smaller model of the family, or a lower-bit file of the same model) runs whole here and proposes tokens the model verifies in one step (the output is unchanged; tokens the draft guesses right cost no step of their own)")
	f.IntVar(&modelOpts.DraftMax, "draft-max", 0, "the most tokens --draft proposes a step, at most 16; it drafts fewer while they are rejected (default 6)")
	f.IntVar(&modelOpts.Queue, "queue", 0, "requests waiting beyond the running batch before 429 (default 64)")
	f.StringVar(&configFile, "config", "", "JSON config file")
	f.StringVar(&diskLimit, "disk-limit", "", "cap the disk the copies of model files this node keeps for the cluster may take (model load --replicas), e.g. 50GiB (default: the free disk)")
	f.StringVar(&memLimit, "memory-limit", "", "cap the memory this node offers to placed models, e.g. 8GiB (default: what is free at start)")
	f.StringVar(&cfg.Name, "name", "", "node name shown in 'shoal node ls': up to 63 letters, digits, '.', '_' and '-', starting with a letter or digit (default: the host name, other characters as '-')")
	f.StringVar(&cfg.DataDir, "data-dir", "", "directory for the node's identity, certificates and Raft data (required)")
	f.StringVar(&cfg.Bind, "bind", "0.0.0.0", "IP address to listen on")
	f.StringVar(&cfg.Advertise, "advertise", "", "IP address other nodes reach this one at (default: detected)")
	f.IntVar(&cfg.GossipPort, "gossip-port", 7946, "gossip port (TCP and UDP)")
	f.IntVar(&cfg.QUICPort, "quic-port", node.DefaultQUICPort, "QUIC port (UDP) for Raft and node-to-node traffic; tensor-parallel collectives use the same number over TCP")
	f.IntVar(&cfg.HTTPPort, "http-port", 7948, "admin API port")
	f.StringArrayVar(&cfg.Join, "join", nil, "QUIC address of an agent to join (repeatable)")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", 0, "number of servers that bootstrap the cluster together (servers only)")
	f.BoolVar(&cfg.Server, "server", false, "run as a server (Raft member) instead of a client")
	f.StringVar(&cfg.Token, "token", "", "bootstrap secret shared by the first servers, or a join token")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "certificate (PEM, chain first to last) the API serves HTTPS with, instead of one the cluster's HTTPS CA signs")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "private key (PEM) of --tls-cert")
	f.StringVar(&cfg.Serves, "role", "", "pin this node to a pool of disaggregated plans: prefill (computes prompts, streams their KV cache to decode nodes), decode, or both (default both; see 'shoal model load --disagg')")
	f.DurationVar((*time.Duration)(&cfg.DrainTimeout), "drain-timeout", 30*time.Second, "on SIGTERM or Ctrl-C, how long requests in flight may run before the agent leaves anyway (new ones are refused from the signal on); a second signal stops at once")
	f.StringVar(&cfg.NetTelemetry, "net-telemetry", node.NetTelemetryAuto, "where per-peer traffic counts (metrics, the planner's live link view) come from: auto (eBPF classifiers on the interfaces the cluster uses, where they load: Linux as root or with CAP_BPF and CAP_NET_ADMIN; else QUIC's own counts), ebpf (or refuse to start), quic")
	f.StringVar(&cfg.Device, "device", "auto", deviceHelp)
	f.BoolVar(&cfg.MetricsPublic, "metrics-public", false, "serve /metrics without an API key (for a scraper that sends none): it names every model and peer address, so by default it takes a read or admin key (Authorization: Bearer; Prometheus: authorization.credentials)")
	f.BoolVar(&insecureHTTP, "insecure-http", false, "serve the API over plain HTTP even on a network address (keys and prompts cross in clear)")
	return cmd
}

func roleName(server bool) string {
	if server {
		return "server"
	}
	return "client"
}

// mergeAgentFlags layers config file < environment < flags set on the
// command line into out.
func mergeAgentFlags(fs *pflag.FlagSet, flags, out *node.Config) error {
	type field struct {
		flag string
		set  func(string) error
		from func()
	}
	atoi := func(name string, dst *int) func(string) error {
		return func(s string) error {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("%s %q: want a number", name, s)
			}
			*dst = v
			return nil
		}
	}
	str := func(dst *string) func(string) error { return func(s string) error { *dst = s; return nil } }
	fields := []field{
		{"name", str(&out.Name), func() { out.Name = flags.Name }},
		{"data-dir", str(&out.DataDir), func() { out.DataDir = flags.DataDir }},
		{"bind", str(&out.Bind), func() { out.Bind = flags.Bind }},
		{"advertise", str(&out.Advertise), func() { out.Advertise = flags.Advertise }},
		{"gossip-port", atoi("SHOAL_GOSSIP_PORT", &out.GossipPort), func() { out.GossipPort = flags.GossipPort }},
		{"quic-port", atoi("SHOAL_QUIC_PORT", &out.QUICPort), func() { out.QUICPort = flags.QUICPort }},
		{"http-port", atoi("SHOAL_HTTP_PORT", &out.HTTPPort), func() { out.HTTPPort = flags.HTTPPort }},
		{"join", func(s string) error { out.Join = strings.Split(s, ","); return nil }, func() { out.Join = flags.Join }},
		{"bootstrap-expect", atoi("SHOAL_BOOTSTRAP_EXPECT", &out.BootstrapExpect), func() { out.BootstrapExpect = flags.BootstrapExpect }},
		{"server", func(s string) error {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("SHOAL_SERVER %q: want true or false", s)
			}
			out.Server = v
			return nil
		}, func() { out.Server = flags.Server }},
		{"token", str(&out.Token), func() { out.Token = flags.Token }},
		{"tls-cert", str(&out.TLSCert), func() { out.TLSCert = flags.TLSCert }},
		{"role", str(&out.Serves), func() { out.Serves = flags.Serves }},
		{"tls-key", str(&out.TLSKey), func() { out.TLSKey = flags.TLSKey }},
		{"net-telemetry", str(&out.NetTelemetry), func() { out.NetTelemetry = flags.NetTelemetry }},
		{"device", str(&out.Device), func() { out.Device = flags.Device }},
		{"drain-timeout", func(s string) error {
			v, err := time.ParseDuration(s)
			if err != nil || v < 0 {
				return fmt.Errorf("SHOAL_DRAIN_TIMEOUT %q: want a duration such as 30s", s)
			}
			out.DrainTimeout = node.Duration(v)
			return nil
		}, func() { out.DrainTimeout = flags.DrainTimeout }},
		{"metrics-public", func(s string) error {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("SHOAL_METRICS_PUBLIC %q: want true or false", s)
			}
			out.MetricsPublic = v
			return nil
		}, func() { out.MetricsPublic = flags.MetricsPublic }},
		{"insecure-http", func(s string) error {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("SHOAL_INSECURE_HTTP %q: want true or false", s)
			}
			if v {
				out.HTTPS = node.HTTPSOff
			}
			return nil
		}, func() { out.HTTPS = flags.HTTPS }},
	}
	for _, f := range fields {
		env := "SHOAL_" + strings.ToUpper(strings.ReplaceAll(f.flag, "-", "_"))
		if f.flag == "token" {
			env = "SHOAL_AGENT_TOKEN" // SHOAL_TOKEN is the CLI's API key
		}
		switch {
		case fs.Changed(f.flag):
			f.from()
		case os.Getenv(env) != "":
			if err := f.set(os.Getenv(env)); err != nil {
				return err
			}
		default:
			// Config file value, else the flag default.
			if isZeroField(out, f.flag) {
				f.from()
			}
		}
	}
	return nil
}

func isZeroField(c *node.Config, flag string) bool {
	switch flag {
	case "name":
		return c.Name == ""
	case "data-dir":
		return c.DataDir == ""
	case "bind":
		return c.Bind == ""
	case "advertise":
		return c.Advertise == ""
	case "gossip-port":
		return c.GossipPort == 0
	case "quic-port":
		return c.QUICPort == 0
	case "http-port":
		return c.HTTPPort == 0
	case "join":
		return len(c.Join) == 0
	case "bootstrap-expect":
		return c.BootstrapExpect == 0
	case "server":
		return !c.Server
	case "token":
		return c.Token == ""
	case "tls-cert":
		return c.TLSCert == ""
	case "tls-key":
		return c.TLSKey == ""
	case "insecure-http":
		return c.HTTPS == ""
	case "drain-timeout":
		return c.DrainTimeout == 0
	case "net-telemetry":
		return c.NetTelemetry == ""
	case "metrics-public":
		return !c.MetricsPublic
	}
	return true
}

// flagsFromEnv gives every agent flag not set on the command line the
// value of SHOAL_<FLAG> (dashes as underscores) when that is set, so a
// container or unit can configure any of them from its environment: the
// flag, then the environment, then the config file. --token reads
// SHOAL_AGENT_TOKEN (SHOAL_TOKEN is the CLI's API key); a repeatable
// flag takes a comma-separated list.
func flagsFromEnv(cmd *cobra.Command) error {
	var err error
	visit := func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		env := "SHOAL_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if f.Name == "token" {
			env = "SHOAL_AGENT_TOKEN"
		}
		v, ok := os.LookupEnv(env)
		if !ok || v == "" {
			return
		}
		vals := []string{v}
		if strings.HasSuffix(f.Value.Type(), "Slice") || strings.HasSuffix(f.Value.Type(), "Array") {
			vals = strings.Split(v, ",")
		}
		for _, x := range vals {
			if serr := f.Value.Set(strings.TrimSpace(x)); serr != nil {
				err = fmt.Errorf("%s=%q: %v", env, v, serr)
				return
			}
		}
		f.Changed = true
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return err
}

// deviceHelp is the --device flag's text (agent, run, logits, bench).
const deviceHelp = `what runs this machine's layers: auto (the first Vulkan GPU; the CPU when there is none, saying why), cpu, vulkan or vulkan:N (that Vulkan device, lavapipe included; an error if it cannot run). Layers that do not fit in the GPU's memory run on the CPU`

const kvTypeHelp = `how the KV cache stores K and V: f16, q8_0 (about half the memory) or q4_0 (about a quarter, quality drops more), as llama.cpp's --cache-type-k/-v; the model's heads must be a multiple of 32 values`
