package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
)

// clusterFlags are shared by the commands that talk to an agent.
type clusterFlags struct {
	addr   string
	token  string
	output string
	asJSON bool
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "addr", "", "agent admin API address (default $SHOAL_ADDR or "+api.DefaultAddr+")")
	cmd.Flags().StringVar(&f.token, "token", "", "API key (default $SHOAL_TOKEN)")
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "JSON output (same as -o json)")
}

func (f *clusterFlags) client() (*api.Client, context.Context, context.CancelFunc, error) {
	if f.output != "table" && f.output != "json" {
		return nil, nil, nil, fmt.Errorf("-o %q: want table or json", f.output)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	return api.NewClient(f.addr, f.token), ctx, cancel, nil
}

func (f *clusterFlags) json() bool { return f.output == "json" || f.asJSON }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func gib(b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// show is the RunE of a command that reads one value from the agent and
// prints it: as JSON with -o json, else as text.
func show[T any](f *clusterFlags, get func(*api.Client, context.Context) (T, error), text func(w io.Writer, v T) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, ctx, cancel, err := f.client()
		if err != nil {
			return err
		}
		defer cancel()
		v, err := get(c, ctx)
		if err != nil {
			return err
		}
		if f.json() {
			return printJSON(cmd.OutOrStdout(), v)
		}
		return text(cmd.OutOrStdout(), v)
	}
}

// actOnName is the RunE of a command that does one thing to the object its
// single argument names (remove a node, revoke a token, unload a model) and
// reports it: {key: name, done: true} with --json, else "noun name done".
func (f *clusterFlags) actOnName(act func(ctx context.Context, c *api.Client, name string) error, key, noun, done string) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, ctx, cancel, err := f.client()
		if err != nil {
			return err
		}
		defer cancel()
		if err := act(ctx, c, args[0]); err != nil {
			return err
		}
		if f.json() {
			return printJSON(cmd.OutOrStdout(), map[string]any{key: args[0], done: true})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", noun, args[0], done)
		return nil
	}
}
