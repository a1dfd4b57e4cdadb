package openai

import (
	"context"
	"errors"
	"time"
)

// Model is one model the endpoint serves: a tokenizer with its chat
// template, and a Submitter that runs it. The node builds them from its
// engine; the endpoint knows only these interfaces.
type Model struct {
	Name      string
	Tokenizer Tokenizer
	// Submitter runs the model; nil means it is not being served right
	// now (requests get 503).
	Submitter Submitter
	// Embedder, when set, serves POST /v1/embeddings (see embeddings.go);
	// nil: the model does not produce embeddings.
	Embedder Embedder
	// Constrainer, when set, compiles grammars and JSON schemas for
	// constrained decoding (response_format, grammar, tool calls); nil:
	// requests that need one are refused.
	Constrainer Constrainer
	Created     time.Time
	OwnedBy     string
}

// Tokenizer is what the endpoint needs of a model's vocabulary and chat
// template.
type Tokenizer interface {
	// Encode tokenizes text, turning the texts of special tokens into
	// their ids; addSpecial adds the BOS/EOS tokens the vocabulary asks
	// for.
	Encode(text string, addSpecial bool) []int32
	// Decode turns a prompt's token ids into its text.
	Decode(ids []int32) string
	// Piece is the bytes of one token.
	Piece(id int32) []byte
	// NewDecoder decodes generated tokens, which continue the prompt's
	// text, as they arrive.
	NewDecoder() Decoder
	// NVocab is the number of token ids.
	NVocab() int
	// Specials are the special tokens chat templates and prompts use.
	Specials() Specials
	// ChatTemplate is the model's Jinja chat template ("" when it has
	// none: the endpoint falls back to ChatML and says so in /v1/models).
	ChatTemplate() string
}

// Decoder turns a stream of token ids into text.
type Decoder interface {
	// Add takes the next token and returns the text that became complete
	// (an incomplete UTF-8 sequence waits for the next token).
	Add(id int32) string
	// Flush returns what is still held back.
	Flush() string
}

// Specials are a vocabulary's beginning and end of sequence tokens.
type Specials struct {
	BOS, EOS string // their texts ("" when the vocabulary has none)
	BOSID    int32
	// AddBOS is set when the vocabulary has a BOS token and asks for it
	// at the start of every prompt.
	AddBOS bool
}

// Submitter runs generations of one model.
type Submitter interface {
	// Submit queues a request. Its events are read from the Stream;
	// when ctx ends, or Stream.Cancel is called, the generation stops
	// and frees what it holds. Errors that wrap ErrQueueFull, ErrTooLong,
	// ErrBadInput or ErrClosed, or that have an HTTPStatus() int method,
	// are answered accordingly.
	Submit(ctx context.Context, req Request) (Stream, error)
	// Capacity is the longest sequence (prompt plus generated tokens).
	Capacity() int
}

// Stream is a submitted generation.
type Stream interface {
	// Next waits for the next event. It returns the context's error once
	// the context given to Submit ends, and another error when the
	// stream ends without a final (Done) event.
	Next() (Event, error)
	// Cancel stops the generation and frees what it holds. The endpoint
	// calls it, possibly more than once, when it stops reading.
	Cancel()
}

// Request is a tokenized generation.
type Request struct {
	Prompt []int32
	// MaxTokens is the number of tokens to generate; <= 0 means until the
	// end of generation or of the context.
	MaxTokens int
	Sampling  Sampling
	// Logprobs asks for the chosen token's log-probability, TopLogprobs
	// for that many alternatives per token.
	Logprobs    bool
	TopLogprobs int
	// Constraint, when set, limits the tokens drawn (constrained
	// decoding: a grammar, a JSON schema); one per generation.
	Constraint Constraint
}

// Constraint is a generation's constrained-decoding state: the tokens it
// allows next and its advance by the token drawn (the scheduler's
// sample.Constraint has the same methods).
type Constraint interface {
	// Mask is the bitset of the tokens allowed next (bit i of word i/64
	// for token i); nil allows every token, no bit set allows none.
	Mask() []uint64
	// Accept advances by tok.
	Accept(tok int32) error
	// Done reports that nothing but the end of generation can follow.
	Done() bool
}

// Constrainer compiles constraints for one model's vocabulary. Errors are
// about the request's grammar or schema (they become 400s).
type Constrainer interface {
	// Grammar compiles a GBNF grammar (start rule "root") and returns a
	// constraint at its start, advanced past prefix (text the answer
	// already holds); compiled grammars are cached.
	Grammar(gbnf string, prefix []byte) (Constraint, error)
	// SchemaRules turns a JSON schema into GBNF rules whose names start
	// with prefix; root names the rule of a valid document.
	SchemaRules(schema []byte, prefix string) (gbnf, root string, err error)
	// AnyObject is the GBNF of any JSON object (rule "root").
	AnyObject() string
}

// Sampling are a request's sampler settings, with the meaning llama.cpp
// gives them.
type Sampling struct {
	Temperature      float32 // <= 0 means greedy
	TopK             int     // <= 0 disables
	TopP             float32 // >= 1 or <= 0 disables
	MinP             float32 // <= 0 disables
	RepeatPenalty    float32 // 1 or 0 disables
	RepeatLastN      int     // window of recent tokens the penalties look at (0 = none, -1 = all)
	PresencePenalty  float32
	FrequencyPenalty float32
	Seed             uint64
	Skip             uint64 // random draws an earlier driver of the generation made
}

// Event is one generated token, or the end of the generation (Done).
type Event struct {
	Token   int32
	Logprob float32
	Top     []Candidate // the most likely tokens, when asked for
	// Set on the final event, which carries no token.
	Done bool
	// Reason is "stop" (end of generation), "length", "cancelled" or
	// "error" (with Err).
	Reason    string
	Err       error
	Generated int // tokens generated
	Cached    int // prompt tokens read from a prefix cache instead of computed
	// Drafted counts the tokens speculative decoding drafted for the
	// request, Accepted those the model agreed with (the last driver's).
	Drafted, Accepted int
	// Draws is how many random draws the sampler has made after this
	// token (sample.Sampler.Draws): where a resubmission's sampler
	// starts (Sampling.Skip).
	Draws uint64
}

// Candidate is a token with its log-probability.
type Candidate struct {
	Token   int32
	Logprob float32
}

// Errors a Submitter wraps (keeping its own message) so that the endpoint
// answers them in the right OpenAI shape.
var (
	ErrQueueFull = errors.New("the request queue is full") // 429
	ErrTooLong   = errors.New("prompt too long")           // 400 context_length_exceeded
	ErrBadInput  = errors.New("bad request")               // 400
	ErrClosed    = errors.New("the model was closed")      // 503
	// ErrNotServing is the answer for a model that has no Submitter here.
	ErrNotServing = errors.New("the model is not being served right now")
)
