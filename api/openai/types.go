package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// The request and response bodies of the OpenAI API, as far as shoal serves
// it. Requests decode into typed fields (a wrong type is a 400); fields
// shoal does not know are ignored.

// StreamOptions is stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// StopList is "stop": a string or an array of strings.
type StopList []string

// UnmarshalJSON accepts null, a string or an array of strings.
func (s *StopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*s = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = StopList{one}
		return nil
	case len(b) > 0 && b[0] == '[':
		var many []string
		if err := json.Unmarshal(b, &many); err != nil {
			return err
		}
		*s = many
		return nil
	}
	return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[StopList]()}
}

// MessageContent is a message's "content": null, a string, or an array of
// content parts of which shoal reads the text parts.
type MessageContent struct {
	Text string
	// Parts counts the parts when content was an array; NonText counts
	// parts that were not text (images, audio), which shoal cannot use.
	Parts, NonText int
	Null           bool
}

type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// UnmarshalJSON accepts null, a string, or an array of parts; text parts
// are joined with newlines.
func (c *MessageContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*c = MessageContent{}
	switch {
	case bytes.Equal(b, []byte("null")):
		c.Null = true
		return nil
	case len(b) > 0 && b[0] == '"':
		return json.Unmarshal(b, &c.Text)
	case len(b) > 0 && b[0] == '[':
		var parts []contentPart
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var texts []string
		for _, p := range parts {
			c.Parts++
			if p.Type == "text" && p.Text != nil {
				texts = append(texts, *p.Text)
				continue
			}
			c.NonText++
		}
		c.Text = strings.Join(texts, "\n")
		return nil
	}
	return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[MessageContent]()}
}

// ChatMessage is one entry of "messages".
type ChatMessage struct {
	Role    string          `json:"role"`
	Content *MessageContent `json:"content"`
	Name    string          `json:"name,omitempty"`
	// ToolCalls are an assistant message's calls; ToolCallID is the call
	// a "tool" message answers.
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// Tool is one entry of a chat request's "tools".
type Tool struct {
	Type     string      `json:"type"`
	Function FunctionDef `json:"function"`
}

// FunctionDef is a function the model may call.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ToolCall is a call of a function, in an assistant message or an answer.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a called function's name and its arguments (a JSON
// object as text).
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolCallDelta is a streamed piece of a tool call: the first one of a
// call carries its id, type and name, the next ones pieces of its
// arguments.
type ToolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function FunctionCallDelta `json:"function"`
}

// FunctionCallDelta is a piece of a streamed call.
type FunctionCallDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// GenerationParams are the request fields chat and completions share.
type GenerationParams struct {
	Model            string         `json:"model"`
	MaxTokens        *int           `json:"max_tokens"`
	Temperature      *float64       `json:"temperature"`
	TopP             *float64       `json:"top_p"`
	N                *int           `json:"n"`
	Stream           bool           `json:"stream"`
	StreamOptions    *StreamOptions `json:"stream_options"`
	Stop             StopList       `json:"stop"`
	PresencePenalty  *float64       `json:"presence_penalty"`
	FrequencyPenalty *float64       `json:"frequency_penalty"`
	Seed             *int64         `json:"seed"`
	User             string         `json:"user"`
	// Extensions llama.cpp and vLLM also accept.
	TopK          *int     `json:"top_k"`
	MinP          *float64 `json:"min_p"`
	RepeatPenalty *float64 `json:"repeat_penalty"`
	// Grammar constrains the output to a GBNF grammar (llama-server's
	// extension; start rule "root").
	Grammar string `json:"grammar"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	GenerationParams
	Messages            []ChatMessage   `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               []Tool          `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	ResponseFormat      *ResponseFormat `json:"response_format"`
	// ReasoningFormat (llama-server's): "auto" (the default) answers a
	// reasoning model's thinking in reasoning_content, "none" leaves it in
	// content as the model wrote it.
	ReasoningFormat string `json:"reasoning_format"`
}

// ResponseFormat is a chat request's response_format: "text",
// "json_object" (any JSON object; with llama-server's "schema" extension,
// one valid against it) or "json_schema".
type ResponseFormat struct {
	Type       string          `json:"type"`
	JSONSchema *JSONSchemaSpec `json:"json_schema"`
	Schema     json.RawMessage `json:"schema"`
}

// JSONSchemaSpec is response_format.json_schema.
type JSONSchemaSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Strict      *bool           `json:"strict"`
}

// PromptInput is the completions "prompt": a string, an array of one
// string, or an array of token ids.
type PromptInput struct {
	Text   string
	Tokens []int32
	IsText bool
	Count  int // prompts given (shoal serves one)
}

// UnmarshalJSON reads the prompt.
func (p *PromptInput) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*p = PromptInput{}
	switch {
	case len(b) > 0 && b[0] == '"':
		p.IsText, p.Count = true, 1
		return json.Unmarshal(b, &p.Text)
	case len(b) > 0 && b[0] == '[':
		var raw []json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			return err
		}
		if len(raw) == 0 {
			return nil
		}
		first := bytes.TrimSpace(raw[0])
		switch {
		case len(first) > 0 && first[0] == '"':
			var ss []string
			if err := json.Unmarshal(b, &ss); err != nil {
				return err
			}
			p.IsText, p.Count, p.Text = true, len(ss), ss[0]
			return nil
		case len(first) > 0 && first[0] == '[':
			var tt [][]int32
			if err := json.Unmarshal(b, &tt); err != nil {
				return err
			}
			p.Count, p.Tokens = len(tt), tt[0]
			return nil
		default:
			p.Count = 1
			return json.Unmarshal(b, &p.Tokens)
		}
	}
	return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[PromptInput]()}
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	GenerationParams
	Prompt   *PromptInput `json:"prompt"`
	BestOf   *int         `json:"best_of"`
	Logprobs *int         `json:"logprobs"`
	Echo     bool         `json:"echo"`
	Suffix   *string      `json:"suffix"`
}

// Usage is the token accounting of a request.
type Usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails PromptTokensDetails `json:"prompt_tokens_details"`
	// CompletionTokensDetails is set when the model decodes
	// speculatively (a draft model or prompt lookup).
	CompletionTokensDetails *CompletionTokensDetails `json:"completion_tokens_details,omitempty"`
}

// CompletionTokensDetails counts, in OpenAI's predicted-output fields,
// the drafted tokens the model accepted (each cost no step of its own)
// and those it rejected (each cost a row of a step).
type CompletionTokensDetails struct {
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}

// PromptTokensDetails says how many prompt tokens were read from the
// prefix cache instead of computed.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// TopLogprob is one alternative in the chat logprobs shape.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// TokenLogprob is one generated token in the chat logprobs shape.
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float32      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// ChatLogprobs is choices[].logprobs of a chat completion.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
	Refusal []TokenLogprob `json:"refusal"`
}

// AssistantMessage is the message of a chat completion choice.
type AssistantMessage struct {
	Role string `json:"role"`
	// Content is null when the answer is only tool calls.
	Content   *string    `json:"content"`
	Refusal   *string    `json:"refusal"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ReasoningContent is what a reasoning model thought before its
	// answer (DeepSeek's API and llama-server give it so).
	ReasoningContent *string `json:"reasoning_content,omitempty"`
}

// Envelope starts every completion and streamed chunk.
type Envelope struct {
	ID string `json:"id"`
	// Object is "chat.completion", "chat.completion.chunk" or
	// "text_completion".
	Object            string `json:"object"`
	Created           int64  `json:"created"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int              `json:"index"`
	Message      AssistantMessage `json:"message"`
	Logprobs     *ChatLogprobs    `json:"logprobs"`
	FinishReason string           `json:"finish_reason"`
}

// ChatCompletion is the response of a chat completion.
type ChatCompletion struct {
	Envelope
	Choices []ChatChoice `json:"choices"`
	Usage   Usage        `json:"usage"`
}

// ChatDelta is the delta of a streamed chat chunk.
type ChatDelta struct {
	Role             string          `json:"role,omitempty"`
	Content          *string         `json:"content,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ChatChunkChoice is one choice of a streamed chat chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// Chunk is a streamed event, with choices of type C.
type Chunk[C any] struct {
	Envelope
	Choices []C `json:"choices"`
	// Usage is null on every chunk but the last when include_usage is set,
	// and absent otherwise (a Completion that is not streamed has it).
	Usage json.RawMessage `json:"usage,omitempty"`
}

// ChatChunk is one "chat.completion.chunk" event.
type ChatChunk = Chunk[ChatChunkChoice]

// CompletionLogprobs is the legacy completions logprobs shape.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// CompletionChoice is one choice of a completion (or completion chunk).
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// Completion is the response of POST /v1/completions, and each streamed
// chunk of it.
type Completion = Chunk[CompletionChoice]

// ModelEntry is one model of GET /v1/models.
type ModelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// shoal's own fields.
	ChatTemplate string `json:"shoal.chat_template"` // "model" or "fallback-chatml"
	ContextLen   int    `json:"shoal.context_length,omitempty"`
}

// ModelList is the response of GET /v1/models.
type ModelList struct {
	Object string       `json:"object"` // "list"
	Data   []ModelEntry `json:"data"`
}

// ErrorBody is the OpenAI error shape.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// jsonKind names the JSON type of a value for error messages.
func jsonKind(b []byte) string {
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// describeType names what a Go type accepts in JSON.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t {
	case reflect.TypeFor[StopList]():
		return "a string or an array of strings"
	case reflect.TypeFor[MessageContent]():
		return "a string or an array of content parts"
	case reflect.TypeFor[PromptInput]():
		return "a string, an array of strings or an array of token ids"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// describeJSONError turns a decoding error into a message and the
// offending parameter.
func describeJSONError(err error) (msg, param string) {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		// The fields of the embedded GenerationParams are the request's own.
		field := strings.TrimPrefix(te.Field, "GenerationParams.")
		want := describeType(te.Type)
		if field == "" {
			return fmt.Sprintf("invalid type: got %s, expected %s", te.Value, want), ""
		}
		return fmt.Sprintf("invalid type for '%s': got %s, expected %s", field, te.Value, want), field
	case errors.As(err, &se):
		return fmt.Sprintf("we could not parse the JSON body of your request: %v (at byte %d)", se, se.Offset), ""
	}
	return "we could not parse the JSON body of your request: " + err.Error(), ""
}
