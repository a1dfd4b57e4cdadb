package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"shoal/internal/version"
	"strings"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"shoal/engine/gguf"
	"shoal/hub"
)

func pullCmd() *cobra.Command {
	var (
		opts   hub.PullOptions
		store  string
		list   bool
		remove bool
		quiet  bool
		onlyP  bool
		output string
	)
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Download a GGUF model from Hugging Face into the local model store",
		Long: `Download a GGUF model from the Hugging Face hub into the local model store,
verified by its sha256 and resumable: an interrupted pull continues where it
stopped, and a model already in the store is not downloaded again.

REF is one of:
  OWNER/REPO              the repository's Q4_K_M file, else its only .gguf
  OWNER/REPO:QUANT        the file whose name carries QUANT (case-insensitive)
  OWNER/REPO/FILE.gguf    one file (it may be in a subfolder)
A split model (NAME-00001-of-00003.gguf, ...) is pulled whole.

The store is $SHOAL_MODELS or ~/.shoal/models (--store): blobs/ holds the
files named by sha256, manifests/ names the models
(qwen2.5-0.5b-instruct:q4_k_m for Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M).

Environment:
  HF_TOKEN      access token for gated or private repositories (accept the
                model's license on its page first); also HUGGING_FACE_HUB_TOKEN
  HF_ENDPOINT   the hub's URL (default https://huggingface.co; a mirror works)`,
		Example: `  shoal pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
  shoal run --model qwen2.5-0.5b-instruct:q4_k_m -p "Hello"
  shoal up --model qwen2.5-0.5b-instruct:q4_k_m
  llama-cli -m "$(shoal pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M --path)"   # the file, for other tools
  HF_TOKEN=hf_... shoal pull meta-llama/SOME-GATED-REPO-GGUF:Q8_0
  HF_ENDPOINT=https://hf-mirror.example shoal pull Qwen/Qwen2.5-0.5B-Instruct-GGUF
  shoal pull --offline Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M   # the store only
  shoal pull --list -o json
  shoal pull --rm qwen2.5-0.5b-instruct:q4_k_m`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list {
				return cobra.NoArgs(cmd, args)
			}
			if len(args) != 1 {
				return errors.New("want one REF, e.g. shoal pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M (or --list)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			st, err := hub.OpenStore(store)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case list:
				return listStore(out, st, output)
			case remove:
				if err := st.Remove(args[0]); err != nil {
					return err
				}
				fmt.Fprintf(out, "removed %s\n", args[0])
				return nil
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			c := hub.NewClient()
			c.UserAgent = "shoal/" + version.Release
			opts.Client = c
			// --path is for $(...): a model already stored is answered
			// from the store, without asking the hub.
			opts.Stored = onlyP
			var prog *pullProgress
			if !quiet && !onlyP {
				prog = &pullProgress{w: cmd.ErrOrStderr(), what: args[0], tty: isTerminal(cmd.ErrOrStderr())}
				opts.Progress = prog.update
			}
			m, err := st.Pull(ctx, args[0], opts)
			if prog != nil {
				prog.finish()
			}
			if err != nil {
				if errors.Is(err, context.Canceled) {
					return errors.New("pull interrupted; run it again to resume")
				}
				return err
			}
			if len(m.Parts) > 1 {
				if m, err = joinSplit(st, m, cmd.ErrOrStderr(), quiet || onlyP); err != nil {
					return err
				}
			}
			paths := st.Paths(*m)
			switch {
			case output == "json":
				return writeJSON(out, storedModel(st, *m))
			case onlyP:
				fmt.Fprintln(out, strings.Join(paths, "\n"))
				return nil
			}
			load, _ := st.LoadPath(*m)
			fmt.Fprintf(out, "pulled %s (%s, %s)\n  file %s\n", m.Name, m.Ref, human(m.Size()), load)
			if len(paths) > 1 {
				fmt.Fprintf(out, "  its %d parts joined into one GGUF, the file above: %s\n", len(paths), strings.Join(paths, " "))
			}
			fmt.Fprintf(out, "use it: shoal run --model %s   or   shoal up --model %s\n", m.Name, m.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Name, "name", "", "name in the store (default: repository without -GGUF, lowercased, ':' quantization)")
	f.StringVar(&store, "store", "", "model store directory (default $SHOAL_MODELS or ~/.shoal/models)")
	f.StringVar(&opts.Revision, "revision", "main", "branch, tag or commit of the repository")
	f.BoolVar(&opts.Offline, "offline", false, "use only the store; fail if the model is not there")
	f.BoolVar(&list, "list", false, "list the models in the store")
	f.BoolVar(&remove, "rm", false, "remove the model named REF from the store (blobs other models use are kept)")
	f.BoolVar(&onlyP, "path", false, "print only the local file path(s), one a line (for $(...) in scripts); a model already stored is answered from the store without asking the hub")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// storedModelJSON is a manifest with its local files, for -o json.
type storedModelJSON struct {
	hub.Manifest
	Size  int64    `json:"size"`
	Files []string `json:"files"`
	// Path is the file engines load: the one part, or a split model's
	// joined file ("" until joined).
	Path string `json:"path"`
}

func storedModel(st *hub.Store, m hub.Manifest) storedModelJSON {
	load, _ := st.LoadPath(m)
	return storedModelJSON{Manifest: m, Size: m.Size(), Files: st.Paths(m), Path: load}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func listStore(w io.Writer, st *hub.Store, output string) error {
	ms, err := st.List()
	if err != nil {
		return err
	}
	if output == "json" {
		all := make([]storedModelJSON, 0, len(ms))
		for _, m := range ms {
			all = append(all, storedModel(st, m))
		}
		return writeJSON(w, all)
	}
	if len(ms) == 0 {
		fmt.Fprintf(w, "no models in %s; get one with: shoal pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M\n", st.Dir)
		return nil
	}
	tw := table(w)
	fmt.Fprintln(tw, "NAME\tSIZE\tPARTS\tREF\tPATH")
	for _, m := range ms {
		ref := m.Ref
		if m.Revision != "" && m.Revision != "main" {
			ref += "@" + m.Revision
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", m.Name, human(m.Size()), len(m.Parts), ref, st.Paths(m)[0])
	}
	return tw.Flush()
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// pullProgress shows a download: a progress bar on a terminal, a line
// every 10% otherwise.
type pullProgress struct {
	w    io.Writer
	what string
	tty  bool
	bar  *progressbar.ProgressBar
	next int64 // percent of the next plain line
}

func (p *pullProgress) update(done, total int64) {
	if total <= 0 {
		return
	}
	if p.tty {
		if p.bar == nil {
			p.bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(p.w),
				progressbar.OptionShowBytes(true), progressbar.OptionSetDescription("pulling "+p.what),
				progressbar.OptionSetPredictTime(true), progressbar.OptionShowElapsedTimeOnFinish(),
				progressbar.OptionThrottle(200e6), progressbar.OptionClearOnFinish())
		}
		p.bar.Set64(done)
		return
	}
	pct := done * 100 / total
	if pct < p.next {
		return
	}
	fmt.Fprintf(p.w, "pulling %s: %3d%% (%s of %s)\n", p.what, pct, human(done), human(total))
	p.next = pct/10*10 + 10
}

func (p *pullProgress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}

// localModel turns a --model argument into a GGUF file on this machine: a
// file path as it is; else a model in the store (qwen2.5-0.5b-instruct:q4_k_m);
// else a hub reference (Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M), answered
// from the store when it holds it, else pulled into the store first with its
// progress on w. name is the store's name of the model, which the model is
// served under (the store's file is named after its sha256): also for the
// path of a store's file; "" for any other file.
func localModel(ctx context.Context, arg string, w io.Writer) (path, name string, err error) {
	return resolveModel(ctx, arg, w, true)
}

// resolveModel is localModel; with pull false a hub reference the store
// does not hold is an error instead of a download.
func resolveModel(ctx context.Context, arg string, w io.Writer, pull bool) (path, name string, err error) {
	if arg == "" {
		return "", "", nil
	}
	if _, err := os.Stat(arg); err == nil {
		if m, ok := hub.ModelAt(arg); ok {
			return arg, m.Name, nil
		}
		return arg, "", nil
	}
	st, err := hub.OpenStore("")
	if err != nil {
		return "", "", err
	}
	var m *hub.Manifest
	_, rerr := hub.ParseRef(arg)
	isRef := rerr == nil && strings.Contains(arg, "/")
	if got, gerr := st.Get(arg); gerr == nil {
		m = got
	} else if isRef && pull {
		c := hub.NewClient()
		c.UserAgent = "shoal/" + version.Release
		prog := &pullProgress{w: w, what: arg, tty: isTerminal(w)}
		m, err = st.Pull(ctx, arg, hub.PullOptions{Client: c, Progress: prog.update, Stored: true})
		prog.finish()
		if err != nil {
			return "", "", err
		}
	} else if isRef {
		if m, err = st.Pull(ctx, arg, hub.PullOptions{Offline: true}); err != nil {
			return "", "", fmt.Errorf("model %q: %w: shoal pull %s first, or read it from the hub in place with --hub %s", arg, err, arg, arg)
		}
	} else {
		return "", "", fmt.Errorf("model %q: no such file, no model of that name in the store %s (shoal pull --list), and not a hub reference (OWNER/REPO[:QUANT])", arg, st.Dir)
	}
	if len(m.Parts) > 1 {
		if m, err = joinSplit(st, m, w, false); err != nil {
			return "", "", err
		}
	}
	path, _ = st.LoadPath(*m)
	return path, m.Name, nil
}

// joinSplit gives a split model (GGUF parts -0000N-of-0000M) its one-file
// form in the store, which the engine loads, once.
func joinSplit(st *hub.Store, m *hub.Manifest, w io.Writer, quiet bool) (*hub.Manifest, error) {
	if _, ok := st.LoadPath(*m); ok {
		return m, nil
	}
	if !quiet {
		fmt.Fprintf(w, "joining the %d parts of %s into one GGUF (%s)...\n", len(m.Parts), m.Name, human(m.Size()))
	}
	paths := st.Paths(*m)
	return st.Join(m.Name, func(out io.Writer) error { return gguf.Join(paths, out) })
}
