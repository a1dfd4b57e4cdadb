package serve

import (
	"errors"
	"fmt"

	"shoal/engine/gguf"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
)

// Drafter proposes the tokens a decoding sequence is likely to go on
// with; the scheduler verifies them in its next step (speculate.go). A
// drafter's guesses only cost time: every token emitted is still drawn
// from the served model's own logits.
type Drafter interface {
	// Draft appends to dst up to k tokens likely to follow toks (the
	// sequence's prompt and generated tokens), and returns dst.
	Draft(seq kv.SeqID, toks []int32, k int, dst []int32) []int32
	// Forget drops what the drafter keeps for seq (it ended).
	Forget(seq kv.SeqID)
}

// lookupDrafter drafts by prompt lookup: what followed the latest earlier
// occurrence of the context's last n-gram.
type lookupDrafter struct{}

func (lookupDrafter) Draft(_ kv.SeqID, toks []int32, k int, dst []int32) []int32 {
	return lookup(toks, k, dst)
}

func (lookupDrafter) Forget(kv.SeqID) {}

// ModelDrafter drafts with a small model of the same vocabulary run whole
// on this machine: its greedy continuation. It keeps each sequence's KV in
// its own cache, cut back to what the sequence still shares with it
// (drafts the served model rejected are dropped there too), so a draft
// costs the new tokens since the last one plus a step per drafted token.
// A deterministic draft keeps verification exact for every sampler: the
// token emitted is drawn from the served model's row and the draft is
// kept only where it equals that token.
//
// It is used from the scheduler's goroutine only.
type ModelDrafter struct {
	r     *model.Runner
	owned *model.Model         // closed by Close, with r (OpenModelDrafter)
	have  map[kv.SeqID][]int32 // the tokens in r's cache, by sequence
	batch model.Batch
	rows  [1]int
}

// draftChunk bounds the tokens of one step of the draft model catching up
// with a sequence (a prompt is fed in steps of this many).
const draftChunk = 256

// NewModelDrafter drafts with r, which must hold the whole model and a
// vocabulary of nVocab tokens (the served model's).
func NewModelDrafter(r *model.Runner, nVocab int) (*ModelDrafter, error) {
	m := r.Model()
	if lo, hi := r.Range(); lo != 0 || hi != m.NLayer {
		return nil, fmt.Errorf("serve: the draft runner holds layers [%d,%d) of %d: a draft model runs whole", lo, hi, m.NLayer)
	}
	if m.NVocab != nVocab {
		return nil, fmt.Errorf("serve: the draft model has a vocabulary of %d tokens and the served model %d: a draft must share the served model's vocabulary", m.NVocab, nVocab)
	}
	return &ModelDrafter{r: r, have: map[kv.SeqID][]int32{}}, nil
}

// Draft feeds the draft model what it has not seen of toks and appends
// its greedy continuation of up to k tokens to dst. A cache too full for
// the sequence gives fewer (or none): the step then runs without them.
func (d *ModelDrafter) Draft(seq kv.SeqID, toks []int32, k int, dst []int32) []int32 {
	if k <= 0 || len(toks) == 0 {
		return dst
	}
	h := d.have[seq]
	n := 0
	for n < len(h) && n < len(toks)-1 && h[n] == toks[n] {
		n++ // the last token is always fed: its row is the first draft
	}
	c := d.r.Cache()
	c.Truncate(seq, n)
	h = h[:n]
	feed := toks[n:]
	for len(feed) > 0 && k > 0 {
		in := feed[:min(len(feed), draftChunk)]
		feed = feed[len(in):]
		logits, err := d.step(seq, in, len(feed) == 0)
		if err != nil {
			c.Truncate(seq, len(h))
			d.have[seq] = h
			return dst
		}
		h = append(h, in...)
		if len(feed) > 0 {
			continue
		}
		t := sample.Argmax(logits)
		dst = append(dst, t)
		k--
		if k > 0 {
			feed = append(feed[:0:0], t)
		}
	}
	d.have[seq] = h
	return dst
}

// step runs toks of seq through the draft model, returning the last
// token's logits when row is set.
func (d *ModelDrafter) step(seq kv.SeqID, toks []int32, row bool) ([]float32, error) {
	b := &d.batch
	b.Tokens = append(b.Tokens[:0], toks...)
	b.Chunks = append(b.Chunks[:0], model.Chunk{Seq: seq, N: len(toks)})
	rows := d.rows[:0]
	if row {
		d.rows[0] = len(toks) - 1
		rows = d.rows[:1]
	}
	l, err := d.r.Step(b, rows)
	if err == nil && row && len(l) == 0 {
		err = errors.New("serve: the draft model returned no logits")
	}
	return l, err
}

// OpenModelDrafter loads the draft model at path for a served model whose
// GGUF file is servedPath: the two must have the same vocabulary, token
// for token. Its KV cache holds cacheTokens positions (the served model's
// capacity: a draft is never shorter of room than what it drafts for).
// Close releases it; a scheduler closes the Drafter it was given.
func OpenModelDrafter(path, servedPath string, threads, cacheTokens int) (*ModelDrafter, error) {
	if err := sameVocabulary(path, servedPath); err != nil {
		return nil, err
	}
	m, err := model.Open(path)
	if err != nil {
		return nil, fmt.Errorf("draft model %s: %w", path, err)
	}
	r, err := model.NewRunner(m, model.Options{Threads: threads, CacheTokens: cacheTokens})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("draft model %s: %w", path, err)
	}
	d, err := NewModelDrafter(r, m.NVocab)
	if err != nil {
		r.Close()
		m.Close()
		return nil, err
	}
	d.owned = m
	return d, nil
}

// CheckDraft reports whether the GGUF file at path can draft for the
// model at servedPath: the two list the same tokens.
func CheckDraft(path, servedPath string) error { return sameVocabulary(path, servedPath) }

// sameVocabulary checks that the GGUF files at a and b list the same
// tokens.
func sameVocabulary(a, b string) error {
	var fs [2]*gguf.File
	for i, p := range []string{a, b} {
		f, err := gguf.Open(p)
		if err != nil {
			return fmt.Errorf("draft: %w", err)
		}
		defer f.Close()
		fs[i] = f
	}
	return model.SameVocabulary(fs[0], a, fs[1], b)
}

// Close releases a drafter opened by OpenModelDrafter (its runner and
// model); one made by NewModelDrafter leaves its runner to its owner.
func (d *ModelDrafter) Close() error {
	if d.owned == nil {
		return nil
	}
	d.r.Close()
	d.owned.Close()
	d.owned = nil
	return nil
}

// Forget frees seq's KV in the draft model's cache.
func (d *ModelDrafter) Forget(seq kv.SeqID) {
	if _, ok := d.have[seq]; ok {
		d.r.Cache().Free(seq)
		delete(d.have, seq)
	}
}
