package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"shoal/internal/logging"
)

// version is set at build time with -ldflags "-X main.version=...";
// shoalVersion falls back to what the go command stamped into the binary.
var version string

// shoalVersion is the version the binary reports and gossips.
func shoalVersion() string {
	if version != "" {
		return version
	}
	return buildVersion(debug.ReadBuildInfo())
}

// buildVersion names the build from what the go command records: a
// tagged module version as it is, else "dev" with the commit (12 hex
// digits, "-dirty" when the tree had changes) and its date, e.g.
// "dev-3f2a9c1e0b7d (2026-12-06)". Without build information: "dev".
func buildVersion(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, when string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	v := "dev-" + rev[:min(12, len(rev))]
	if dirty {
		v += "-dirty"
	}
	if len(when) >= 10 {
		v += " (" + when[:10] + ")"
	}
	return v
}

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
		Version:       shoalVersion(),
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
	root.SetVersionTemplate("shoal {{.Version}}\n")
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
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "shoal", shoalVersion())
		},
	}
}
