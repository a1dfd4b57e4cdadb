package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"shoal/api"
)

func membersCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "members",
		Short: "Show the raw gossip view of the agent at --addr",
		Long: `Show the gossip members as this one agent sees them (not the Raft state):
useful when a node does not appear in 'shoal node ls'.

  shoal members
  shoal members --addr 10.0.0.7:7948 -o json`,
		Args: cobra.NoArgs,
		RunE: show(&f, (*api.Client).Members, func(w io.Writer, ms []api.Member) error {
			tw := table(w)
			fmt.Fprintln(tw, "NAME\tID\tGOSSIP\tQUIC\tROLE\tSTATUS\tVERSION")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, short(m.ID), m.Addr, m.RPCAddr, m.Role, m.Status, m.Version)
			}
			return tw.Flush()
		}),
	}
	f.register(cmd)
	return cmd
}
