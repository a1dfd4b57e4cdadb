// Package gateway is the request path from any agent to a model's driver:
// an agent that accepts an OpenAI request for a model another agent drives
// runs the OpenAI endpoint itself with a Model whose tokenizer is a local
// copy of the driver's vocabulary (fetched once per vocabulary) and whose
// Submitter passes the generation to the driver as tokens (the prompt's
// ids, the sampling settings with the seed, the constraint's spec, the
// tokens generated so far) over a transport.KindGateway stream. Because the
// front holds the whole state, a generation whose driver is lost is
// resubmitted, from the tokens it has, to the model's driver as the route
// then names it (request migration): the client sees one stream. A
// running generation also asks the route every second: when it names
// another driver (a re-plan moved the model, or the cluster lost a driver
// that stalls, paused or cut off, and sends nothing) the generation moves
// there. After a loss the front keeps trying for up to 90 s, while the
// cluster re-plans the model and loads its new driver; the endpoint's SSE
// keepalives hold the client's connection meanwhile.
//
// What a resubmission keeps: a greedy generation (temperature 0) goes on
// with exactly the tokens the lost driver would have produced, the
// constraint replayed to the same state (tested). A sampled one keeps its
// settings and seed, but not the random generator's position: the new
// driver draws the rest from the seed's start, so the continuation is a
// valid sample of the same distribution, not the one the lost driver
// would have drawn. Repetition penalties look at prompt and generated
// tokens alike (serve's window), so they see the same tokens after a
// resubmission. Prefix-cache hits (Event.Cached) are the last driver's.
//
// The Forwarder routes each request: a completion for a model another
// agent drives goes to the token path above when the driver takes it,
// else (and for the tokenizer routes and the admin API's runs of a
// distributed model) as HTTP over a transport.KindForward stream, checked
// against the user's key here, since the key does not travel
// (ForwardGrant stands in for it); /v1/models lists the whole cluster's
// models. What it needs from the agent (peers' addresses, the routes, the
// key checks) comes in through ForwarderConfig.
//
// It owns the wire format of the token path (wire.go), the driver's side
// (Server) and the front's (Client), and the last hop: a model this agent
// runs itself as the endpoint sees it (NewOpenAIModel: the tokenizer, the
// Submitter on the model's serve.Scheduler, the grammar constrainer; the
// embedding models of OpenEmbedding). It must not serve the OpenAI API
// itself (api/openai decodes the request and writes the answer's events,
// once, on the agent the client asked; the forwarder reads only the model
// name and the stream flag, and relays another agent's HTTP answer, with
// keepalive comments and an error event when it is cut), batch or run the
// layers
// (serve and the engine do), or decide where a model is driven (the
// node's route).
package gateway
