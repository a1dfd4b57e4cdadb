// Package gateway is the request path from any agent to a model's driver:
// an agent that accepts an OpenAI request for a model another agent drives
// runs the OpenAI endpoint itself with a Model whose tokenizer is a local
// copy of the driver's vocabulary (fetched once per vocabulary) and whose
// Submitter passes the generation to the driver as tokens (the prompt's
// ids, the sampling settings with the seed, the constraint's spec, the
// tokens generated so far) over a transport.KindGateway stream. Because the
// front holds the whole state, a generation whose driver is lost is
// resubmitted, from the tokens it has, to the model's driver as the route
// then names it (request migration): the client sees one stream.
//
// It owns the wire format of those calls (wire.go), the driver's side
// (Server) and the front's (Client). It must not parse HTTP or write SSE
// (api/openai does, once, on the front agent), run models (the driver's
// Submitter does), or decide where a model is driven (the node's route).
package gateway
