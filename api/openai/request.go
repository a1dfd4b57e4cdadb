package openai

// genRequest is a chat or completions request, checked and tokenized:
// what the shared generate-and-respond path needs.
type genRequest struct {
	model *Model
	param string // the request field the prompt came from
	gen   Request
	stops []string
	// stream answers with Server-Sent Events; usage then adds a last
	// chunk with the usage (stream_options.include_usage).
	stream, usage bool

	// n is the number of choices (n).
	n int
	// constrain, when set, makes a constraint for each choice (a grammar,
	// a JSON schema, a tool call's format).
	constrain func() (Constraint, *apiError)
	// grammar is the GBNF the output must follow ("" for none), from the
	// request field grammarParam.
	grammar, grammarParam string
	// trigger, when set, makes the grammar lazy: the answer is free until
	// this text appears in it, and follows the grammar from there on.
	trigger string
	// tools are a chat request's tools, nil when the answer uses none.
	tools *toolPlan
	// reasoning is how a chat answer marks its reasoning (reasonNone:
	// not split off); thinkOpen says the prompt opened <think>.
	reasoning reasoningFormat
	thinkOpen bool
	noReason  bool // reasoning_format "none"

	messages []TemplateMessage // chat: the messages the prompt is rendered from
	// Completions: the prompt as text (for echo and text_offset), and
	// whether it is echoed.
	promptText string
	echo       bool
}

// endpointRequest is the body of one of the generating endpoints.
type endpointRequest interface {
	params() *GenerationParams
	// check reads the endpoint's own fields into r (max tokens, logprobs,
	// what the prompt is made of).
	check(r *genRequest) *apiError
	// tokenize sets r.gen.Prompt.
	tokenize(h *handler, r *genRequest) *apiError
	// shapes are how the answer looks: one per choice (r.n), sharing
	// the answer's envelope.
	shapes(h *handler, r *genRequest) []shape
}

func (req *ChatRequest) params() *GenerationParams       { return &req.GenerationParams }
func (req *CompletionRequest) params() *GenerationParams { return &req.GenerationParams }

// generate serves a generating endpoint: it parses req from the body, then
// generates and responds.
func (h *handler) generate(x *exchange, req endpointRequest) *apiError {
	r, e := h.parse(x, req)
	if e != nil {
		return e
	}
	return h.respond(x, r, req.shapes(h, r))
}

// parse decodes and checks the request and tokenizes its prompt.
func (h *handler) parse(x *exchange, req endpointRequest) (*genRequest, *apiError) {
	if e := h.decode(x, req); e != nil {
		return nil, e
	}
	p := req.params()
	x.rec.Model, x.rec.Stream = p.Model, p.Stream
	m, e := h.resolve(x, p.Model)
	if e != nil {
		return nil, e
	}
	r := &genRequest{model: m, stream: p.Stream, usage: p.StreamOptions != nil && p.StreamOptions.IncludeUsage}
	if e := req.check(r); e != nil {
		return nil, e
	}
	if r.gen.Sampling, r.stops, e = h.sampling(p); e != nil {
		return nil, e
	}
	if r.n, e = choices(p.N); e != nil {
		return nil, e
	}
	if e := req.tokenize(h, r); e != nil {
		return nil, e
	}
	if p.Grammar != "" {
		if r.grammar != "" {
			return nil, badRequest("grammar", "grammar and %s both constrain the output; give one", r.grammarParam)
		}
		r.grammar, r.grammarParam = p.Grammar, "grammar"
	}
	if e := r.compileGrammar(); e != nil {
		return nil, e
	}
	return r, nil
}

// maxChoices is the most choices (n) a request may ask for.
const maxChoices = 16

// choices reads n: 1 when absent.
func choices(n *int) (int, *apiError) {
	if n == nil {
		return 1, nil
	}
	if *n < 1 || *n > maxChoices {
		return 0, badRequest("n", "n must be between 1 and %d, got %d", maxChoices, *n)
	}
	return *n, nil
}

// namedInt is a request field holding an integer.
type namedInt struct {
	name string
	v    *int
}

// maxTokens reads the fields that bound the generated tokens over def: each
// must be at least 1, and the last one set wins.
func maxTokens(def int, fields ...namedInt) (int, *apiError) {
	n := def
	for _, f := range fields {
		if f.v != nil {
			if *f.v <= 0 {
				return 0, badRequest(f.name, "%s must be at least 1, got %d", f.name, *f.v)
			}
			n = *f.v
		}
	}
	return n, nil
}

const maxTopLogprobs = 20

// topLogprobs checks a requested number of alternatives per token.
func topLogprobs(f namedInt) (int, *apiError) {
	if f.v == nil {
		return 0, nil
	}
	if n := *f.v; n < 0 || n > maxTopLogprobs {
		return 0, badRequest(f.name, "%s must be between 0 and %d, got %d", f.name, maxTopLogprobs, n)
	}
	return *f.v, nil
}

// checkTokens checks that a prompt given as token ids is in the vocabulary.
func checkTokens(tok Tokenizer, ids []int32) *apiError {
	for _, t := range ids {
		if t < 0 || int(t) >= tok.NVocab() {
			return badRequest("prompt", "token id %d is outside the vocabulary of %d", t, tok.NVocab())
		}
	}
	return nil
}
