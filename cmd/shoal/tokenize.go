package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"shoal/engine/gguf"
	"shoal/engine/tokenizer"
)

func tokenizeCmd() *cobra.Command {
	var (
		path      string
		noSpecial bool
	)
	cmd := &cobra.Command{
		Use:   "tokenize --model MODEL < text",
		Short: "Print the token ids of the text on stdin",
		Long: `Read text from stdin and print its token ids on one line, separated by spaces.
Only the tokenizer metadata of the GGUF file is read, so vocab-only files work.
--model takes a file, a model in the store or a hub reference, as run does.

  echo -n "Hello world" | shoal tokenize --model model.gguf
  echo -n "Hello world" | shoal tokenize --model qwen2.5-0.5b-instruct:q4_k_m
  --no-special   add no BOS/EOS and treat special-token text as plain text`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if path == "" {
				return fmt.Errorf("--model FILE is required")
			}
			path, _, err := localModel(cmd.Context(), path, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			f, err := gguf.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			tok, err := tokenizer.FromGGUF(f)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			text, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return err
			}
			ids := tok.Encode(string(text), !noSpecial, !noSpecial)
			parts := make([]string, len(ids))
			for i, id := range ids {
				parts[i] = strconv.Itoa(int(id))
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), strings.Join(parts, " "))
			return err
		},
	}
	cmd.Flags().StringVarP(&path, "model", "m", "", "the GGUF with tokenizer metadata: a file, a model in the store, or a hub reference (pulled first) (required)")
	cmd.Flags().BoolVar(&noSpecial, "no-special", false, "add no BOS/EOS and do not parse special-token text")
	return cmd
}
