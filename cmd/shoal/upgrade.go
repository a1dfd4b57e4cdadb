package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/internal/version"
)

// nodeVersion is a node's version with the protocol it speaks, as
// shoal node ls shows it ("0.9.0+3f2a9c1e0b7d p2"); a node of a build
// from before protocols shows p1.
func nodeVersion(v string, protocol int) string {
	if v == "" {
		v = "-"
	}
	return fmt.Sprintf("%s p%d", v, version.Of(protocol))
}

// upgradeReport is what shoal upgrade-check finds.
type upgradeReport struct {
	Ready bool `json:"ready"`
	// Target is the window of protocols the next release works with;
	// TargetFrom says where it came from.
	Target     version.Window `json:"target"`
	TargetFrom string         `json:"target_from"`
	// Protocol is the cluster's recorded protocol.
	Protocol int             `json:"protocol"`
	Problems []string        `json:"problems"` // each one stops the upgrade
	Warnings []string        `json:"warnings"` // worth knowing, not stopping
	Nodes    []upgradeNode   `json:"nodes"`
	Order    []string        `json:"order"` // the nodes to upgrade, in this order
	Cluster  upgradeRaftInfo `json:"raft"`
}

type upgradeNode struct {
	Name     string `json:"name"`
	ID       string `json:"id"`
	Role     string `json:"role"`
	Status   string `json:"status"`
	Version  string `json:"version"`
	Protocol int    `json:"protocol"`
	OK       bool   `json:"ok"` // the next release works with it
}

type upgradeRaftInfo struct {
	Leader           string `json:"leader"`
	Voters           int    `json:"voters"`
	FailureTolerance int    `json:"failure_tolerance"`
}

func upgradeCheckCmd() *cobra.Command {
	var f clusterFlags
	var to string
	var minProtocol int
	cmd := &cobra.Command{
		Use:   "upgrade-check",
		Short: "Tell whether the cluster can take the next release, one node at a time",
		Long: `Check, before a rolling upgrade, that the cluster can take the next release
one node at a time without stopping: every node speaks a protocol the next
release works with (a release works with its own protocol and the one before,
so a cluster holds two adjacent releases while it is upgraded), a leader is
known, and Raft tolerates losing the server being replaced. It prints every
node's version and protocol, what stands in the way, and the order to upgrade
in (the leader last, so that leadership moves once). The exit status is 0
when the cluster is ready, 1 when it is not.

The next release's window comes from its binary (--to ./shoal-new runs
"./shoal-new version -o json"), or --min-protocol; without either the check
takes the newest protocol in the cluster as the oldest the next release works
with: a cluster still holding nodes of an older protocol is mid-upgrade, and
must finish it first. deploy/README.md walks through a rolling upgrade under
systemd, compose and Kubernetes.`,
		Example: `  shoal upgrade-check
  shoal upgrade-check --to ./shoal-0.10.0
  shoal upgrade-check -o json | jq -r '.order[]'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			target, from := version.Window{}, ""
			switch {
			case to != "" && minProtocol > 0:
				return fmt.Errorf("--to and --min-protocol: give one")
			case to != "":
				w, build, err := binaryWindow(to)
				if err != nil {
					return err
				}
				target, from = w, fmt.Sprintf("%s (shoal %s)", to, build)
			case minProtocol > 0:
				target, from = version.Window{Min: minProtocol, Max: max(minProtocol+1, version.Protocol)}, "--min-protocol"
			}
			c, ctx, cancel, err := f.client()
			if err != nil {
				return err
			}
			defer cancel()
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(ctx)
			if err != nil {
				return err
			}
			r := checkUpgrade(st, nodes, target, from)
			if f.json() {
				if err := printJSON(cmd.OutOrStdout(), r); err != nil {
					return err
				}
			} else {
				printUpgrade(cmd.OutOrStdout(), r)
			}
			if !r.Ready {
				return codedError{code: 1, msg: "the cluster cannot take the next release yet: " + strings.Join(r.Problems, "; ")}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&to, "to", "", "the next release's shoal binary: its protocols are read from it")
	cmd.Flags().IntVar(&minProtocol, "min-protocol", 0, "the oldest protocol the next release works with (default: the newest in the cluster)")
	return cmd
}

// binaryWindow runs "bin version -o json" and reads its window.
func binaryWindow(bin string) (version.Window, string, error) {
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		return version.Window{}, "", fmt.Errorf("--to %s: %v (is it a shoal binary of protocol 2 or later, for this machine?)", bin, err)
	}
	var v struct {
		Version     string `json:"version"`
		Protocol    int    `json:"protocol"`
		MinProtocol int    `json:"min_protocol"`
	}
	if err := json.Unmarshal(out, &v); err != nil || v.Protocol < 1 || v.MinProtocol < 1 || v.MinProtocol > v.Protocol {
		return version.Window{}, "", fmt.Errorf("--to %s: its version -o json gives no protocol window", bin)
	}
	return version.Window{Min: v.MinProtocol, Max: v.Protocol}, v.Version, nil
}

// checkUpgrade decides whether the cluster (st, nodes) can take a release
// of window target (zero: one whose oldest protocol is the newest in the
// cluster).
func checkUpgrade(st *api.Status, nodes []*api.Node, target version.Window, from string) upgradeReport {
	r := upgradeReport{Protocol: version.Of(st.Protocol), Problems: []string{}, Warnings: []string{}, Order: []string{}}
	newest := 0
	for _, n := range nodes {
		if n.Status != api.StatusLeft {
			newest = max(newest, version.Of(n.Protocol))
		}
	}
	if target == (version.Window{}) {
		target, from = version.Window{Min: newest, Max: newest + 1}, fmt.Sprintf("assumed: the next release works with protocol %d, the newest in the cluster", newest)
	}
	r.Target, r.TargetFrom = target, from

	if st.Leader == "" {
		r.Problems = append(r.Problems, "no leader is known: the cluster must be healthy before a node of it is replaced")
	}
	voters := 0
	for _, s := range st.Servers {
		if s.Voter {
			voters++
		}
	}
	r.Cluster = upgradeRaftInfo{Leader: st.LeaderName, Voters: voters, FailureTolerance: st.FailureTolerance}
	switch {
	case voters == 1:
		r.Warnings = append(r.Warnings, "one Raft server: while it restarts no leader is known (requests in flight continue; loads, drains and joins wait). Three servers upgrade without that pause")
	case st.FailureTolerance < 1:
		r.Problems = append(r.Problems, fmt.Sprintf("Raft tolerates no server failure now (%d voters): replacing one would lose the majority; bring the failed servers back first", voters))
	}

	var lag []string
	for _, n := range nodes {
		if n.Status == api.StatusLeft {
			continue
		}
		p := version.Of(n.Protocol)
		un := upgradeNode{Name: n.Name, ID: n.ID, Role: n.Role, Status: n.Status, Version: n.Version, Protocol: p, OK: target.Has(p) || p > target.Max}
		if p > target.Max {
			r.Warnings = append(r.Warnings, fmt.Sprintf("%s already runs protocol %d, newer than the release checked (%v)", n.Name, p, target))
		}
		if !un.OK {
			lag = append(lag, fmt.Sprintf("%s (shoal %s, protocol %d)", n.Name, n.Version, p))
		}
		if n.Status != api.StatusAlive {
			r.Warnings = append(r.Warnings, fmt.Sprintf("%s is %s: it is not upgraded with the others; once it returns it must still speak a protocol of the cluster", n.Name, n.Status))
		}
		if n.Draining {
			r.Warnings = append(r.Warnings, n.Name+" is drained (shoal node undrain it when its upgrade is done)")
		}
		r.Nodes = append(r.Nodes, un)
	}
	if len(lag) > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("the next release works with %v, and these nodes speak an older one: %s; upgrade them to this cluster's newest release first (an upgrade is still under way)",
			target, strings.Join(lag, ", ")))
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Name < r.Nodes[j].Name })
	// Clients, then the servers that follow, then the leader: leadership
	// moves once.
	rank := func(n upgradeNode) int {
		switch {
		case n.ID == st.Leader:
			return 2
		case n.Role == "server":
			return 1
		}
		return 0
	}
	order := append([]upgradeNode(nil), r.Nodes...)
	sort.SliceStable(order, func(i, j int) bool { return rank(order[i]) < rank(order[j]) })
	for _, n := range order {
		if n.Status == api.StatusAlive {
			r.Order = append(r.Order, n.Name)
		}
	}
	r.Ready = len(r.Problems) == 0
	return r
}

func printUpgrade(w io.Writer, r upgradeReport) {
	tw := table(w)
	fmt.Fprintln(tw, "NODE\tROLE\tSTATUS\tVERSION\tPROTOCOL\tNEXT RELEASE")
	for _, n := range r.Nodes {
		ok := "works with it"
		if !n.OK {
			ok = "upgrade it first"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", n.Name, n.Role, n.Status, n.Version, n.Protocol, ok)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nraft: leader %s, %d voters, tolerates %d failure(s); cluster protocol %d\n", orDash(r.Cluster.Leader), r.Cluster.Voters, r.Cluster.FailureTolerance, r.Protocol)
	fmt.Fprintf(w, "next release: %v (%s)\n", r.Target, r.TargetFrom)
	for _, s := range r.Warnings {
		fmt.Fprintln(w, "warning: "+s)
	}
	for _, s := range r.Problems {
		fmt.Fprintln(w, "problem: "+s)
	}
	if r.Ready {
		fmt.Fprintf(w, "ready: upgrade one node at a time, in this order: %s\n", strings.Join(r.Order, ", "))
		fmt.Fprintln(w, "  for each: shoal node drain NODE; stop it (SIGTERM drains its requests); start the new binary on the same data dir; wait until shoal node ls lists it alive; shoal node undrain NODE")
	}
}
