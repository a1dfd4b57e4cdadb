// Package dashboard serves shoal's web dashboard: static pages (HTML, CSS
// and JavaScript embedded in the binary, no build step, no CDN) at GET /
// and /dashboard/*, which read the agent's own APIs from the browser with
// the API key the user enters once (kept in localStorage, sent as
// Authorization: Bearer).
//
// The dashboard (GET / or /dashboard/) shows /v1/nodes and /v1/status
// (nodes, capabilities, health), /v1/models, and /metrics (tokens/s from
// successive scrapes, queue depth, KV use). It needs an admin or read key;
// with an inference key, which the model list accepts but the cluster API
// refuses, it says that the key cannot read cluster status and shows what
// it can.
//
// The chat page (GET /dashboard/chat) talks to the OpenAI-compatible
// endpoint with an inference or admin key: a model picker from /v1/models,
// the conversation so far posted to /v1/chat/completions with stream:true
// and stream_options.include_usage, the SSE stream read with fetch (so the
// key can be sent) and shown as it arrives through a small markdown
// renderer that escapes the model's text before formatting it, the tokens
// and tokens/s of each answer, a Stop button that aborts the request (the
// agent cancels the generation; the partial answer is kept), server errors
// (an error body or an error event), a system prompt, max tokens and
// temperature, and a new-chat button. ?max_tokens=N and ?model=ID preset
// the settings.
//
// A login link, http://HOST:PORT/#key=KEY or
// http://HOST:PORT/dashboard/chat#key=KEY (shoal up prints them with the
// admin key), signs a browser in: the key is in the URL fragment, which the
// browser never sends to the server, so no request or log carries it; the
// page stores it as the key dialog does and removes it from the address
// bar and history with history.replaceState.
//
// The package also keeps the last requests of the OpenAI-compatible
// endpoint (Recent, an openai.Observer) and serves them at GET
// /dashboard/api/requests.
package dashboard
