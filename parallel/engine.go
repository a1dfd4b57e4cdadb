package parallel

import (
	"context"
	"fmt"

	"shoal/engine/kv"
	"shoal/engine/model"
)

// Engine drives a Session one batch at a time for a scheduler (it has the
// method set of serve.Engine). It keeps a shadow KV cache that stores
// nothing but mirrors the members' block use: the scheduler admits and
// preempts sequences by it, and a step it accepts always fits every
// member's cache (each holds at least CacheTokens positions in blocks of the
// same size), so a full cache is an ordinary kv.ErrFull, never a failed
// session.
type Engine struct {
	s      *Session
	shadow *kv.Cache
	// onFail, when set, learns of a step that failed the session and
	// gives the error the scheduler sees.
	onFail func(error) error
}

// NewEngine wraps s. cacheTokens and blockSize must not exceed what every
// member was given (MemberConfig.CacheTokens, BlockSize; 0 = the defaults).
func NewEngine(s *Session, cacheTokens, blockSize int) (*Engine, error) {
	if cacheTokens <= 0 {
		return nil, fmt.Errorf("dist: engine needs a positive KV capacity, got %d", cacheTokens)
	}
	if blockSize <= 0 {
		blockSize = kv.DefaultBlockSize
	}
	c, err := kv.New(kv.Config{Layers: 1, KVDim: 0, BlockSize: blockSize, NumBlocks: cacheTokens / blockSize})
	if err != nil {
		return nil, err
	}
	return &Engine{s: s, shadow: c}, nil
}

// Step reserves b in the shadow cache (all chunks or none) and runs it on
// the cluster.
func (e *Engine) Step(b *model.Batch, rows []int) ([]float32, error) {
	for i := range b.Chunks {
		c := &b.Chunks[i]
		pos, err := e.shadow.Reserve(c.Seq, c.N)
		if err != nil {
			e.undo(b, i)
			return nil, err
		}
		c.Pos = pos
	}
	logits, err := e.s.Step(context.Background(), b, rows)
	if err != nil {
		e.undo(b, len(b.Chunks))
		if e.onFail != nil && failedStep(err) {
			err = e.onFail(err)
		}
		return nil, err
	}
	return logits, nil
}

// undo returns the first n chunks' reservations.
func (e *Engine) undo(b *model.Batch, n int) {
	for j := n - 1; j >= 0; j-- {
		e.shadow.Truncate(b.Chunks[j].Seq, b.Chunks[j].Pos)
	}
}

// Free releases seq on every member and in the shadow cache.
func (e *Engine) Free(seq kv.SeqID) {
	e.shadow.Free(seq)
	// A failed free leaves the session unusable; the next Step reports it.
	_ = e.s.Free(context.Background(), seq)
}

// Cache is the shadow cache.
func (e *Engine) Cache() *kv.Cache { return e.shadow }

// NVocab is the model's vocabulary size.
func (e *Engine) NVocab() int { return e.s.NVocab() }
