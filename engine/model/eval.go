package model

import (
	"fmt"

	"shoal/engine/kv"
)

// Step reserves KV space for b, embeds its tokens, runs every layer and
// returns the logits of the listed rows (indexes into b's tokens),
// len(rows) x NVocab. The runner must hold the whole model. The returned
// slice is owned by the runner and valid until the next Step; Step does not
// allocate once its buffers have grown to the batch size.
func (r *Runner) Step(b *Batch, rows []int) ([]float32, error) {
	r.dev.Hold() // embedding, layers and logits: one burst of short jobs
	defer r.dev.Release()
	if r.lo != 0 || r.hi != r.m.NLayer {
		return nil, fmt.Errorf("runner holds layers [%d,%d), Step needs the whole model", r.lo, r.hi)
	}
	if r.m.W.TokEmbd == nil || r.m.W.Output == nil || r.m.W.OutputNorm == nil {
		return nil, fmt.Errorf("Step needs the embedding, output norm and output, the weights lack some")
	}
	n := b.Len()
	if len(b.Tokens) != n {
		return nil, fmt.Errorf("batch has %d tokens but its chunks cover %d", len(b.Tokens), n)
	}
	for _, i := range rows {
		if i < 0 || i >= n {
			return nil, fmt.Errorf("logits row %d is outside the batch of %d", i, n)
		}
	}
	r.x = grow(r.x, n*r.m.NEmbd)
	if err := r.Embed(b.Tokens, r.x); err != nil {
		return nil, err
	}
	if err := r.Reserve(b); err != nil {
		return nil, err
	}
	if err := r.Forward(b, r.lo, r.hi, r.x); err != nil {
		return nil, err
	}
	r.logits = grow(r.logits, len(rows)*r.m.NVocab)
	if err := r.Logits(r.x, rows, r.logits); err != nil {
		return nil, err
	}
	return r.logits, nil
}

// Prompt appends tokens to sequence seq in one batch and returns a copy of
// the logits of the rows listed in rows (all rows if nil).
func (r *Runner) Prompt(seq kv.SeqID, tokens []int32, rows []int) ([]float32, error) {
	if rows == nil {
		rows = make([]int, len(tokens))
		for i := range rows {
			rows[i] = i
		}
	}
	b := Batch{Tokens: tokens, Chunks: []Chunk{{Seq: seq, N: len(tokens)}}}
	l, err := r.Step(&b, rows)
	if err != nil {
		return nil, err
	}
	return append([]float32(nil), l...), nil
}

// Decode appends one token to seq and returns its logits (owned by the
// runner, valid until the next call). It does not allocate.
func (r *Runner) Decode(seq kv.SeqID, token int32) ([]float32, error) {
	r.one.tok[0] = token
	r.one.chunk[0] = Chunk{Seq: seq, N: 1}
	r.one.b = Batch{Tokens: r.one.tok[:], Chunks: r.one.chunk[:]}
	return r.Step(&r.one.b, r.one.rows[:])
}
