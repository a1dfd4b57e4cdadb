package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"shoal/api"
)

func statusCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's leader, Raft servers and health",
		Long: `Show the leader, the Raft servers (voters and non-voters) and the cluster's
health as the agent at --addr sees it. Any agent answers.

  shoal status
  SHOAL_ADDR=mac2:7948 SHOAL_TOKEN=$KEY shoal status -o json`,
		Args: cobra.NoArgs,
		RunE: show(&f, (*api.Client).Status, func(w io.Writer, s *api.Status) error {
			leader := "none"
			if s.Leader != "" {
				leader = fmt.Sprintf("%s (%s, %s)", s.LeaderName, short(s.Leader), s.LeaderAddr)
			}
			fmt.Fprintf(w, "Leader:            %s\n", leader)
			fmt.Fprintf(w, "Health:            %s\n", s.Health)
			fmt.Fprintf(w, "Failure tolerance: %d\n", s.FailureTolerance)
			fmt.Fprintf(w, "Nodes:             %d alive of %d\n", s.NodesAlive, s.Nodes)
			fmt.Fprintf(w, "Raft index:        %d\n", s.Index)
			fmt.Fprintf(w, "Answered by:       %s (%s)\n\n", s.NodeName, s.Role)
			tw := table(w)
			fmt.Fprintln(tw, "ID\tNAME\tADDRESS\tSTATUS\tVOTER\tLEADER")
			for _, srv := range s.Servers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%v\n", short(srv.ID), srv.Name, srv.Address, srv.Status, srv.Voter, srv.Leader)
			}
			return tw.Flush()
		}),
	}
	f.register(cmd)
	return cmd
}
