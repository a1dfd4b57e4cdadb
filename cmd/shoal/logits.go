package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/engine/model"
)

func logitsCmd() *cobra.Command {
	var (
		path, tokens, out string
		threads           int
		cluster, key      string
		devSpec           string
	)
	cmd := &cobra.Command{
		Use:   "logits --model FILE --tokens 1,2,3 --out FILE",
		Short: "Evaluate token ids as one prompt and write the logits of every position",
		Long: `Evaluate the token ids as one prompt (positions 0..n-1, one batch) and write
little-endian float32 [n_tokens][n_vocab] to --out: row i holds the logits
after token i, raw (no softmax), the layout llama.cpp's logits dumps use.

  shoal logits --model model.gguf --tokens 1,450,4996 --out logits.f32

With --cluster ADDR, --model names a model loaded on the cluster ('shoal
model load') and the tokens run through its committed plan, on the agent
that drives it (ADDR may be any agent's admin API); the output is the same.

  shoal logits --cluster 10.0.0.1:7948 --model tinyllama --tokens 1,450 --out c.f32`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out FILE is required")
			}
			ids, err := parseIDs(tokens)
			if err != nil {
				return err
			}
			if path == "" {
				return fmt.Errorf("--model is required")
			}
			var logits []float32
			var nVocab int
			if cluster != "" {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				c, err := apiClient(cluster, key)
				if err != nil {
					return err
				}
				var l *api.Logits
				if err := whileUnserved(ctx, cmd.ErrOrStderr(), func() (err error) {
					l, err = c.ClusterLogits(ctx, path, ids)
					return err
				}); err != nil {
					return err
				}
				logits, nVocab = l.Data, l.NVocab
			} else {
				m, err := model.Open(path)
				if err != nil {
					return err
				}
				defer m.Close()
				dev, err := chooseDevice(cmd, devSpec)
				if err != nil {
					return err
				}
				r, err := model.NewRunner(m, model.Options{Threads: threads, CacheTokens: len(ids), Device: dev})
				if err != nil {
					return err
				}
				defer r.Close()
				if logits, err = r.Prompt(0, ids, nil); err != nil {
					return err
				}
				nVocab = m.NVocab
			}
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			w := bufio.NewWriter(f)
			var b [4]byte
			for _, v := range logits {
				binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
				w.Write(b[:])
			}
			if err := w.Flush(); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d x %d logits to %s\n", len(ids), nVocab, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "model", "m", "", "GGUF model file, or with --cluster the name of a loaded model (required)")
	f.StringVar(&cluster, "cluster", "", "evaluate through the cluster: an agent's admin API address")
	f.StringVar(&key, "token", "", "API key for --cluster (default $SHOAL_TOKEN)")
	f.StringVar(&tokens, "tokens", "", "comma-separated token ids (required)")
	f.StringVarP(&out, "out", "o", "", "output file (required)")
	f.IntVarP(&threads, "threads", "t", 0, "worker threads (0 = all cores)")
	f.StringVar(&devSpec, "device", "auto", deviceHelp)
	return cmd
}
