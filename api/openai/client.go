package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Client is a small client of the endpoint for shoal's own CLI: plain
// net/http and an SSE reader, without the OpenAI SDK.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:7948 (the /v1 paths are appended)
	APIKey  string
	HTTP    *http.Client
}

// Message is a chat message as the client sends it.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatParams is a streamed chat request.
type ChatParams struct {
	Model       string
	Messages    []Message
	MaxTokens   int      // 0 = the server's default
	Temperature *float64 // nil = the server's default
	Seed        *int64
	// OnThought, when set, gets each piece of a reasoning model's
	// thinking (reasoning_content) as it arrives.
	OnThought func(string)
}

// ChatReply is the outcome of a streamed chat request.
type ChatReply struct {
	Content      string `json:"content"`
	Reasoning    string `json:"reasoning,omitempty"` // a reasoning model's thinking
	FinishReason string `json:"finish_reason"`
	Usage        *Usage `json:"usage,omitempty"`
}

// APIError is an error answer of the endpoint.
type APIError struct {
	Status int
	ErrorDetail
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

func (c *Client) url(path string) string {
	base := strings.TrimRight(c.BaseURL, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return base + path
}

func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error.Message != "" {
			return nil, &APIError{Status: resp.StatusCode, ErrorDetail: eb.Error}
		}
		return nil, &APIError{Status: resp.StatusCode, ErrorDetail: ErrorDetail{Message: strings.TrimSpace(string(raw)), Type: "http_error"}}
	}
	return resp, nil
}

// Models lists the served models.
func (c *Client) Models(ctx context.Context) ([]ModelEntry, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l ModelList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, fmt.Errorf("reading the model list: %w", err)
	}
	return l.Data, nil
}

// StreamChat sends a streamed chat request and calls onDelta with each
// piece of the answer as it arrives.
func (c *Client) StreamChat(ctx context.Context, p ChatParams, onDelta func(string)) (*ChatReply, error) {
	body := map[string]any{"model": p.Model, "messages": p.Messages, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	if p.MaxTokens > 0 {
		body["max_tokens"] = p.MaxTokens
	}
	if p.Temperature != nil {
		body["temperature"] = *p.Temperature
	}
	if p.Seed != nil {
		body["seed"] = *p.Seed
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/chat/completions", body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	reply := &ChatReply{}
	var content, thought strings.Builder
	err = ReadSSE(resp.Body, func(data []byte) error {
		var chunk struct {
			Choices []struct {
				Delta        ChatDelta `json:"delta"`
				FinishReason *string   `json:"finish_reason"`
			} `json:"choices"`
			Usage *Usage       `json:"usage"`
			Error *ErrorDetail `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return fmt.Errorf("bad event %q: %w", data, err)
		}
		if chunk.Error != nil {
			return &APIError{Status: http.StatusOK, ErrorDetail: *chunk.Error}
		}
		for _, ch := range chunk.Choices {
			if r := ch.Delta.ReasoningContent; r != nil && *r != "" {
				thought.WriteString(*r)
				if p.OnThought != nil {
					p.OnThought(*r)
				}
			}
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				content.WriteString(*ch.Delta.Content)
				if onDelta != nil {
					onDelta(*ch.Delta.Content)
				}
			}
			if ch.FinishReason != nil {
				reply.FinishReason = *ch.FinishReason
			}
		}
		if chunk.Usage != nil {
			reply.Usage = chunk.Usage
		}
		return nil
	})
	reply.Content, reply.Reasoning = content.String(), thought.String()
	return reply, err
}

// ErrNoDone is a stream that ended without "data: [DONE]".
var ErrNoDone = errors.New("the stream ended without [DONE]")

// ReadSSE reads a stream of Server-Sent Events and calls fn with the data
// of each event until "data: [DONE]"; a stream that ends without it is
// ErrNoDone.
func ReadSSE(r io.Reader, fn func([]byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data []byte
	dispatch := func() (bool, error) {
		if len(data) == 0 {
			return false, nil
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			return true, nil
		}
		err := fn(data)
		data = data[:0]
		return false, err
	}
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if done, err := dispatch(); done || err != nil {
				return err
			}
		case line[0] == ':':
			// a comment (keep-alive)
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, d...)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if done, err := dispatch(); done || err != nil {
		return err
	}
	return ErrNoDone
}
