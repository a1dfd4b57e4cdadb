package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/node"
)

// clusterFlags are shared by the commands that talk to an agent.
type clusterFlags struct {
	addr   string
	token  string
	cacert string
	output string
	asJSON bool
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "addr", "", "agent API address: https://host:port, http://host:port, or host:port, which means https with --cacert or $SHOAL_CACERT, else http (default $SHOAL_ADDR or 127.0.0.1:7948)")
	cmd.Flags().StringVar(&f.token, "token", "", "API key (default $SHOAL_TOKEN)")
	cmd.Flags().StringVar(&f.cacert, "cacert", "", "the cluster's HTTPS CA certificate to trust (default $SHOAL_CACERT, else $SHOAL_DATA_DIR/tls/https-ca.pem if it exists)")
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "JSON output (same as -o json)")
}

func (f *clusterFlags) client() (*api.Client, context.Context, context.CancelFunc, error) {
	if f.output != "table" && f.output != "json" {
		return nil, nil, nil, fmt.Errorf("-o %q: want table or json", f.output)
	}
	addr, ca, err := agentAddr(f.addr, f.cacert)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := api.NewClientCA(addr, cliToken(f.token, f.addr), ca)
	if err != nil {
		return nil, nil, nil, err
	}
	sayElecting(c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	return c, ctx, cancel, nil
}

// apiClient is an API client of the agent at addr trusting the cluster's
// HTTPS CA the CLI finds (loadCA without a flag).
func apiClient(addr, key string) (*api.Client, error) {
	key = cliToken(key, addr)
	addr, ca, err := agentAddr(addr, "")
	if err != nil {
		return nil, err
	}
	c, err := api.NewClientCA(addr, key, ca)
	if err != nil {
		return nil, err
	}
	sayElecting(c)
	return c, nil
}

// sayElecting makes c tell the user, once, that it waits for an election.
func sayElecting(c *api.Client) {
	var once sync.Once
	c.OnLeaderWait = func() { once.Do(func() { fmt.Fprintln(os.Stderr, "electing a leader, retrying") }) }
}

// agentAddr is the agent's base URL (--addr, else $SHOAL_ADDR, else a
// `shoal up` running from this directory, else the local agent) and the HTTPS CA to trust there (see loadCA). An address
// without a scheme means https when the CA was given (--cacert or
// $SHOAL_CACERT), else http.
func agentAddr(addrFlag, cacertFlag string) (string, []byte, error) {
	ca, explicit, err := loadCA(cacertFlag)
	if err != nil {
		return "", nil, err
	}
	addr := addrFlag
	if addr == "" {
		addr = os.Getenv("SHOAL_ADDR")
	}
	if addr == "" {
		if up, ok := localUp(); ok { // `shoal up` running from here
			addr = up.Addr
		}
	}
	if addr == "" {
		addr = strings.TrimPrefix(api.DefaultAddr, "http://")
	}
	if !strings.Contains(addr, "://") {
		if explicit {
			addr = "https://" + addr
		} else {
			addr = "http://" + addr
		}
	}
	return addr, ca, nil
}

// loadCA reads the HTTPS CA the CLI trusts: the --cacert file, else
// $SHOAL_CACERT (explicit: an address without a scheme then means https),
// else the one in the data dir of an agent on this machine
// ($SHOAL_DATA_DIR), trusted for https addresses only. None is no error.
func loadCA(flag string) (pem []byte, explicit bool, err error) {
	path, what := flag, "--cacert"
	if path == "" {
		path, what = os.Getenv("SHOAL_CACERT"), "SHOAL_CACERT"
	}
	if path == "" {
		if dir := os.Getenv("SHOAL_DATA_DIR"); dir != "" {
			if b, err := os.ReadFile(node.HTTPSCAPath(dir)); err == nil {
				return b, false, nil
			}
		}
		return nil, false, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", what, err)
	}
	return b, true, nil
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
