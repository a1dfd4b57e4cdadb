package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/internal/logging"
	"shoal/internal/version"
)

// shoalVersion is the version the binary reports and gossips
// ("0.9.0+3f2a9c1e0b7d").
func shoalVersion() string { return version.String() }

var logOpts logging.Options

func commands() []*cobra.Command {
	return []*cobra.Command{
		runCmd(),
		logitsCmd(),
		tokenizeCmd(),
		genModelCmd(),
		benchCmd(),
		versionCmd(),
		agentCmd(),
		statusCmd(),
		nodeCmd(),
		membersCmd(),
		tokenCmd(),
		chatCmd(),
		upCmd(),
		benchEndpointCmd(),
		modelCmd(),
		placementCmd(),
		pullCmd(),
		upgradeCheckCmd(),
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "shoal",
		Short: "Run one large language model on a cluster of ordinary machines",
		Long: `shoal serves one LLM from a cluster of ordinary machines. Every machine runs
the same binary; the engine commands below also work on a single machine.

Quick start:
  shoal gen-model --arch llama --type q4_k --out model.gguf   # a small random-weight model
  shoal run --model model.gguf -p "Hello"                     # generate text`,
		Version:       shoalVersion(), // --version prints versionText (below)
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Name() == "agent" {
				if err := flagsFromEnv(cmd); err != nil {
					return err
				}
			}
			_, err := logging.Setup(logOpts)
			return err
		},
	}
	root.PersistentFlags().StringVar(&logOpts.Level, "log-level", "warn", "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&logOpts.Format, "log-format", "console", "log format: console or json")
	cobra.AddTemplateFunc("versionText", func() string { return versionText(buildReport()) })
	root.SetVersionTemplate("{{versionText}}")
	root.AddCommand(commands()...)
	strictGroups(root)
	return root
}

// strictGroups makes every command that only groups others (shoal model,
// shoal node, ...) refuse an unknown subcommand with an error, so the
// process exits non-zero, instead of printing help and exiting 0; alone it
// still prints its help.
func strictGroups(c *cobra.Command) {
	for _, sub := range c.Commands() {
		strictGroups(sub)
	}
	if c.HasParent() && c.HasSubCommands() && c.Run == nil && c.RunE == nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for %q (see '%s --help')", args[0], cmd.CommandPath(), cmd.CommandPath())
			}
			return nil
		}
		c.RunE = func(cmd *cobra.Command, args []string) error { return cmd.Help() }
	}
}

func main() {
	if err := rootCmd().Execute(); err != nil {
		// One line, so scripts and people see the reason at once.
		fmt.Fprintln(os.Stderr, "shoal: "+oneLine(err))
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(int(ee))
		}
		var ce codedError
		if errors.As(err, &ce) {
			os.Exit(ce.code)
		}
		os.Exit(1)
	}
}

type exitError int

// codedError is an error the process exits with a code of its own for, so
// a service manager can tell it apart (systemd RestartPreventExitStatus).
type codedError struct {
	code int
	msg  string
}

func (e codedError) Error() string { return e.msg }

// exitRemoved is the exit status of an agent whose node was removed from
// the cluster: restarting it cannot help.
const exitRemoved = 3

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func versionCmd() *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the version, protocol, kernels and GPUs of this build",
		Long: `Print what this binary is: its release and commit, the protocol it speaks to
other nodes (and the oldest it still works with: a cluster may run two adjacent
releases while it is upgraded one node at a time), its Go version, the CPU
kernel set it runs here and the Vulkan GPUs it finds. shoal --version prints
the same. shoal node ls shows every node's version; shoal upgrade-check whether
the cluster can take the next release.`,
		Example: `  shoal version
  shoal version -o json | jq -r .protocol`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r := buildReport()
			switch output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			case "table", "text", "":
				fmt.Fprint(cmd.OutOrStdout(), versionText(r))
				return nil
			}
			return fmt.Errorf("--output %q: want table or json", output)
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return c
}

// versionReport is what shoal version prints.
type versionReport struct {
	version.Build
	Version     string   `json:"version"` // as nodes gossip it
	Protocol    int      `json:"protocol"`
	MinProtocol int      `json:"min_protocol"`
	Platform    string   `json:"platform"`
	Kernels     string   `json:"kernels"`            // the CPU kernel set in use
	Levels      []string `json:"kernel_levels"`      // the sets this CPU can run, best first
	GPUs        []string `json:"gpus"`               // Vulkan devices found
	GPUNote     string   `json:"gpu_note,omitempty"` // why none, when none
}

func buildReport() versionReport {
	b := version.Current()
	r := versionReport{Build: b, Version: b.String(), Protocol: version.Protocol, MinProtocol: version.MinProtocol,
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Kernels: kernels.Path(), Levels: kernels.Levels(), GPUs: []string{}}
	if r.Go == "" {
		r.Go = runtime.Version()
	}
	gs, err := vk.GPUs()
	if err != nil {
		r.GPUNote = err.Error()
	}
	for _, g := range gs {
		r.GPUs = append(r.GPUs, fmt.Sprintf("vulkan:%d %s (%s, %d MiB)", g.Index, g.Name, g.TypeName(), g.Memory>>20))
	}
	if err == nil && len(gs) == 0 {
		r.GPUNote = "no Vulkan device"
	}
	return r
}

func versionText(r versionReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "shoal %s\n", r.Version)
	if r.Commit != "" {
		fmt.Fprintf(&b, "  commit    %s", r.Commit)
		if r.Date != "" {
			fmt.Fprintf(&b, " (%s)", r.Date)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  protocol  %d (works with nodes of %s)\n", r.Protocol, version.Window{Min: r.MinProtocol, Max: r.Protocol})
	fmt.Fprintf(&b, "  go        %s %s\n", r.Go, r.Platform)
	fmt.Fprintf(&b, "  kernels   %s (this CPU runs %s)\n", r.Kernels, strings.Join(r.Levels, ", "))
	if len(r.GPUs) == 0 {
		fmt.Fprintf(&b, "  gpus      none (%s)\n", r.GPUNote)
	}
	for i, g := range r.GPUs {
		label := "gpus"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(&b, "  %-9s %s\n", label, g)
	}
	return b.String()
}
