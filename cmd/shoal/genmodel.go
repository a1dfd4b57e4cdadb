package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"shoal/cmd/shoal/localcluster"
	"shoal/engine/gguf"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
)

func genModelCmd() *cobra.Command {
	var (
		s         synth.Spec
		out       string
		vocabFrom string
		vocabSize int
		quiet     bool
		builtin   bool
		pooling   int
	)
	cmd := &cobra.Command{
		Use:   "gen-model --arch llama --type q4_k --out FILE",
		Short: "Write a deterministic random-weight model (for tests, benchmarks, demos)",
		Long: `Write a GGUF model with random weights that are a pure function of the shapes
and --seed. Tensor types follow --type: a ggml type (f32 f16 bf16 q4_0 q4_1
q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs iq2_xxs iq2_xs
iq2_s iq3_xxs iq3_s iq1_s iq1_m) or a llama-quantize mix (q4_k_m q4_k_s
q5_k_m q3_k_m). The output matrix gets Q6_K in low-bit files, as
llama-quantize does (--output-type overrides). The tokenizer is copied from
another GGUF (--vocab-from) or is a byte-level BPE vocabulary shoal builds.

  # TinyLlama-1.1B shapes in Q4_0
  shoal gen-model --arch llama --n-embd 2048 --n-layer 22 --n-head 32 --n-head-kv 4 \
    --n-ff 5632 --vocab-from llama-spm.gguf --type q4_0 --out tinyllama-q4_0.gguf
  # a small Mixtral-style MoE
  shoal gen-model --arch moe --n-expert 4 --n-expert-used 2 --type q4_0 --out moe.gguf
  # the built-in model 'shoal up' serves (the container image's demo model)
  shoal gen-model --builtin --out builtin.gguf`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out FILE is required")
			}
			var err error
			s.Pooling = pooling
			if builtin {
				if s, err = localcluster.BuiltinSpec(); err != nil {
					return err
				}
			} else if vocabFrom != "" {
				s.Tokenizer, err = tokenizerKVs(vocabFrom)
			} else {
				var v tokenizer.Vocab
				if v, err = tokenizer.ByteLevelVocab(vocabSize); err == nil {
					v.Pad(vocabSize)
					s.Tokenizer = v.KVs()
				}
			}
			if err != nil {
				return err
			}
			tmp, err := os.CreateTemp(filepath.Dir(out), ".gen-model-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			var bar *progressbar.ProgressBar
			progress := func(done, total int64) {
				if quiet || !isTerminal(cmd.ErrOrStderr()) {
					return
				}
				if bar == nil {
					bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(cmd.ErrOrStderr()),
						progressbar.OptionShowBytes(true), progressbar.OptionSetDescription("writing "+filepath.Base(out)),
						progressbar.OptionThrottle(200e6), progressbar.OptionClearOnFinish())
				}
				bar.Set64(done)
			}
			if err := synth.Write(tmp, s, progress); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Chmod(0o644); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			if bar != nil {
				bar.Finish()
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				return err
			}
			st, _ := os.Stat(out)
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%.1f MB)\n", out, float64(st.Size())/1e6)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&builtin, "builtin", false, "write the built-in model 'shoal up' serves (its shape flags are ignored)")
	f.StringVar(&s.Arch, "arch", "llama", "architecture: llama, qwen2, qwen3, moe (Mixtral-style llama), qwen2moe, qwen3moe, gemma3 (sliding-window layers, GELU, post-norms; always tied), gpt-oss (attention sinks, biased experts; --type mxfp4_moe for MXFP4 experts), glm4moe (GLM-4.5: leading dense layers, sigmoid-gated experts with a selection bias, a shared expert, half the head rotated, a multi-token-prediction block), deepseek2 (DeepSeek-V2/V3: multi-head latent attention, group-limited sigmoid routing with a selection bias, shared experts, leading dense layers; --head-dim is a query head's size), or bert (an embedding model with a WordPiece vocabulary: serve it for /v1/embeddings)")
	f.IntVar(&s.Window, "window", 0, "sliding window: gemma3's five layers in six (0 = 512), gpt-oss's even layers (0 = 128)")
	f.IntVar(&pooling, "pooling", 0, "bert: how token vectors become one embedding: 1 mean (the default), 2 the [CLS] token")
	f.IntVar(&s.NEmbd, "n-embd", 256, "embedding size")
	f.IntVar(&s.NLayer, "n-layer", 4, "layers")
	f.IntVar(&s.NHead, "n-head", 8, "attention heads")
	f.IntVar(&s.NHeadKV, "n-head-kv", 0, "key/value heads (0 = n-head)")
	f.IntVar(&s.HeadDim, "head-dim", 0, "head size (0 = n-embd/n-head)")
	f.IntVar(&s.NFF, "n-ff", 704, "FFN size (per expert for MoE)")
	f.IntVar(&s.NExpert, "n-expert", 0, "experts (MoE; 0 = 4)")
	f.IntVar(&s.NExpertUsed, "n-expert-used", 0, "experts per token (MoE; 0 = 2)")
	f.IntVar(&s.NFFShared, "n-ff-shared", 0, "shared expert FFN size (qwen2moe; 0 = n-ff)")
	f.IntVar(&s.DenseLead, "dense-lead", 0, "glm4moe, deepseek2: leading dense layers (0 = 1)")
	f.IntVar(&s.NFFDense, "n-ff-dense", 0, "glm4moe, deepseek2: FFN size of the dense layers (0 = 4 × n-ff)")
	f.IntVar(&s.NShared, "n-shared", 0, "glm4moe, deepseek2: shared experts, each n-ff wide (0 = 1)")
	f.IntVar(&s.RopeDim, "rope-dim", 0, "glm4moe: dimensions of each head RoPE rotates (0 = half the head); deepseek2: of each query head and the shared key (0 = a third of the head)")
	f.IntVar(&s.NextN, "nextn", 0, "glm4moe: multi-token-prediction blocks after the layers (written, not run; 0 = 1, -1 = none)")
	f.Float32Var(&s.ExpertScale, "expert-scale", 0, "glm4moe, deepseek2: scale of the routed experts' weights (0 = 2.5)")
	f.BoolVar(&s.SoftmaxGate, "softmax-gate", false, "glm4moe, deepseek2: score experts by a softmax (DeepSeek-V2) instead of sigmoids with a selection bias")
	f.IntVar(&s.KVLora, "kv-lora", 0, "deepseek2: the latent's size, what the KV cache holds per token with the rotated key (0 = 4 × the value head)")
	f.IntVar(&s.QLora, "q-lora", 0, "deepseek2: the queries' low-rank size (0 = 3 × kv-lora; -1 = none, the lite variant's attn_q, which llama.cpp accepts only with 27 layers)")
	f.IntVar(&s.VDim, "v-dim", 0, "deepseek2: a value head's size (0 = head-dim - rope-dim)")
	f.IntVar(&s.ExpertGroups, "expert-groups", 0, "deepseek2: groups of experts (0 = none)")
	f.IntVar(&s.ExpertGroupsUsed, "expert-groups-used", 0, "deepseek2: groups a token's experts are chosen from")
	f.IntVar(&s.Ctx, "ctx", 2048, "context length recorded in the file")
	f.Float32Var(&s.RopeTheta, "rope-theta", 0, "RoPE base (0 = 1e4 for llama, 1e6 for qwen and gemma3)")
	f.Float32Var(&s.RMSEps, "rms-eps", 0, "RMSNorm epsilon (0 = 1e-5 for llama, 1e-6 for qwen and gemma3)")
	f.BoolVar(&s.Tied, "tied", false, "no output matrix: the embedding doubles as the output")
	f.StringVar(&s.Type, "type", "f32", "tensor type or mix (see above)")
	f.StringVar(&s.OutputType, "output-type", "", "type of the output matrix (default: as llama-quantize picks)")
	f.Uint64Var(&s.Seed, "seed", 1, "random seed")
	f.Float32Var(&s.Std, "std", 0.02, "standard deviation of the weights")
	f.StringVar(&s.Name, "name", "", "general.name (default: derived from the shapes)")
	f.StringVar(&vocabFrom, "vocab-from", "", "copy the tokenizer from this GGUF file")
	f.IntVar(&vocabSize, "vocab-size", 2048, "size of the built-in byte-level BPE vocabulary (without --vocab-from; merges stop near 1165 tokens, the rest are unused placeholders)")
	f.StringVarP(&out, "out", "o", "", "output file (required)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	return cmd
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// tokenizerKVs copies every tokenizer.* entry of the GGUF file at path.
func tokenizerKVs(path string) ([]gguf.KV, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var kvs []gguf.KV
	for _, kv := range f.KVs {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			kvs = append(kvs, kv)
		}
	}
	if len(kvs) == 0 {
		return nil, fmt.Errorf("%s has no tokenizer metadata", path)
	}
	return kvs, nil
}
