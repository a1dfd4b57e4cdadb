package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

	"shoal/engine/generate"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
)

func runCmd() *cobra.Command {
	var (
		path    string
		prompt  string
		n       int
		threads int
		ctxLen  int
		special bool
		stats   bool
		devSpec string
		kvType  string
	)
	sp := sample.DefaultParams()
	cmd := &cobra.Command{
		Use:   "run --model FILE -p TEXT",
		Short: "Generate text from a prompt on this machine",
		Long: `Generate text from a prompt with a GGUF model on this machine, streaming it
to stdout. Timing goes to stderr.

  shoal run --model model.gguf -p "The capital of France is" -n 32
  shoal run --model model.gguf -p "Hi" --temp 0            # greedy
  shoal run --model model.gguf -p "Hi" --seed 7 --top-p 0.9`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, _, err := localModel(cmd.Context(), path, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			m, tok, err := openModel(path)
			if err != nil {
				return err
			}
			defer m.Close()
			if ctxLen <= 0 {
				ctxLen = min(m.NCtx, 4096)
			}
			dev, err := chooseDevice(cmd, devSpec)
			if err != nil {
				return err
			}
			kt, err := kv.ParseType(kvType)
			if err != nil {
				return err
			}
			r, err := model.NewRunner(m, model.Options{Threads: threads, CacheTokens: ctxLen, Device: dev, KVType: kt})
			if err != nil {
				return err
			}
			defer r.Close()
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			out := bufio.NewWriter(cmd.OutOrStdout())
			st, err := generate.Run(ctx, r, tok, 0, generate.Request{Prompt: prompt, MaxTokens: n, Sampling: sp, ParseSpecial: special},
				func(s string) error {
					if _, err := out.WriteString(s); err != nil {
						return err
					}
					return out.Flush()
				})
			fmt.Fprintln(out)
			out.Flush()
			if err != nil {
				return err
			}
			if stats {
				fmt.Fprintf(cmd.ErrOrStderr(), "prompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | stop: %s\n",
					st.PromptTokens, st.PromptTPS(), st.Generated, st.DecodeTPS(), st.StopReason)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "model", "m", "", "GGUF model: a file, a model in the store, or a hub reference such as Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M, pulled first (required)")
	f.StringVarP(&prompt, "prompt", "p", "", "prompt text")
	f.IntVarP(&n, "n", "n", 128, "tokens to generate (0 = until end of text or context)")
	f.IntVarP(&threads, "threads", "t", 0, "worker threads (0 = all cores)")
	f.StringVar(&devSpec, "device", "auto", deviceHelp)
	f.IntVarP(&ctxLen, "ctx", "c", 0, "context length in tokens (0 = the model's, at most 4096)")
	f.StringVar(&kvType, "kv-type", "f16", kvTypeHelp)
	f.BoolVar(&special, "special", false, "parse special-token text in the prompt (e.g. <|im_start|>)")
	f.BoolVar(&stats, "stats", true, "print timing to stderr")
	f.Float32Var(&sp.Temperature, "temp", sp.Temperature, "temperature (0 = greedy)")
	f.IntVar(&sp.TopK, "top-k", sp.TopK, "keep the k most likely tokens (0 = off)")
	f.Float32Var(&sp.TopP, "top-p", sp.TopP, "keep the smallest set of tokens with this total probability (1 = off)")
	f.Float32Var(&sp.MinP, "min-p", sp.MinP, "drop tokens less likely than this fraction of the best (0 = off)")
	f.Float32Var(&sp.RepeatPenalty, "repeat-penalty", sp.RepeatPenalty, "penalize recent tokens (1 = off)")
	f.IntVar(&sp.RepeatLastN, "repeat-last-n", sp.RepeatLastN, "how many recent tokens the penalties see (-1 = all)")
	f.Float32Var(&sp.PresencePenalty, "presence-penalty", sp.PresencePenalty, "subtract from tokens already present")
	f.Float32Var(&sp.FrequencyPenalty, "frequency-penalty", sp.FrequencyPenalty, "subtract per occurrence")
	f.Uint64Var(&sp.Seed, "seed", sp.Seed, "random seed (same seed, same text)")
	return cmd
}
