// Package generate runs the token loop on one machine: tokenize a prompt,
// prefill it, then sample and decode token by token, streaming valid UTF-8
// text, until a stop condition. It is the single-node use of the engine; the
// cluster's scheduler drives the same model.Runner batch by batch.
package generate
