package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/node"
	"shoal/placement"
)

func modelCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Load models onto the cluster, list them, unload them",
		Long: `Load a GGUF model onto the cluster: the leader plans where its layers run
from the nodes' measured memory, compute and links, and every node of the
plan opens its shard from its own copy of the file or fetches exactly its
byte ranges from the node that has it.

  shoal model load /models/llama-8b-q4_k_m.gguf --ctx 8192 --max-seqs 4
  shoal model ls
  shoal placement show llama-8b-q4_k_m
  shoal model unload llama-8b-q4_k_m`,
	}
	cmd.AddCommand(modelLoadCmd(), modelLsCmd(), modelUnloadCmd())
	return cmd
}

func modelLoadCmd() *cobra.Command {
	var f clusterFlags
	var req api.LoadModelRequest
	var overhead string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "load FILE|NAME | load --hub REPO[:QUANT]",
		Short: "Register a GGUF file with the cluster; the leader plans it and nodes fetch their shards",
		Long: `Register a GGUF model file with the cluster. The file stays where it is: on
the agent this command talks to (--addr), or on the node --node names. That
agent profiles the file, hashes it and registers it; the leader then plans
it across the nodes, and nodes without the file fetch only their byte
ranges from that agent over QUIC. The command waits until every shard is
ready (or the model is unservable) unless --wait 0.

FILE may also be a model of this machine's store ('shoal pull --list'), by
its name or the hub reference it was pulled with, as for 'shoal run'; a
model of the store is named as the store names it. load never downloads:
'shoal pull' a model first, or read it in place with --hub.

The plan reserves KV cache for --max-seqs sequences of --ctx tokens on
every node it uses, and the node that drives the model runs that many
sequences at once; up to --queue more requests wait, and further ones are
answered 429 with Retry-After.

Once the file is hashed, other nodes copy it whole in the background until
--replicas live nodes have it (2 by default), each copy verified against
the file's digest before the node serves it: when the node with the file
dies, the model is planned again and fetched from a copy. A node copies
only with the file's size plus a tenth free on its disk (else it is listed
as no-room and skipped); 'model unload' removes the copies.

  shoal model load /models/qwen2-7b-q4_k_m.gguf
  shoal model load /models/qwen2-7b-q4_k_m.gguf --ctx 2048 --max-seqs 4
  shoal model load /data/m.gguf --node linux1 --name m --ctx 8192
  shoal model load m.gguf --wait 0 -o json      # print the record and return
  shoal model load /data/m.gguf --replicas 3     # two copies besides this one
  shoal model load qwen2.5-0.5b-instruct:q4_k_m  # a model of the store

With --hub REPO:QUANT (or REPO/FILE.gguf; a single-file GGUF), no machine
downloads the whole file and the hub serves each byte about once: the
agent at --addr resolves the reference on the hub it is configured with
(HF_ENDPOINT, HF_TOKEN in its environment) and reads the GGUF header; the
planned nodes read only their shards' byte ranges from the hub and hold
them ('model ls': verifying) while that agent reads the file back from
them to check its sha256 against the hub's and record the sha256 of every
unit; then each node checks its ranges unit by unit and serves. Use it for a
cluster of machines with their own internet access; to pull a model onto
one machine and serve it from there (shoal up, shoal run), or for a split
GGUF, use shoal pull and load the file.

  shoal model load --hub Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M --nodes a,b,c`,
		Args: func(cmd *cobra.Command, args []string) error {
			if req.Hub != "" {
				if len(args) != 0 {
					return fmt.Errorf("give a FILE or --hub REF, not both")
				}
				return nil
			}
			return exactArgs(1, "the path of a GGUF file (or --hub REPO:QUANT)")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, cancel, err := f.client()
			if err != nil {
				return err
			}
			cancel()
			if req.Hub != "" {
				args = []string{""}
			}
			req.Path = args[0]
			if err := storePath(cmd.Context(), &req); err != nil {
				return err
			}
			if req.Draft != "" {
				// a model of the store, or a file here, like FILE
				dr := api.LoadModelRequest{Path: req.Draft, Name: "-"}
				if err := storePath(cmd.Context(), &dr); err != nil {
					return fmt.Errorf("--draft: %w", err)
				}
				req.Draft = dr.Path
				switch {
				case req.Hub != "":
					return fmt.Errorf("--draft with --hub: a draft model is not read from the hub; download both and load the files")
				case req.Lookup > 0:
					return fmt.Errorf("--draft and --lookup both draft tokens: give one")
				}
			}
			if req.DraftMax < 0 || req.DraftMax > 16 || req.DraftMax > 0 && req.Draft == "" {
				return fmt.Errorf("--draft-max %d: draft 1 to 16 tokens a step, with --draft", req.DraftMax)
			}
			if overhead != "" {
				if req.Overhead, err = node.ParseSize(overhead); err != nil {
					return fmt.Errorf("--overhead: %w", err)
				}
			}
			if req.Ctx < 0 {
				return fmt.Errorf("--ctx %d: want a positive number of tokens", req.Ctx)
			}
			if req.Lookup < 0 || req.Lookup > 16 {
				return fmt.Errorf("--lookup %d: draft 0 (off) to 16 tokens a step", req.Lookup)
			}
			if req.PlanPrompt < 0 || req.PlanGen < 0 || req.PlanGen > 0 && req.PlanPrompt == 0 {
				return fmt.Errorf("--plan-prompt %d, --plan-gen %d: want a positive prompt length, and --plan-gen only with it", req.PlanPrompt, req.PlanGen)
			}
			if req.MaxSeqs < 0 || req.Queue < 0 || req.Replicas < 0 {
				return fmt.Errorf("--max-seqs %d, --queue %d, --replicas %d: want positive numbers", req.MaxSeqs, req.Queue, req.Replicas)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			m, err := c.LoadModel(ctx, req)
			cancel()
			if err != nil {
				return err
			}
			w, ew := cmd.OutOrStdout(), cmd.ErrOrStderr()
			if wait <= 0 {
				if f.json() {
					return printJSON(w, m)
				}
				fmt.Fprintf(w, "model %s registered from %s on %s (%s, %d layers); see 'shoal model ls'\n", m.Name, m.Path, m.SourceName, gib(m.Bytes), m.Layers)
				return nil
			}
			if !f.json() {
				fmt.Fprintf(ew, "model %s registered from %s on %s (%s, %d layers); waiting for its shards\n", m.Name, m.Path, m.SourceName, gib(m.Bytes), m.Layers)
			}
			final, err := waitModel(c, m.Name, req.Nodes, wait, func(mi *api.ModelInfo) {
				if !f.json() {
					fmt.Fprintf(ew, "  %s: %s %3.0f%%\n", mi.Name, mi.Status, 100*mi.Progress)
				}
			})
			if err != nil {
				return err
			}
			if f.json() {
				return printJSON(w, final)
			}
			switch final.Status {
			case "ready":
				fmt.Fprintf(w, "model %s is ready on %d node(s): predicted %.2f ms/token (see 'shoal placement show %s')\n", final.Name, len(final.Shards), final.PredictedMsPerToken, final.Name)
				if final.Fallback != "" {
					fmt.Fprintf(w, "note: %s\n", final.Fallback)
				}
				return nil
			default:
				return fmt.Errorf("model %s is %s: %s", final.Name, final.Status, final.Reason)
			}
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&req.Name, "name", "", "model name (default: the store's name of a model of the store, else the file name without .gguf)")
	cmd.Flags().IntVar(&req.Ctx, "ctx", 0, "context length per sequence the plan reserves KV cache for (default 4096)")
	cmd.Flags().IntVar(&req.MaxSeqs, "max-seqs", 0, "sequences the plan reserves --ctx tokens of KV cache for, run at once (default 1)")
	cmd.Flags().IntVar(&req.Queue, "queue", 0, "requests that wait for a running place before more get 429 (default 4 x --max-seqs)")
	cmd.Flags().IntVar(&req.Lookup, "lookup", 0, "speculative decoding by prompt lookup: the driver drafts up to N tokens a step from what followed the latest earlier occurrence of the sequence's last few tokens, and the plan verifies them in one pass (one trip through the stages for several tokens; the output is unchanged); 0: off, at most 16")
	cmd.Flags().StringVar(&req.Draft, "draft", "", "speculative decoding with a draft model: a GGUF file (or a model of the store) on the same node as FILE with the same vocabulary, e.g. a smaller model of the family or a lower-bit file of the same model; the node that drives the plan holds it whole and drafts with it, and the plan verifies the drafts in one pass (the output is unchanged). Not with --lookup or --hub")
	cmd.Flags().IntVar(&req.DraftMax, "draft-max", 0, "with --draft: the most tokens drafted a step, fewer while they are rejected; at most 16 (default 6)")
	cmd.Flags().IntVar(&req.PlanPrompt, "plan-prompt", 0, "plan for prompts of about N tokens: the layers are split so the stages prefill a long prompt's pieces in equal time, and the plan (one node, a pipeline, tensor parallel) is chosen by its predicted time to first token rather than its decode speed; 'placement show --prompt N' prints the prediction (default 0: plan for decode)")
	cmd.Flags().IntVar(&req.PlanGen, "plan-gen", 0, "with --plan-prompt: the tokens a request generates after its prompt, so the plan is chosen by the predicted time of the whole request (first token plus N decode steps)")
	cmd.Flags().StringVar(&req.Node, "node", "", "the node that has the file (ID, ID prefix or name; default: the agent at --addr)")
	cmd.Flags().IntVar(&req.Replicas, "replicas", 0, "live nodes that should have the whole file: this one and copies other nodes make in the background when they have the disk (default 2; 1: no copy)")
	cmd.Flags().StringVar(&req.Strategy, "strategy", "", "force the plan's strategy: pipeline or tensor (default: the planner chooses)")
	cmd.Flags().StringSliceVar(&req.Nodes, "nodes", nil, "run the model on exactly these nodes (names or IDs, comma-separated): every one is used, no other; the file is not copied elsewhere (default: the planner chooses)")
	cmd.Flags().StringVar(&req.Wire, "wire", "", "how hidden states and all-reduces travel between the plan's nodes: f16 (half of f32's bytes, logits within the oracle tolerances), f32 (exact: a single node's logits bit for bit) or q8_0 (a quarter of the bytes) (default f16)")
	cmd.Flags().StringVar(&req.KVType, "kv-type", "", "how every node's KV cache stores K and V: f16, q8_0 (about half the memory: 1.88x the context in the same room) or q4_0 (a quarter; quality drops more), as llama.cpp's --cache-type-k/-v; heads must be a multiple of 32 values (default f16)")
	cmd.Flags().StringVar(&req.DisaggFailure, "disagg-failure", "", "when a prompt's prefill on the prefill pool fails: recompute (the decode pool prefills it) or fail (the request ends with an error) (default recompute)")
	cmd.Flags().StringVar(&req.Disagg, "disagg", "", "prefill prompts on a separate pool of nodes that streams the KV cache to the decode pool: auto (when nodes are pinned with 'shoal agent --role prefill'), on, off (default auto)")
	cmd.Flags().StringVar(&overhead, "overhead", "", "memory per node beyond weights and KV cache, e.g. 256MiB (default 512MiB)")
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Minute, "wait this long for all shards to be ready; 0 returns at once")
	cmd.Flags().StringVar(&req.Hub, "hub", "", "load a hub reference (REPO:QUANT or REPO/FILE.gguf) read in place: each node reads only its shards' ranges from the hub")
	cmd.Flags().StringVar(&req.Revision, "revision", "", "the hub revision for --hub (default main)")
	return cmd
}

// storePath resolves load's FILE as run resolves --model, without a
// download: a file here is made absolute, and a model of this machine's
// store, by name or hub reference, becomes its file; either is named as the
// store names it unless --name is given. An absolute path that is not here
// is left as it is, for the agent to find on its machine.
func storePath(ctx context.Context, req *api.LoadModelRequest) error {
	if req.Path == "" {
		return nil
	}
	if _, err := os.Stat(req.Path); err != nil && filepath.IsAbs(req.Path) {
		return nil
	}
	path, name, err := resolveModel(ctx, req.Path, io.Discard, false)
	if err != nil {
		return err
	}
	if req.Path, err = filepath.Abs(path); err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = name
	}
	return nil
}

// waitModel polls until the model is ready, unservable, failed or degraded,
// reporting each change. With on (model load --nodes), ready counts once
// the plan runs on exactly those nodes: a model loaded again with other
// nodes is ready on its previous plan until the leader plans it anew.
func waitModel(c *api.Client, name string, on []string, wait time.Duration, report func(*api.ModelInfo)) (*api.ModelInfo, error) {
	deadline := time.Now().Add(wait)
	last := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ms, err := c.Models(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		var m *api.ModelInfo
		for i := range ms {
			if ms[i].Name == name {
				m = &ms[i]
			}
		}
		if m == nil {
			return nil, fmt.Errorf("model %s disappeared (unloaded?)", name)
		}
		if k := fmt.Sprintf("%s %.0f", m.Status, 100*m.Progress); k != last {
			last = k
			report(m)
		}
		switch m.Status {
		case "ready":
			if runsOn(m, on) || m.Fallback != "" {
				return m, nil // on those nodes, or the planner's choice when no plan on them fits
			}
		case "unservable", "failed", "degraded":
			return m, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("model %s is still %s after %v (see 'shoal model ls')", name, m.Status, wait)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// runsOn says whether m's shards are on exactly the nodes on (names or
// IDs), or on is empty.
func runsOn(m *api.ModelInfo, on []string) bool {
	if len(on) == 0 {
		return true
	}
	if len(m.Shards) != len(on) {
		return false
	}
	for _, s := range m.Shards {
		if !slices.Contains(on, s.NodeName) && !slices.Contains(on, s.Node) {
			return false
		}
	}
	return true
}

func modelLsCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the cluster's models with their status and per-node shard progress",
		Long: `List models: size, status (hashing, planning, loading, verifying (a hub
file held by its nodes, its sha256 being checked), ready, degraded,
unservable, failed), the live nodes with the whole file of those wanted
(COPIES, see --replicas) and, per node of the plan, its layers, shard state
and progress. Unservable and failed models say why; the nodes with the
file, or copying it, are listed below the table.

  shoal model ls
  shoal model ls -o json | jq '.[] | {name, status, progress}'`,
		Args: cobra.NoArgs,
		RunE: show(&f, func(c *api.Client, ctx context.Context) ([]api.ModelInfo, error) {
			ms, err := c.Models(ctx)
			if ms == nil {
				ms = []api.ModelInfo{} // [] in JSON
			}
			return ms, err
		}, func(w io.Writer, ms []api.ModelInfo) error {
			if len(ms) == 0 {
				fmt.Fprintln(w, "no models loaded (shoal model load FILE)")
				return nil
			}
			printModels(w, ms)
			return nil
		}),
	}
	f.register(cmd)
	return cmd
}

func printModels(w io.Writer, ms []api.ModelInfo) {
	tw := table(w)
	fmt.Fprintln(tw, "MODEL\tSIZE\tLAYERS\tSTATUS\tPROGRESS\tSOURCE\tCOPIES\tNODE\tLAYERS\tSHARD\tBYTES\tFROM")
	for _, m := range ms {
		prog := "-"
		if m.PlanVersion > 0 {
			prog = fmt.Sprintf("%.0f%%", 100*m.Progress)
		}
		head := fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s\t%d/%d", m.Name, gib(m.Bytes), m.Layers, m.Status, prog, m.SourceName, m.Copies, m.Replicas)
		if len(m.Shards) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\n", head)
		}
		for i, s := range m.Shards {
			if i > 0 {
				head = "\t\t\t\t\t\t"
			}
			state := s.State
			if s.State == "fetching" {
				state = fmt.Sprintf("fetching %.0f%%", 100*s.Progress)
			}
			from := s.Source
			if from == "" {
				from = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t[%d,%d)\t%s\t%s\t%s\n", head, s.NodeName, s.Lo, s.Hi, state, mib(s.Bytes), from)
		}
	}
	tw.Flush()
	for _, m := range ms {
		if len(m.Holders) > 1 {
			fmt.Fprintf(w, "%s: file on %s\n", m.Name, holderList(m.Holders))
		}
		if d := m.Draft; d != nil {
			where := ""
			if d.NodeName != "" {
				where = fmt.Sprintf(", %s on %s", d.State, d.NodeName)
				if d.Error != "" {
					where += ": " + d.Error
				}
			}
			fmt.Fprintf(w, "%s: drafts with %s (%s, %d layers, up to %d tokens a step%s)\n", m.Name, d.Path, mib(d.Bytes), d.Layers, d.Max, where)
		}
	}
	for _, m := range ms {
		if m.Reason != "" {
			fmt.Fprintf(w, "%s: %s\n", m.Name, m.Reason)
		}
	}
}

// holderList says which nodes have a model's file: "a (source), b
// (copy), c (no-room), d (copy, failed node)".
func holderList(hs []api.FileHolder) string {
	var parts []string
	for _, h := range hs {
		what := h.State
		switch {
		case h.Source:
			what = "source"
		case h.State == "ready":
			what = "copy"
		case h.State == "failed" && h.Error != "":
			what = "copy failed: " + h.Error
		}
		if h.NodeStatus != "" && h.NodeStatus != "alive" {
			what += ", " + h.NodeStatus + " node"
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", h.NodeName, what))
	}
	return strings.Join(parts, ", ")
}

func modelUnloadCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "unload NAME",
		Short: "Remove a model, its plan and its shards from the cluster",
		Long: `Remove a model: its plan and shard records leave the cluster state and every
node releases its shard (assembled shard files are deleted) and removes its
copy of the file (--replicas); the original file is left alone.

  shoal model unload llama-8b-q4_k_m`,
		Args: exactArgs(1, "a model name (see 'shoal model ls')"),
		RunE: f.actOnName(func(ctx context.Context, c *api.Client, name string) error {
			return c.UnloadModel(ctx, name)
		}, "model", "model", "unloaded"),
	}
	f.register(cmd)
	return cmd
}

func placementCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "placement",
		Short: "Show where a model's layers run and why",
		Long: `Show a model's committed plan: stages, members, memory per node and the
predicted ms/token with its compute, memory and network parts.

  shoal placement show llama-8b-q4_k_m`,
	}
	cmd.AddCommand(placementShowCmd())
	return cmd
}

func placementShowCmd() *cobra.Command {
	var f clusterFlags
	var prompt int
	cmd := &cobra.Command{
		Use:   "show MODEL",
		Short: "Print a model's plan: stages, members, memory per node, predicted ms/token",
		Long: `Print the plan the leader committed for a model: each pipeline stage with
its layer range and members (tensor-parallel rank, heads, FFN columns,
experts), each node's predicted memory use against what it offers, and the
predicted time of one decode step with its compute, memory and network
parts, then the planner's reasoning and what the last re-plan moved.
With --prompt N it adds the predicted prefill of a prompt of N tokens (the
time to the first token): a plan of several stages cuts a long prompt into
pieces that flow through the stages at once, and the line shows that
against the same prompt run as one step. A model loaded with
--plan-prompt N shows the prefill of N tokens unless --prompt says otherwise.

  shoal placement show llama-8b-q4_k_m
  shoal placement show llama-8b-q4_k_m --prompt 2048
  shoal placement show llama-8b-q4_k_m -o json | jq .cost`,
		Args: exactArgs(1, "a model name (see 'shoal model ls')"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := f.client()
			if err != nil {
				return err
			}
			defer cancel()
			p, err := c.Placement(ctx, args[0])
			if err != nil {
				return err
			}
			if p.Version > 0 {
				// The driver's measurement beside the prediction, when it
				// answers (it is not there while the model loads).
				if m, err := c.ClusterMeasured(ctx, args[0]); err == nil && m.PlanVersion == p.Version {
					p.Measured = m
				}
			}
			if prompt == 0 && p.PlanPrompt > 0 && p.Version > 0 {
				prompt = p.PlanPrompt // the prompt the plan was made for
			}
			if prompt > 0 {
				if p.Prefill, err = c.PredictPrefill(ctx, args[0], prompt); err != nil {
					return err
				}
			}
			w := cmd.OutOrStdout()
			if f.json() {
				return printJSON(w, p)
			}
			printPlacement(w, p)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&prompt, "prompt", 0, "also predict the prefill of a prompt of this many tokens (time to first token; default: the model's --plan-prompt, if any)")
	return cmd
}

func printPlacement(w io.Writer, p *api.PlacementInfo) {
	fmt.Fprintf(w, "model %s: %s", p.Model, p.Status)
	if p.Reason != "" {
		fmt.Fprintf(w, " (%s)", p.Reason)
	}
	fmt.Fprintln(w)
	if p.Fallback != "" {
		fmt.Fprintf(w, "note: %s\n", p.Fallback)
	}
	if len(p.Stages) == 0 {
		if p.Version == 0 {
			fmt.Fprintln(w, "no plan yet")
		} else {
			fmt.Fprintf(w, "plan v%d places nothing\n", p.Version)
		}
		for _, e := range p.Explain {
			fmt.Fprintf(w, "  %s\n", e)
		}
		if len(p.Holders) > 0 {
			fmt.Fprintf(w, "file (%d live node(s) wanted): %s\n", p.Replicas, holderList(p.Holders))
		}
		return
	}
	fmt.Fprintf(w, "plan v%d, strategy %s, context %d x %d sequence(s) (max-seqs), queue %d, KV reserved %s (%s cache, %d bytes per token)\n",
		p.Version, p.Strategy, p.Context, p.Batch, p.Queue, mib(p.KVBytes), p.KVType, p.KVBytesPerToken)
	fmt.Fprintf(w, "predicted %.2f ms/token: compute %.2f, memory %.2f, network %.2f (slowest stage %.2f ms)\n",
		p.Cost.MsPerToken, p.Cost.ComputeMs, p.Cost.MemoryMs, p.Cost.NetworkMs, p.Cost.BottleneckMs)
	switch m := p.Measured; {
	case m == nil:
	case m.DecodeSteps == 0:
		fmt.Fprintf(w, "measured: no decode step on the driver (%s) yet\n", m.Driver)
	default:
		fmt.Fprintf(w, "measured %.2f ms/token by the driver (%s) over %d decode steps of one sequence: %.2fx the %.2f ms predicted for one sequence on the figures measured now\n",
			m.MeasuredMsPerToken, m.Driver, m.DecodeSteps, m.MeasuredMsPerToken/m.PredictedMsPerToken, m.PredictedMsPerToken)
		if m.Off() {
			fmt.Fprintf(w, "note: the prediction is off by more than %gx: the planner weighed capacities or links that do not hold now (agents measure them again every 10 minutes)\n", api.OffBy)
		}
	}
	if pf := p.Prefill; pf != nil {
		fmt.Fprintf(w, "prefill of %d tokens: predicted %.0f ms (%.0f tok/s)", pf.Tokens, pf.Ms, float64(pf.Tokens)/pf.Ms*1000)
		if pf.Pieces > 1 {
			fmt.Fprintf(w, " in %d pieces of %d tokens through %d stages at once; as one step %.0f ms", pf.Pieces, pf.Piece, len(pf.StageMs), pf.OneStepMs)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	tw := table(w)
	fmt.Fprintln(tw, "STAGE\tLAYERS\tNODE\tTP\tHEADS\tFFN\tEXPERTS\tHOLDS\tMEMORY\tGPU\tMS")
	for _, st := range p.Stages {
		for i, m := range st.Members {
			stage, layers := "", ""
			if i == 0 {
				stage, layers = strconv.Itoa(st.Index), fmt.Sprintf("[%d,%d)", st.Lo, st.Hi)
				if st.Pool == "prefill" || st.Pool == "decode" {
					stage = st.Pool + " " + stage // a disaggregated plan's pools
				}
			}
			var holds []string
			if m.Embedding {
				holds = append(holds, "embedding")
			}
			if m.Output {
				holds = append(holds, "output")
			}
			h := strings.Join(holds, ",")
			if h == "" {
				h = "-"
			}
			ffn := "-"
			if m.FFNHi > m.FFNLo {
				ffn = fmt.Sprintf("[%d,%d)", m.FFNLo, m.FFNHi)
			}
			gpu := "-"
			if m.GPULayers > 0 {
				gpu = fmt.Sprintf("%d layers", m.GPULayers)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t[%d,%d)\t%s\t%s\t%s\t%s\t%s\t%.2f\n", stage, layers, m.NodeName, m.TPRank, m.TPSize,
				m.HeadLo, m.HeadHi, ffn, placement.ExpertList(m.Experts), h, mib(m.MemBytes), gpu, m.Ms)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = table(w)
	fmt.Fprintln(tw, "NODE\tSTATUS\tPLANNED\tKV\tOFFERS\tUSE")
	for _, n := range p.Nodes {
		use := "-"
		if n.MemFree > 0 {
			use = fmt.Sprintf("%.0f%%", 100*float64(n.MemBytes)/float64(n.MemFree))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Status, mib(n.MemBytes), mib(n.KVBytes), mib(n.MemFree), use)
	}
	tw.Flush()
	if len(p.Holders) > 0 {
		fmt.Fprintf(w, "\nfile (%d live node(s) wanted): %s\n", p.Replicas, holderList(p.Holders))
	}
	if len(p.Links) > 0 {
		fmt.Fprintln(w, "\nlinks of the plan's nodes (what the planner uses; probe = 1 MiB pushed every minute, live = the most real traffic achieved since, direct = 1 MiB over the TCP link a TP group's all-reduces take):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "FROM\tTO\tGBIT/S\tLATENCY MS\tSET BY\tPROBE\tLIVE\tDIRECT\tRTT MS\tIFACE\tSENT\tRECEIVED\tCOUNTED BY\tAGE")
		for _, l := range p.Links {
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0fs\n", l.From, l.To, l.Gbit, l.LatencyMs,
				orDash(l.Source), gbitOrDash(l.ProbeGbit), gbitOrDash(l.LiveGbit), gbitOrDash(l.DirectGbit), msOrDash(l.RTTMs), orDash(l.Iface),
				bytesOrDash(l.TxBytes), bytesOrDash(l.RxBytes), orDash(l.Telemetry), l.AgeSec)
		}
		tw.Flush()
	}
	if len(p.Explain) > 0 {
		fmt.Fprintln(w, "\nwhy:")
		for _, e := range p.Explain {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	if len(p.Moved) > 0 {
		fmt.Fprintf(w, "\nlast change (%s to fetch):\n", placement.GiB(p.MovedBytes))
		for _, m := range p.Moved {
			fmt.Fprintf(w, "  %s\n", m)
		}
	}
}

func mib(b uint64) string {
	if b == 0 {
		return "-"
	}
	return placement.GiB(b)
}

// parseSize reads a byte count: 1073741824, 512MiB, 1GiB, 1.5GB, 64k.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func gbitOrDash(g float64) string {
	if g <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", g)
}

func msOrDash(ms float64) string {
	if ms <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", ms)
}

func bytesOrDash(b uint64) string {
	if b == 0 {
		return "-"
	}
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}
