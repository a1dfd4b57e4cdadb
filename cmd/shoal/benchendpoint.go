package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/api/loadgen"
)

// benchEndpointCmd is `shoal bench-endpoint`: load on a running
// OpenAI-compatible endpoint (shoal's own, or any other).
func benchEndpointCmd() *cobra.Command {
	var (
		o             loadgen.Options
		conc, apiName string
		temp          float64
		asJSON        bool
		per           loadgen.Periodic
		tracePath     string
		schemaPath    string
	)
	cmd := &cobra.Command{
		Use:   "bench-endpoint [--endpoint URL] [--model M] [-c 1,4,16] [-n 64] [--requests N | --duration D [--steady]] [--periodic D] [--json]",
		Short: "Measure a running endpoint under concurrent streaming requests",
		Long: `Measure an OpenAI-compatible endpoint (a shoal agent, or vLLM, llama.cpp's
server, ...) under load. For each concurrency level in -c, that many
streaming requests (chat by default, or completions) are kept in flight with
a fixed prompt and -n max_tokens, until --requests have run or --duration has
passed (default: max(8, 4×c) requests per level). After one warm-up request
it reports, per level: requests and errors, the aggregate generated tokens/s
(tokens of completed requests over the level's wall time), the mean speed of
one stream (from TPOT), time to first token p50/p99, the gap between streamed
chunks (inter-token latency) p50/p99 and the time per output token p50.
Latencies are in milliseconds.

A random or small model may stop before -n tokens; --ignore-eos asks servers
that support it (vLLM, llama.cpp) to generate all of them.

--prompt-tokens N sends prompts of N random token ids (completions only), a
new one for each request so that no prefix cache serves them. --steady runs
each level for exactly --duration and cuts the requests still streaming then
(what they streamed counts). --periodic D adds one more request every D
(--periodic-prompt-tokens, --periodic-max-tokens), reported in its own row:
e.g. the time to first token of long prompts arriving beside decode streams,
and what they do to the streams' inter-token latency:

  shoal bench-endpoint -c 1,4,16 -n 64
  shoal bench-endpoint --api completions -c 8 -n 256 --temperature 0 --duration 100s --steady \
      --periodic 15s --periodic-prompt-tokens 1024 --periodic-max-tokens 16
  shoal bench-endpoint --endpoint http://gpu1:8000 --model llama-3-8b --duration 30s --json > result.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Concurrency, err = loadgen.ParseLevels(conc); err != nil {
				return err
			}
			o.API = loadgen.API(apiName)
			if o.Endpoint == "" {
				o.Endpoint = os.Getenv("SHOAL_ADDR")
			}
			if o.Endpoint == "" {
				o.Endpoint = api.DefaultAddr
			}
			if o.APIKey == "" {
				o.APIKey = os.Getenv("SHOAL_TOKEN")
			}
			if cmd.Flags().Changed("temperature") {
				o.Temperature = &temp
			}
			if schemaPath != "" {
				if o.API != loadgen.APIChat {
					return fmt.Errorf("--json-schema needs --api chat")
				}
				b, err := os.ReadFile(schemaPath)
				if err != nil {
					return err
				}
				if !json.Valid(b) {
					return fmt.Errorf("--json-schema %s: not JSON", schemaPath)
				}
				o.JSONSchema = b
			}
			if per.Every > 0 {
				o.Periodic = &per
			} else if cmd.Flags().Changed("periodic-prompt-tokens") || cmd.Flags().Changed("periodic-max-tokens") {
				return fmt.Errorf("--periodic-prompt-tokens and --periodic-max-tokens need --periodic")
			}
			if o.Warmup == 0 {
				o.Warmup = -1 // --warmup 0: none (loadgen's 0 means the default)
			}
			errw := cmd.ErrOrStderr()
			o.OnLevel = func(l loadgen.Level) {
				fmt.Fprintf(errw, "c=%d: %d requests, %d errors in %.2fs, %.1f tok/s\n",
					l.Concurrency, l.Requests, l.Errors, l.WallSeconds, l.TokensPerSecond)
			}
			if tracePath != "" {
				tf, err := os.Create(tracePath)
				if err != nil {
					return err
				}
				defer tf.Close()
				o.Trace = tf
			}
			b, err := loadgen.New(o)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, runErr := b.Run(ctx)
			if res != nil && len(res.Levels) > 0 {
				out := cmd.OutOrStdout()
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if err := enc.Encode(res); err != nil {
						return err
					}
				} else if err := loadgen.WriteTable(out, res); err != nil {
					return err
				}
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Endpoint, "endpoint", "", "base URL of the endpoint (default $SHOAL_ADDR or "+api.DefaultAddr+")")
	f.StringVar(&o.APIKey, "token", "", "API key sent as Bearer (default $SHOAL_TOKEN)")
	f.StringVarP(&o.Model, "model", "m", "", "model name (default: the first of GET /v1/models)")
	f.StringVarP(&conc, "concurrency", "c", "1,4,16", "concurrency levels, comma-separated")
	f.IntVarP(&o.MaxTokens, "max-tokens", "n", 64, "max_tokens of each request")
	f.IntVar(&o.Requests, "requests", 0, "requests per level (default: max(8, 4×c) unless --duration is set)")
	f.DurationVar(&o.Duration, "duration", 0, "time per level in which new requests start (in-flight ones finish)")
	f.StringVar(&apiName, "api", string(loadgen.APIChat), "endpoint: chat or completions")
	f.StringVarP(&o.Prompt, "prompt", "p", loadgen.DefaultPrompt, "prompt of every request")
	f.Float64Var(&temp, "temperature", 1, "sampling temperature (default: the server's)")
	f.StringVar(&schemaPath, "json-schema", "", "ask for output valid against this JSON Schema file (response_format json_schema): measures constrained decoding")
	f.BoolVar(&o.IgnoreEOS, "ignore-eos", false, `send "ignore_eos": true (vLLM, llama.cpp) so requests run to -n tokens`)
	f.IntVar(&o.Warmup, "warmup", 1, "untimed requests before the first level")
	f.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "limit of each request")
	f.IntVar(&o.PromptTokens, "prompt-tokens", 0, "send prompts of this many random token ids instead of --prompt (completions only; a new prompt each request)")
	f.IntVar(&o.Vocab, "vocab", 32000, "random token ids are drawn below this")
	f.StringVar(&tracePath, "trace", "", "write a JSON line per request to this file: its start, first token and every gap after (ms from its level's start)")
	f.BoolVar(&o.Steady, "steady", false, "run each level for exactly --duration, then cut the requests in flight (their tokens count)")
	f.DurationVar(&per.Every, "periodic", 0, "also send one request every this long during each level (needs --duration), reported apart")
	f.IntVar(&per.PromptTokens, "periodic-prompt-tokens", 0, "the periodic requests' prompt: this many random token ids (default: --prompt)")
	f.IntVar(&per.MaxTokens, "periodic-max-tokens", 16, "max_tokens of the periodic requests")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}
