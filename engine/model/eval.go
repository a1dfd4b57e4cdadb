package model

import "shoal/engine/kv"

// Prompt appends tokens to sequence seq in one batch over the runner's whole
// range, which must be the whole model, and returns the logits of the rows
// listed in rows (indexes into tokens; all rows if nil), len(rows) x NVocab.
func (r *Runner) Prompt(seq kv.SeqID, tokens []int32, rows []int) ([]float32, error) {
	b := &Batch{Tokens: tokens, Chunks: []Chunk{{Seq: seq, N: len(tokens)}}}
	if err := r.Reserve(b); err != nil {
		return nil, err
	}
	x := make([]float32, len(tokens)*r.m.NEmbd)
	if err := r.Embed(tokens, x); err != nil {
		r.cache.Truncate(seq, b.Chunks[0].Pos)
		return nil, err
	}
	if err := r.Forward(b, r.lo, r.hi, x); err != nil {
		return nil, err
	}
	if rows == nil {
		rows = make([]int, len(tokens))
		for i := range rows {
			rows[i] = i
		}
	}
	out := make([]float32, len(rows)*r.m.NVocab)
	r.Logits(x, rows, out)
	return out, nil
}
