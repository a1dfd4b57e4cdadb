package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"shoal/api/openai"
)

// sample is the measurement of one request.
type sample struct {
	err          error
	start        time.Time
	end          time.Time
	ttft         time.Duration   // request sent → first non-empty text
	gaps         []time.Duration // between successive non-empty text chunks
	chunks       int             // events that carried text
	tokens       int             // completion tokens (usage, else chunks)
	promptTokens int
	usage        bool // the server reported usage
	finish       string
	cut          bool // stopped at the end of a steady level
}

// streamEvent is the part of a chat or completion chunk loadgen reads.
type streamEvent struct {
	Choices []struct {
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

// HTTPError is an answer other than 200.
type HTTPError struct {
	Status  int
	Message string
}

func (e *HTTPError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message)
}

// errorKind is the short class of an error used to count them.
func errorKind(err error) string {
	var he *HTTPError
	switch {
	case errors.As(err, &he):
		return fmt.Sprintf("HTTP %d", he.Status)
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, openai.ErrNoDone):
		return "stream cut"
	case errors.Is(err, errStream):
		return "stream error"
	}
	return "transport"
}

var errStream = errors.New("error event in the stream")

// body returns the JSON request body for the options with a prompt (text,
// or token ids for completions) and a token limit.
func (o *Options) body(prompt any, maxTokens int) ([]byte, error) {
	req := map[string]any{
		"model":          o.Model,
		"max_tokens":     maxTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if o.API == APIChat {
		req["messages"] = []map[string]any{{"role": "user", "content": prompt}}
	} else {
		req["prompt"] = prompt
	}
	if o.Temperature != nil {
		req["temperature"] = *o.Temperature
	}
	if o.IgnoreEOS {
		req["ignore_eos"] = true
	}
	if len(o.JSONSchema) > 0 {
		req["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "bench", "strict": true, "schema": o.JSONSchema}}
	}
	return json.Marshal(req)
}

// stream sends one streaming request and measures it.
func (b *Bench) stream(ctx context.Context, body []byte) (s sample) {
	s.start = time.Now()
	defer func() { s.end = time.Now() }()
	if b.o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.o.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url(b.o.API.path()), bytes.NewReader(body))
	if err != nil {
		s.err = err
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if b.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.o.APIKey)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.err = readHTTPError(resp)
		return s
	}
	var last time.Time
	s.err = openai.ReadSSE(resp.Body, func(data []byte) error {
		now := time.Now()
		var ev streamEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("bad event %.200q: %w", data, err)
		}
		if ev.Error != nil {
			return fmt.Errorf("%w: %s", errStream, ev.Error.Message)
		}
		for _, c := range ev.Choices {
			text := c.Text
			if text == nil {
				text = c.Delta.Content
			}
			if text != nil && *text != "" {
				if s.chunks == 0 {
					s.ttft = now.Sub(s.start)
				} else {
					s.gaps = append(s.gaps, now.Sub(last))
				}
				last = now
				s.chunks++
			}
			if c.FinishReason != nil {
				s.finish = *c.FinishReason
			}
		}
		if ev.Usage != nil {
			s.usage = true
			s.tokens, s.promptTokens = ev.Usage.CompletionTokens, ev.Usage.PromptTokens
		}
		return nil
	})
	if s.err == nil && ctx.Err() != nil {
		s.err = ctx.Err()
	}
	if s.err != nil && ctx.Err() != nil && !errors.Is(s.err, ctx.Err()) {
		s.err = fmt.Errorf("%w (%v)", ctx.Err(), s.err)
	}
	if !s.usage {
		s.tokens = s.chunks
	}
	return s
}

func readHTTPError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb struct {
		Error json.RawMessage `json:"error"`
	}
	msg := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &eb) == nil && len(eb.Error) > 0 {
		var d struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(eb.Error, &d) == nil && d.Message != "":
			msg = d.Message
		case json.Unmarshal(eb.Error, &s) == nil && s != "":
			msg = s
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return &HTTPError{Status: resp.StatusCode, Message: msg}
}
