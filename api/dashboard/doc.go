// Package dashboard serves shoal's web dashboard: a static page (HTML, CSS
// and JavaScript embedded in the binary, no build step, no CDN) at GET /
// and /dashboard/*, which reads the agent's own APIs from the browser —
// /v1/nodes and /v1/status (nodes, capabilities, health), /v1/models, and
// /metrics (tokens/s from successive scrapes, queue depth, KV use) — with
// the API key the user enters once. It also keeps the last requests of the
// OpenAI-compatible endpoint (Recent, an openai.Observer) and serves them at
// GET /dashboard/api/requests.
package dashboard
