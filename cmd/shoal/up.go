package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"shoal/cmd/shoal/localcluster"
)

func upCmd() *cobra.Command {
	o := localcluster.Options{}
	cmd := &cobra.Command{
		Use:   "up [--nodes 3]",
		Short: "Start a local cluster serving the built-in model (Ctrl-C stops it)",
		Long: `Start a cluster of shoal agents on this machine's loopback interface, each a
separate process, wait until they have elected a leader and serve the model,
then print the OpenAI-compatible endpoint, an API key and a curl line.
Ctrl-C stops every agent cleanly. State stays in --data-dir, so the next
'shoal up' brings the same cluster back, with the models an earlier run
loaded: the banner lists them, and the commands it prints name the model
this run serves.

Without --model the agents serve a small built-in model with random weights
(written to the data dir on first run; no download), so its text is
gibberish: point --model at any GGUF file for real text.

With 2 or more agents the model runs across all of them: once they are up,
it is loaded through the cluster API on exactly those nodes (what 'shoal
model load --nodes' does), a pipeline stage of layers per agent by default
(--strategy), and the banner says which node runs which layers.
--spread=false serves it whole on node-1 instead.

  shoal up                      # 3 agents, built-in model
  shoal up --nodes 1 --model ~/models/qwen2.5-0.5b-instruct-q8_0.gguf
  shoal up --spread=false       # the model whole on node-1
  shoal chat --addr http://127.0.0.1:8080   # talk to it from another terminal`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("strategy") && !o.Spread {
				return fmt.Errorf("--strategy %s splits the model over the agents: it does not go with --spread=false", o.Strategy)
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o.Binary = exe
			o.Log = cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if o.Model, o.ModelName, err = localModel(ctx, o.Model, cmd.ErrOrStderr()); err != nil {
				return err
			}
			c, err := localcluster.Start(ctx, o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			self := os.Args[0] // as it was run: bin/shoal from the repository root (make run)
			local := o.DataDir == upDataDir
			if local {
				if err := writeUpFile(o.DataDir, upFile{Addr: c.Endpoint[:len(c.Endpoint)-len("/v1")], AdminKey: c.Token, InferenceKey: c.InferenceKey, Model: c.Model}); err != nil {
					return err
				}
				defer os.Remove(upFilePath(o.DataDir))
			}
			upBanner(w, c, o, self, local)
			fmt.Fprintf(w, "\nCtrl-C stops the cluster.\n")
			select {
			case <-ctx.Done():
				fmt.Fprintln(cmd.ErrOrStderr(), "\nstopping the agents...")
				return c.Stop()
			case i := <-c.Exited():
				c.Stop()
				return fmt.Errorf("node-%d stopped unexpectedly; its log:\n%s", i+1, c.LogTail(i, 15))
			}
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Nodes, "nodes", 3, "number of agents to start")
	f.StringVar(&o.DataDir, "data-dir", upDataDir, "where the agents keep their state (and the built-in model)")
	f.StringVar(&o.Model, "model", "", "GGUF model to serve: a file, a model in the store, or a hub reference (OWNER/REPO[:QUANT], pulled first) (default: the built-in model)")
	f.IntVar(&o.BasePort, "port", 8080, "HTTP port of the first agent; agent i uses port+10i (HTTP), +1 (QUIC), +2 (gossip)")
	f.BoolVar(&o.Spread, "spread", true, "run the model across every agent (loaded like 'shoal model load --nodes' with all of them); false: whole on node-1")
	f.StringVar(&o.Strategy, "strategy", "pipeline", "how the model is split over the agents: pipeline (a stage of layers per agent), tensor (every layer's heads split over them) or auto (the planner chooses)")
	return cmd
}

// upBanner prints what `shoal up` started and how to use it. Every command
// it prints names the model this run serves: the cluster may serve others
// loaded by an earlier run on the same data dir, which it lists. local:
// the CLI finds the cluster from this directory (cluster.json).
func upBanner(w io.Writer, c *localcluster.Cluster, o localcluster.Options, self string, local bool) {
	base := c.Endpoint[:len(c.Endpoint)-len("/v1")]
	fmt.Fprintf(w, "\nshoal is up: %d agent(s), model %q\n\n", o.Nodes, c.Model)
	if c.Layout != "" {
		fmt.Fprintf(w, "  model      %s: %s\n", c.Model, c.Layout)
		if c.Fallback != "" {
			fmt.Fprintf(w, "  note       %s\n", c.Fallback)
		}
	}
	if len(c.Earlier) > 0 {
		fmt.Fprintf(w, "  also       %s   (loaded by an earlier run on %s; 'shoal model unload NAME' removes one)\n", strings.Join(c.Earlier, ", "), o.DataDir)
	}
	fmt.Fprintf(w, "  endpoint   %s\n", c.Endpoint)
	fmt.Fprintf(w, "  api key    %s   (inference: the OpenAI endpoint only)\n", c.InferenceKey)
	fmt.Fprintf(w, "  admin key  %s   (the CLI and the cluster API)\n", c.Token)
	fmt.Fprintf(w, "  dashboard  %s/#key=%s   (a login link: the key stays in the fragment, never sent to the server)\n", base, c.Token)
	fmt.Fprintf(w, "  chat       %s/dashboard/chat#key=%s\n", base, c.Token)
	fmt.Fprintf(w, "\n  curl %s/chat/completions -H 'Authorization: Bearer %s' \\\n    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":32}'\n",
		c.Endpoint, c.InferenceKey, c.Model)
	if !local {
		fmt.Fprintf(w, "\n  SHOAL_ADDR=%s SHOAL_TOKEN=%s %s status\n", base, c.Token, self)
		fmt.Fprintf(w, "  SHOAL_ADDR=%s SHOAL_TOKEN=%s %s chat --model %s\n", base, c.Token, self, c.Model)
	} else {
		fmt.Fprintf(w, "\n  %s status        # the CLI finds this cluster from this directory (%s)\n", self, upFilePath(o.DataDir))
		if o.Model == "" {
			// Random weights never end an answer: cap it.
			fmt.Fprintf(w, "  %s chat --model %s -n 64    # talk to the model (random weights: 64 tokens of gibberish an answer)\n", self, c.Model)
		} else {
			fmt.Fprintf(w, "  %s chat --model %s    # talk to the model\n", self, c.Model)
		}
		fmt.Fprintf(w, "  %s model ls      # the models' shards on the nodes\n", self)
		fmt.Fprintf(w, "  %s placement show %s   # its plan: stages, memory, predicted ms/token\n", self, c.Model)
	}
	if c.HTTPSCA != "" {
		fmt.Fprintf(w, "\n  The agents bind loopback, so they serve plain HTTP. The cluster's HTTPS CA\n  (what clients trust when agents on a network address serve HTTPS) is\n  %s\n", c.HTTPSCA)
	}
}
