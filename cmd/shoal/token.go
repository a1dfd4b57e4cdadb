package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
)

func tokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke join tokens and API keys",
		Long: `Join tokens let new machines join ('shoal agent --token ...'); they carry the
hash of the cluster CA, so the new machine trusts only this cluster. API
keys are admin (the CLI; once one exists the bootstrap secret stops working
as an API key), inference (the OpenAI endpoint, optionally for named
models) or read (status, lists, dashboard).

  shoal token create --ttl 24h --description "office linux box"
  shoal token create --kind admin
  shoal token ls
  shoal token rotate abc123
  shoal token revoke abc123`,
	}
	cmd.AddCommand(tokenCreateCmd(), tokenLsCmd(), tokenRotateCmd(), tokenRevokeCmd())
	return cmd
}

func tokenCreateCmd() *cobra.Command {
	var f clusterFlags
	var req api.TokenRequest
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a join token, or an API key with --kind admin|inference|read",
		Long: `Create a token. The secret is printed once; only its hash is stored.

API keys have scopes: admin keys can do everything; inference keys call
only the OpenAI endpoint (/v1/chat/completions, /v1/completions,
/v1/models), for every model or only those given with --model; read keys
see status, nodes, models and the dashboard but change nothing.

  shoal token create                       # a client join token that never expires
  shoal token create --role server         # a join token for another Raft server
  shoal token create --ttl 1h              # expires in an hour
  shoal token create --kind admin -o json  # an API key for scripts
  shoal token create --kind inference --model llama-3-8b --description "chat app"
  shoal token create --kind read           # for a wall display of the dashboard`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := f.client()
			if err != nil {
				return err
			}
			defer cancel()
			t, err := c.CreateToken(ctx, req)
			if err != nil {
				return err
			}
			return printNewToken(cmd, &f, t)
		},
	}
	cmd.Flags().StringVar(&req.Kind, "kind", "join", "join, admin, inference (the OpenAI endpoint only) or read (status, lists, dashboard)")
	cmd.Flags().StringVar(&req.Role, "role", "", "with a join token: the role it admits, client (default) or server (servers hold the cluster CA key)")
	cmd.Flags().StringSliceVar(&req.Models, "model", nil, "with --kind inference: the only model(s) the key may use (repeat or comma-separate)")
	cmd.Flags().StringVar(&req.Description, "description", "", "what the token is for")
	cmd.Flags().StringVar(&req.TTL, "ttl", "", "lifetime such as 24h (default: no expiry)")
	f.register(cmd)
	return cmd
}

func tokenLsCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List tokens (secrets are never shown again)",
		Long: `List tokens with their kind and state.

  shoal token ls
  shoal token ls -o json`,
		Args: cobra.NoArgs,
		RunE: show(&f, (*api.Client).Tokens, func(w io.Writer, toks []*api.Token) error {
			tw := table(w)
			fmt.Fprintln(tw, "ID\tKIND\tSTATE\tCREATED\tEXPIRES\tDESCRIPTION")
			now := time.Now()
			for _, t := range toks {
				state := "valid"
				switch {
				case t.Revoked:
					state = "revoked"
				case !t.Valid(now):
					state = "expired"
				}
				exp := "never"
				if t.ExpiresAt != nil {
					exp = t.ExpiresAt.Local().Format(time.DateTime)
				}
				kind := t.Kind
				if len(t.Models) > 0 {
					kind += " (" + strings.Join(t.Models, ",") + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, kind, state, t.CreatedAt.Local().Format(time.DateTime), exp, t.Description)
			}
			return tw.Flush()
		}),
	}
	f.register(cmd)
	return cmd
}

func tokenRevokeCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token by its ID",
		Long: `Revoke a token: it no longer admits nodes or authorizes API calls. Nodes that
already joined keep their certificates. The bootstrap secret has the ID
"bootstrap" and can be revoked too.

  shoal token revoke abc123`,
		Args: exactArgs(1, "a token ID (see 'shoal token ls')"),
		RunE: f.actOnName(func(ctx context.Context, c *api.Client, name string) error {
			return c.RevokeToken(ctx, name)
		}, "id", "token", "revoked"),
	}
	f.register(cmd)
	return cmd
}

func tokenRotateCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "rotate ID",
		Short: "Give a token a new secret; the old secret stops working",
		Long: `Rotate a token: it keeps its ID, kind, scope and expiry, and gets a new
secret, printed once. The old secret stops admitting nodes and authorizing
API calls at once; nodes that already joined keep their certificates. Use
it when a join token or key may have leaked but its holders should go on
(hand them the new one). The bootstrap secret is not rotated: revoke it.

  shoal token rotate abc123
  shoal token rotate abc123 -o json`,
		Args: exactArgs(1, "a token ID (see 'shoal token ls')"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := f.client()
			if err != nil {
				return err
			}
			defer cancel()
			t, err := c.RotateToken(ctx, args[0])
			if err != nil {
				return err
			}
			return printNewToken(cmd, &f, t)
		},
	}
	f.register(cmd)
	return cmd
}

// printNewToken prints a token's secret, shown this once (all of it with
// -o json).
func printNewToken(cmd *cobra.Command, f *clusterFlags, t *api.NewToken) error {
	if f.json() {
		return printJSON(cmd.OutOrStdout(), t)
	}
	fmt.Fprintln(cmd.OutOrStdout(), t.Secret)
	return nil
}
