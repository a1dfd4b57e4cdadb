// Package internal holds leaf helpers that any shoal package may import
// (logging setup, the zap-to-io bridge, the build's version and protocol).
// It must not import any other shoal package: whatever needs the agent, the
// API or the engine lives beside what it serves (node/nodetest,
// cmd/shoal/localcluster).
package internal
