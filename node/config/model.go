package config

import (
	"fmt"
	"path/filepath"
	"strings"
)

// ModelConfig is a model given with --model: a file on this machine that
// the agent registers in the cluster state pinned to this node, so the
// leader plans it on this node alone and it is listed, metered and served
// like any model loaded with `shoal model load`.
type ModelConfig struct {
	Path    string `json:"path"`
	Name    string `json:"name"`     // default: the file name without .gguf
	Ctx     int    `json:"ctx"`      // KV cache capacity in tokens over all sequences (default: min(model's, 8192))
	Threads int    `json:"threads"`  // worker threads (default: all cores)
	MaxSeqs int    `json:"max_seqs"` // sequences decoded together (default 16)
	Queue   int    `json:"queue"`    // requests waiting beyond the batch before 429 (default 64)
	// NoPrefixCache turns off reusing the KV blocks of shared prompt prefixes.
	NoPrefixCache bool `json:"no_prefix_cache,omitempty"`
	// Lookup drafts up to that many tokens a decode step from the
	// sequence's own context and verifies them in the step (speculative
	// decoding by prompt lookup, serve.Options.Lookup); 0: off.
	Lookup int `json:"lookup,omitempty"`
	// Draft is the path of a draft model (a GGUF file with the same
	// vocabulary, run whole on this node) that proposes up to DraftMax
	// tokens a step (default 6) for the model to verify (speculative
	// decoding, serve.Options.Draft).
	Draft    string `json:"draft,omitempty"`
	DraftMax int    `json:"draft_max,omitempty"`
}

// MaxLookup bounds ModelConfig.Lookup.
const MaxLookup = 16

// Validate reports the first problem in one line.
func (c *ModelConfig) Validate() error {
	if c.Path == "" {
		return fmt.Errorf("--model: a model file path is required")
	}
	if c.Ctx < 0 || c.Threads < 0 || c.MaxSeqs < 0 || c.Queue < 0 {
		return fmt.Errorf("model %s: ctx, threads, max-seqs and queue must not be negative", c.Path)
	}
	if c.Lookup < 0 || c.Lookup > MaxLookup {
		return fmt.Errorf("model %s: lookup %d: draft 0 (off) to %d tokens a step", c.Path, c.Lookup, MaxLookup)
	}
	if c.DraftMax < 0 || c.DraftMax > MaxLookup {
		return fmt.Errorf("model %s: draft-max %d: draft 1 to %d tokens a step (0: the default, 6)", c.Path, c.DraftMax, MaxLookup)
	}
	if c.Draft != "" && c.Lookup > 0 {
		return fmt.Errorf("model %s: --draft and --lookup both draft tokens: give one of them", c.Path)
	}
	return nil
}

// ServedName is the name the model is served by.
func (c *ModelConfig) ServedName() string {
	if c.Name != "" {
		return c.Name
	}
	return strings.TrimSuffix(filepath.Base(c.Path), ".gguf")
}
