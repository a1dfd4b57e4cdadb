// Package openai serves shoal's OpenAI-compatible HTTP endpoint:
// /v1/chat/completions, /v1/completions (both with SSE streaming),
// /v1/embeddings (for models with an Embedder) and /v1/models. Both
// generating endpoints parse into one request (chat messages become a
// prompt through the model's own Jinja chat template, rendered with gonja;
// a completions prompt is text or token ids), map the request parameters to
// Sampling, and share one response path that applies stop strings to the
// detokenized stream and answers in OpenAI's shapes, errors included.
//
// A completion's body is read and decoded once, here, on the agent the
// client asked; the Backend resolves the model it names (Resolve), which
// may be a model another agent drives, served here with its vocabulary
// (the tokens travel, not the request), or a PassOn, which the handler
// hands the body it read to (the request goes on as HTTP, and the server
// that answers it reports it).
//
// It owns the endpoint and its wire types. It must not import the engine or
// serve: a Model is a Tokenizer and a Submitter the node provides (see
// gateway.NewOpenAIModel), the node supplies models through Backend and API-key
// checks, metrics and logging through Options.
package openai
