package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"shoal/api"
)

func nodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List, drain, lead and remove the cluster's nodes",
		Long: `List, drain and remove nodes, and move the coordinator's leadership. A node is
named by its ID, a unique ID prefix or its name.

  shoal node ls
  shoal node drain mac2       # move mac2's models elsewhere, place nothing new on it
  shoal node undrain mac2
  shoal node lead mac1        # make server mac1 the Raft leader
  shoal node rm 3f2a9c1e      # remove from Raft, gossip and the state`,
	}
	cmd.AddCommand(nodeLsCmd(), nodeDrainCmd(true), nodeDrainCmd(false), nodeLeadCmd(), nodeRmCmd())
	return cmd
}

func nodeLsCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List nodes with their role, status and measured capabilities",
		Long: `List nodes with their role, status, version (with the protocol it speaks,
p2) and the capabilities each measured at start (memory, float32 matmul
GFLOPS, memory bandwidth). shoal upgrade-check says whether the cluster can
take the next release.

  shoal node ls
  shoal node ls -o json | jq '.[] | select(.status=="alive") | .name'`,
		Args: cobra.NoArgs,
		RunE: show(&f, (*api.Client).Nodes, func(w io.Writer, nodes []*api.Node) error {
			tw := table(w)
			fmt.Fprintln(tw, "ID\tNAME\tADDRESS\tROLE\tSTATUS\tVERSION\tMEMORY\tFREE\tCORES\tGFLOPS\tGB/s\tACCEL\tGPU")
			for _, n := range nodes {
				st := string(n.Status)
				if n.Draining {
					st += ",draining"
				}
				accel := n.Caps.Accel
				if accel == "" {
					accel = "-"
				}
				gpu := "-"
				if n.Caps.GPU != "" {
					gpu = fmt.Sprintf("%s (%s, %.1f GB/s)", n.Caps.GPU, gib(n.Caps.GPUMem), n.Caps.GPUGBps)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%.1f\t%.1f\t%s\t%s\n", short(n.ID), n.Name, n.RPCAddr, n.Role, st,
					nodeVersion(n.Version, n.Protocol), gib(n.Caps.MemTotal), gib(n.Caps.MemFree), n.Caps.Cores, n.Caps.GFLOPS, n.Caps.MemGBps, accel, gpu)
			}
			return tw.Flush()
		}),
	}
	f.register(cmd)
	return cmd
}

func nodeDrainCmd(drain bool) *cobra.Command {
	var f clusterFlags
	use, short, long := "drain ID", "Move a node's models elsewhere and keep new placements off it", `Mark a node draining: the leader moves the models it runs to other nodes
(make-before-break: the old plan serves until the new one has loaded, and a
driver that moves finishes its streams first) and places nothing new on it.
It stays in the cluster; before a node's maintenance or upgrade, drain it,
wait until shoal placement show no longer lists it, then stop it.

  shoal node drain mac2`
	if !drain {
		use, short, long = "undrain ID", "Let new placements use a drained node again", `Clear a node's draining mark.

  shoal node undrain mac2`
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long,
		Args: exactArgs(1, "a node ID or name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := f.client()
			if err != nil {
				return err
			}
			defer cancel()
			if err := c.Drain(ctx, args[0], drain); err != nil {
				return err
			}
			if f.json() {
				return printJSON(cmd.OutOrStdout(), map[string]any{"node": args[0], "draining": drain})
			}
			verb := "draining"
			if !drain {
				verb = "no longer draining"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s\n", args[0], verb)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func nodeLeadCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "lead ID",
		Short: "Make a server node the coordinator's Raft leader",
		Long: `Hand the Raft leadership to a server node: the leader brings it up to date
and steps down in its favour, with no election timeout and no lost write.
Do it before stopping or removing the leader's machine ('shoal node rm'
refuses the leader), or to keep the leadership off a busy node. The node
must be a voter ('shoal status' lists the servers and their votes); a
client node cannot lead.

  shoal node lead mac1
  shoal node lead mac1 -o json`,
		Args: exactArgs(1, "a node ID or name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := f.client()
			if err != nil {
				return err
			}
			defer cancel()
			if err := c.TransferLeader(ctx, args[0]); err != nil {
				return err
			}
			if f.json() {
				return printJSON(cmd.OutOrStdout(), map[string]any{"node": args[0], "leader": true})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s leads the coordinator\n", args[0])
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func nodeRmCmd() *cobra.Command {
	var f clusterFlags
	cmd := &cobra.Command{
		Use:   "rm ID",
		Short: "Remove a node from Raft, gossip and the cluster state",
		Long: `Remove a node: the leader takes it out of the Raft configuration and the
state, asks it to leave gossip and stop, and revokes its certificate: no
node of the cluster accepts a connection from it again, and started again
from its data dir it stops at once. A node that is down is removed too. To
bring the machine back, start it with a fresh --data-dir and a new join
token ('shoal token create').

  shoal node rm linux1`,
		Args: exactArgs(1, "a node ID or name"),
		RunE: f.actOnName(func(ctx context.Context, c *api.Client, name string) error {
			return c.RemoveNode(ctx, name)
		}, "node", "node", "removed"),
	}
	f.register(cmd)
	return cmd
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%s needs %s (see --help)", cmd.CommandPath(), what)
		}
		return nil
	}
}
