// Package gateway is the request path from any agent to a model's driver:
// an agent that accepts an OpenAI completion for a model another agent
// drives serves it with its own OpenAI endpoint, whose Backend
// (Forwarder.Backend) resolves the model to one whose tokenizer is a local
// copy of the driver's vocabulary (fetched once per vocabulary, Client)
// and whose Submitter passes the generation to the driver as tokens (the
// prompt's ids, the sampling settings with the seed, the constraint's
// spec, the tokens generated so far) over a transport.KindGateway stream.
// Because the front holds the whole state, a generation whose driver is
// lost is resubmitted, from the tokens it has, to the model's driver as
// the route then names it (request migration): the client sees one stream.
// A running generation also asks the route every second: when it names
// another driver (a re-plan moved the model, or the cluster lost a driver
// that stalls, paused or cut off, and sends nothing) the generation moves
// there. After a loss the front keeps trying for up to 90 s, while the
// cluster re-plans the model and loads its new driver; the endpoint's SSE
// keepalives hold the client's connection meanwhile.
//
// A completion at an agent that does not drive its model:
//
//  1. api/openai decodes the body (the one decode on this agent) and
//     checks the user's key for the model;
//  2. its Backend's Resolve (frontBackend) finds the model by name: this
//     agent's own, waiting up to driverStartWait for a driver it is
//     planned to start; a 503 model_not_ready with Retry-After when the
//     plan has no ready, reachable driver; else the route's driver, its
//     vocabulary from Client.Model (with the request's context);
//  3. api/openai tokenizes the prompt and submits it: the Client's
//     Submitter sends the tokens to the driver (wire.go);
//  4. the driver's Server decodes the one request frame and runs it on
//     its serve.Scheduler; the events come back as tokens, and api/openai
//     writes the answer (JSON or SSE) here, once.
//
// When the driver does not take the token path (an agent of an older
// version) or its vocabulary could not be fetched, Resolve answers with an
// openai.PassOn: the endpoint hands the body it read to the Forwarder,
// which sends the HTTP request over a transport.KindForward stream
// (forwardsend.go); the driver's endpoint decodes it (its one decode) and
// answers, and the answer is relayed with keepalive comments and an error
// event when it is cut.
//
// What a resubmission keeps: a greedy generation (temperature 0) goes on
// with the tokens the lost driver would have produced, the constraint
// replayed to the same state (tested), when the drivers' products are
// batch-invariant (agent --batch-invariant: the new driver's prefill of
// the generated tokens then computes what the decode steps that made them
// did; the cluster test TestDriverLoss); otherwise a near tie may tip. A
// sampled one keeps its
// settings, its seed and the random generator's position (each event
// carries the sampler's draw count, and the new driver's sampler starts
// past those draws, sample.Params.Skip), so it draws what the lost driver
// would have drawn (tested), near ties aside as above. Repetition
// penalties look at prompt and generated
// tokens alike (serve's window), so they see the same tokens after a
// resubmission. Prefix-cache hits (Event.Cached) are the last driver's.
//
// The Forwarder routes the rest: the tokenizer routes (whose model name
// it reads from the body) and the admin API's runs of a distributed model
// go as HTTP over a transport.KindForward stream, checked against the
// user's key here, since the key does not travel (ForwardGrant stands in
// for it, for completions passed on too); /v1/models lists the whole
// cluster's models. What it needs from the agent (peers' addresses, the
// routes, the key checks) comes in through ForwarderConfig.
//
// It owns the wire format of the token path (wire.go), the driver's side
// (Server) and the front's (Client), and the last hop: a model this agent
// runs itself as the endpoint sees it (NewOpenAIModel: the tokenizer, the
// Submitter on the model's serve.Scheduler, the grammar constrainer; the
// embedding models of OpenEmbedding). It must not serve the OpenAI API
// itself (api/openai decodes the request and writes the answer's events,
// once, on the agent the client asked; the forwarder reads only the model
// name of the tokenizer routes, and relays another agent's HTTP answer),
// batch or run the layers (serve and the engine do), or decide where a
// model is driven (the node's route).
package gateway
