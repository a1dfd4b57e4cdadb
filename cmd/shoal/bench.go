package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/engine/bench"
	"shoal/engine/device/vulkan"
	"shoal/engine/kernels"
	"shoal/engine/kv"
	"shoal/engine/model"
)

func benchCmd() *cobra.Command {
	var (
		path            string
		threads, pp, tg string
		reps, bwMB      int
		depth           int
		asJSON          bool
		cpuProfile      string
		kvType          string
		cluster, key    string
		devSpec         string
	)
	cmd := &cobra.Command{
		Use:   "bench --model FILE [-t 1,2] [-p 64,512] [-n 64] [-r 3]",
		Short: "Measure prompt processing and generation speed, like llama-bench",
		Long: `Measure prompt processing (ppN: N prompt tokens in one batch from an empty
context) and token generation (tgN: N tokens one at a time from an empty
context) in tokens per second, mean ± sd over -r runs after one warm-up.
With -d N every run starts from a context of N tokens (prompted, untimed),
as llama-bench's -d: "tg64 @ d1024" is decode with attention over 1024+
cached positions.

Before each tg row the memory bandwidth is measured (STREAM triad, same
thread count), and decode is reported as a fraction of the bandwidth
roofline: tok/s × weight bytes read per token ÷ bandwidth. Bandwidth on
shared machines swings within minutes, so compare decode by that fraction.

  shoal bench --model tinyllama-q4_0.gguf -t 1,2 -p 64,512 -n 64 -r 3
  shoal bench --model m.gguf --json > result.json

With --cluster ADDR, --model names a model loaded on the cluster and the
runs step through its committed plan on the agent that drives it (ADDR may
be any agent). Each row adds the bytes the plan's nodes sent per token
(hidden states, collectives, logits, step control) and, for tg rows, the
measured ms/token beside the planner's predicted ms/token.

  shoal bench --cluster 10.0.0.1:7948 --model tinyllama -p 64 -n 64 -r 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o := bench.Options{Reps: reps, BandwidthMB: bwMB, Depth: depth}
			var err error
			if o.Threads, err = intList(threads, "-t"); err != nil {
				return err
			}
			if o.Prompt, err = intList(pp, "-p"); err != nil {
				return err
			}
			if o.Gen, err = intList(tg, "-n"); err != nil {
				return err
			}
			if path == "" {
				return fmt.Errorf("--model is required")
			}
			if cluster != "" {
				if depth != 0 {
					return fmt.Errorf("--depth is not supported with --cluster yet")
				}
				return benchCluster(cmd.OutOrStdout(), cmd.ErrOrStderr(), cluster, key, path, o, asJSON)
			}
			m, err := model.Open(path)
			if err != nil {
				return err
			}
			defer m.Close()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			size, bpt := bench.ModelBytes(m), bench.BytesPerToken(m)
			w := cmd.OutOrStdout()
			name := filepath.Base(path)
			dev, devLine, err := vulkan.Choose(devSpec)
			if err != nil {
				return err
			}
			o.Device = dev
			if o.KVType, err = kv.ParseType(kvType); err != nil {
				return err
			}
			var gpu map[string]any
			if f, ok := dev.(vulkan.Fit); ok {
				gbps, err := f.GPU.MeasureGBps(time.Second)
				if err != nil {
					return err
				}
				sub, err := f.GPU.SubmitOverhead(50)
				if err != nil {
					return err
				}
				o.Bandwidth = func() float64 { return gbps * 1e9 }
				devLine = fmt.Sprintf("%s: %.1f GB/s measured (decode mat-vec), %.0f µs per submit and fence", devLine, gbps, float64(sub.Microseconds()))
				gpu = map[string]any{"name": f.GPU.Info().Name, "type": f.GPU.Info().TypeName(), "memory": f.GPU.Info().Memory, "gb_s": gbps, "submit_us": sub.Microseconds()}
			}
			if !asJSON {
				fmt.Fprintf(w, "model: %s (%s, %d layers, %.2f MiB, %d bytes read per token, %s KV cache)\ncpu: %s (%d logical cores), kernels: %s\ndevice: %s\n\n",
					name, m.Arch.Name, m.NLayer, float64(size)/(1<<20), bpt, o.KVType, bench.CPUName(), runtime.NumCPU(), kernels.Path(), devLine)
				fmt.Fprintln(w, "| threads | test          |            t/s | bandwidth GB/s | roofline |")
				fmt.Fprintln(w, "| ------: | ------------- | -------------: | -------------: | -------: |")
			}
			results, err := bench.Run(m, o, func(r bench.Result) {
				if asJSON {
					return
				}
				bw, roof := "", ""
				if r.BandwidthGBs > 0 {
					bw, roof = fmt.Sprintf("%.1f", r.BandwidthGBs), fmt.Sprintf("%.0f%%", 100*r.Roofline)
				}
				fmt.Fprintf(w, "| %7d | %-13s | %7.2f ± %5.2f | %14s | %8s |\n", r.Threads, r.Test, r.TokPerSec, r.StdDev, bw, roof)
			})
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{
					"model": name, "arch": m.Arch.Name, "model_bytes": size, "bytes_per_token": bpt,
					"kernels": kernels.Path(), "cpu": bench.CPUName(), "cores": runtime.NumCPU(), "results": results,
					"device": devLine, "gpu": gpu,
				})
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "model", "m", "", "GGUF model file, or with --cluster the name of a loaded model (required)")
	f.StringVar(&cluster, "cluster", "", "benchmark a model loaded on the cluster: an agent's admin API address")
	f.StringVar(&key, "token", "", "API key for --cluster (default $SHOAL_TOKEN)")
	f.StringVarP(&threads, "threads", "t", "2", "comma-separated thread counts")
	f.StringVar(&devSpec, "device", "cpu", deviceHelp+" (bench's default is cpu; with a GPU the roofline is its measured bandwidth)")
	f.StringVarP(&pp, "n-prompt", "p", "512", "comma-separated prompt sizes (0 = none)")
	f.StringVarP(&tg, "n-gen", "n", "128", "comma-separated generation lengths (0 = none)")
	f.IntVarP(&reps, "reps", "r", 3, "measured runs per row")
	f.IntVarP(&depth, "depth", "d", 0, "context length each run starts from (tokens prompted untimed first), as llama-bench -d")
	f.IntVar(&bwMB, "bw-mb", 256, "MB per array of the bandwidth probe")
	f.StringVar(&kvType, "kv-type", "f16", kvTypeHelp)
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the run to this file")
	return cmd
}

func intList(s, flag string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%s: %q is not a non-negative integer", flag, f)
		}
		if v > 0 {
			out = append(out, v)
		}
	}
	return out, nil
}

// benchCluster runs the benchmark on the driver of a model loaded on the
// cluster and prints it like the single-node table.
func benchCluster(w, errw io.Writer, addr, key, name string, o bench.Options, asJSON bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	c, err := apiClient(addr, key)
	if err != nil {
		return err
	}
	var res *api.BenchResult
	if err := whileUnserved(ctx, errw, func() (err error) {
		res, err = c.ClusterBench(ctx, name, api.BenchRequest{Prompt: o.Prompt, Gen: o.Gen, Reps: o.Reps})
		return err
	}); err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(w, "model: %s on the cluster (plan v%d: %s over %d node(s): %s; driver %s; activations %s)\n\n",
		res.Model, res.PlanVersion, res.Strategy, res.Nodes, strings.Join(res.Stages, ", "), res.Driver, res.Activations)
	fmt.Fprintln(w, "| nodes | test  |            t/s | ms/token | compute ms | other ms | predicted ms/token | bytes/token |")
	fmt.Fprintln(w, "| ----: | ----- | -------------: | -------: | ---------: | -------: | -----------------: | ----------: |")
	for _, r := range res.Results {
		pred := ""
		switch {
		case r.PredictedMsPerToken > 0:
			pred = fmt.Sprintf("%.2f", r.PredictedMsPerToken)
		case strings.HasPrefix(r.Test, "tg"): // an agent before pp rows had predictions
			pred = fmt.Sprintf("%.2f", res.PredictedMsPerToken)
		}
		fmt.Fprintf(w, "| %5d | %-5s | %7.2f ± %5.2f | %8.2f | %10.2f | %8.2f | %18s | %11.0f |\n", res.Nodes, r.Test, r.TokPerSec, r.StdDev, r.MsPerToken,
			r.ComputeMs, r.MsPerToken-r.ComputeMs, pred, r.BytesPerToken)
	}
	fmt.Fprintln(w, "\ncompute: the layers' time on the plan's critical path (each stage's slowest member, its waits excluded); other: the network, the waits and the driver")
	return nil
}
