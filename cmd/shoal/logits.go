package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/spf13/cobra"

	"shoal/engine/model"
)

func logitsCmd() *cobra.Command {
	var (
		path, tokens, out string
		threads           int
	)
	cmd := &cobra.Command{
		Use:   "logits --model FILE --tokens 1,2,3 --out FILE",
		Short: "Evaluate token ids as one prompt and write the logits of every position",
		Long: `Evaluate the token ids as one prompt (positions 0..n-1, one batch) and write
little-endian float32 [n_tokens][n_vocab] to --out: row i holds the logits
after token i, raw (no softmax), the layout llama.cpp's logits dumps use.

  shoal logits --model model.gguf --tokens 1,450,4996 --out logits.f32`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out FILE is required")
			}
			ids, err := parseIDs(tokens)
			if err != nil {
				return err
			}
			m, err := model.Open(path)
			if err != nil {
				return err
			}
			defer m.Close()
			r, err := model.NewRunner(m, model.Options{Threads: threads, CacheTokens: len(ids)})
			if err != nil {
				return err
			}
			defer r.Close()
			logits, err := r.Prompt(0, ids, nil)
			if err != nil {
				return err
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
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d x %d logits to %s\n", len(ids), m.NVocab, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "model", "m", "", "GGUF model file (required)")
	f.StringVar(&tokens, "tokens", "", "comma-separated token ids (required)")
	f.StringVarP(&out, "out", "o", "", "output file (required)")
	f.IntVarP(&threads, "threads", "t", 0, "worker threads (0 = all cores)")
	return cmd
}
