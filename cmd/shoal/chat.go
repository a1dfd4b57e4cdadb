package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"

	"github.com/spf13/cobra"

	"shoal/api"
	"shoal/api/openai"
)

func chatCmd() *cobra.Command {
	var (
		addr, token, modelName, system string
		maxTokens                      int
		temp                           float64
		asJSON                         bool
		cacert                         string
	)
	cmd := &cobra.Command{
		Use:   "chat [--addr URL] [--model NAME] [--system TEXT]",
		Short: "Chat with the cluster's model in the terminal",
		Long: `Chat with a model served by a shoal agent's OpenAI-compatible endpoint. Each
line read from stdin is a user message; the answer streams as it arrives and
the conversation is kept. Lines that start with "/" are commands, never sent:
"/reset" starts over, "/exit" or "/bye" (or end of input) quits, "/help"
lists them; "//text" sends "/text". Ctrl-C stops the answer being written.

  shoal chat
  shoal chat --addr mac2:7948 --model qwen2-7b --system "Answer briefly."
  echo "What is a shoal?" | shoal chat --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			token = cliToken(token, addr)
			addr0 := addr
			addr, ca, err := agentAddr(addr, cacert)
			if err != nil {
				return err
			}
			hc, err := api.HTTPClientCA(ca, 0)
			if err != nil {
				return err
			}
			c := &openai.Client{BaseURL: addr, APIKey: token, HTTP: hc}
			ctx := context.Background()
			if modelName == "" {
				modelName = upModel(addr0)
			}
			if modelName == "" {
				models, err := c.Models(ctx)
				if err != nil {
					return fmt.Errorf("listing models at %s: %w", addr, err)
				}
				if len(models) == 0 {
					return fmt.Errorf("the agent at %s serves no model yet", addr)
				}
				modelName = models[0].ID
			}
			p := openai.ChatParams{Model: modelName, MaxTokens: maxTokens}
			if cmd.Flags().Changed("temperature") {
				p.Temperature = &temp
			}
			return chatLoop(ctx, c, p, system, asJSON, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "agent address: https://host:port, http://host:port, or host:port, which means https with --cacert or $SHOAL_CACERT, else http (default $SHOAL_ADDR or 127.0.0.1:7948)")
	f.StringVar(&cacert, "cacert", "", "the cluster's HTTPS CA certificate to trust (default $SHOAL_CACERT, else $SHOAL_DATA_DIR/tls/https-ca.pem if it exists)")
	f.StringVar(&token, "token", "", "API key (default $SHOAL_TOKEN)")
	f.StringVarP(&modelName, "model", "m", "", "model name (default: the model of a 'shoal up' running from this directory, else the first the agent serves)")
	f.StringVar(&system, "system", "", "system message that starts the conversation")
	f.IntVarP(&maxTokens, "max-tokens", "n", 0, "tokens per answer (0 = the server's default)")
	f.Float64Var(&temp, "temperature", 0.8, "sampling temperature (default: the server's)")
	f.BoolVar(&asJSON, "json", false, "print each answer as one JSON line instead of streaming text")
	return cmd
}

const chatHelp = `commands (never sent to the model):
  /reset, /clear      start the conversation over (the system message stays)
  /exit, /quit, /bye  quit (as does end of input)
  /help, /?           this list
  //text              send "/text"
Ctrl-C stops the answer being written.
`

// chatLoop reads user lines from in and streams the answers to out.
func chatLoop(ctx context.Context, c *openai.Client, p openai.ChatParams, system string, asJSON bool, in io.Reader, out, errw io.Writer) error {
	var history []openai.Message
	reset := func() {
		history = history[:0]
		if system != "" {
			history = append(history, openai.Message{Role: "system", Content: system})
		}
	}
	reset()
	failed, lastFail := 0, ""
	interactive := false
	if f, ok := in.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			interactive = true
		}
	}
	if interactive {
		fmt.Fprintf(errw, "chatting with %s — /help for commands, /exit to quit\n", p.Model)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for {
		if interactive {
			fmt.Fprint(errw, "> ")
		}
		if !sc.Scan() {
			if interactive {
				fmt.Fprintln(errw)
			}
			if err := sc.Err(); err != nil {
				return err
			}
			// Piped input: a script learns from the exit status that an
			// answer is missing.
			if failed > 0 && !interactive {
				return fmt.Errorf("%d request(s) failed; the last: %s", failed, lastFail)
			}
			return nil
		}
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "//") {
			line = line[1:]
		} else if strings.HasPrefix(line, "/") {
			switch cmd, _, _ := strings.Cut(line, " "); cmd {
			case "/exit", "/quit", "/bye":
				return nil
			case "/reset", "/clear":
				reset()
				fmt.Fprintln(errw, "(conversation cleared)")
			case "/help", "/?":
				fmt.Fprint(errw, chatHelp)
			default:
				fmt.Fprintf(errw, "unknown command %s: /help lists the commands; //text sends a message that starts with /\n", cmd)
			}
			continue
		}
		history = append(history, openai.Message{Role: "user", Content: line})
		p.Messages = history
		// Ctrl-C stops this answer, not the program.
		rctx, stop := signal.NotifyContext(ctx, os.Interrupt)
		// A reasoning model's thinking goes to stderr, framed, so that
		// stdout holds only answers.
		thinking := false
		p.OnThought = func(s string) {
			if !thinking {
				fmt.Fprintln(errw, "Thinking...")
				thinking = true
			}
			fmt.Fprint(errw, s)
		}
		onDelta := func(s string) {
			if thinking {
				fmt.Fprint(errw, "\n...done thinking.\n\n")
				thinking = false
			}
			fmt.Fprint(out, s)
		}
		if asJSON {
			onDelta, p.OnThought = nil, nil
		}
		reply, err := c.StreamChat(rctx, p, onDelta)
		if thinking {
			fmt.Fprintln(errw) // the answer ended while thinking
		}
		interrupted := rctx.Err() != nil && ctx.Err() == nil
		stop()
		switch {
		case interrupted:
			fmt.Fprintln(out)
			fmt.Fprintln(errw, "(interrupted)")
		case err != nil:
			var ae *openai.APIError
			if !asJSON && reply != nil && reply.Content != "" {
				fmt.Fprintln(out)
			}
			if !errors.As(err, &ae) {
				return err
			}
			// The request was refused or failed: drop it and go on.
			history = history[:len(history)-1]
			failed, lastFail = failed+1, ae.Message
			if !interactive && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden || ae.Status == http.StatusNotFound) {
				// Piped: every line would be refused the same (a wrong
				// key, a model not served); stop with the one reason.
				return fmt.Errorf("%d request(s) failed; the last: %s", failed, lastFail)
			}
			fmt.Fprintln(errw, "error:", ae.Message)
			continue
		case asJSON:
			b, _ := json.Marshal(reply)
			fmt.Fprintln(out, string(b))
		default:
			fmt.Fprintln(out)
			if reply.FinishReason == "length" {
				fmt.Fprintln(errw, "(answer cut at the token limit)")
			}
		}
		if reply != nil && reply.Content != "" {
			history = append(history, openai.Message{Role: "assistant", Content: reply.Content})
		} else {
			history = history[:len(history)-1]
		}
	}
}
