package generate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/engine/tokenizer"
)

// Request is one generation.
type Request struct {
	Prompt    string
	MaxTokens int // tokens to generate (<= 0: until end of generation or context)
	Sampling  sample.Params
	// ParseSpecial lets control-token text in the prompt (e.g. "<|im_start|>")
	// become its token.
	ParseSpecial bool
}

// Stats reports what a generation did and how fast.
type Stats struct {
	PromptTokens int
	Generated    int
	PromptTime   time.Duration
	DecodeTime   time.Duration
	StopReason   string // "length", "eog", "context"
}

// PromptTPS is prompt tokens per second.
func (s Stats) PromptTPS() float64 { return perSec(s.PromptTokens, s.PromptTime) }

// DecodeTPS is generated tokens per second (excluding the first, which the
// prompt pass produced).
func (s Stats) DecodeTPS() float64 { return perSec(s.Generated-1, s.DecodeTime) }

func perSec(n int, d time.Duration) float64 {
	if n <= 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Run generates text for req on r (which must hold the whole model) with
// sequence id seq, calling emit with each piece of text as it becomes valid
// UTF-8. The sequence's cache is freed at the end.
func Run(ctx context.Context, r *model.Runner, tok *tokenizer.Tokenizer, seq kv.SeqID, req Request, emit func(string) error) (st Stats, err error) {
	if lo, hi := r.Range(); lo != 0 || hi != r.Model().NLayer {
		return st, fmt.Errorf("generation needs the whole model, runner holds layers [%d,%d)", lo, hi)
	}
	if err := req.Sampling.Validate(); err != nil {
		return st, err
	}
	ids := tok.Encode(req.Prompt, true, req.ParseSpecial)
	if len(ids) == 0 {
		return st, errors.New("the prompt is empty and the model adds no BOS token")
	}
	cache := r.Cache()
	defer cache.Free(seq)
	capacity := cache.Config().NumBlocks * cache.Config().BlockSize
	if len(ids) >= capacity {
		return st, fmt.Errorf("prompt of %d tokens does not fit the context of %d", len(ids), capacity)
	}
	st.PromptTokens = len(ids)
	t0 := time.Now()
	logits, err := r.Prompt(seq, ids, []int{len(ids) - 1})
	if err != nil {
		return st, err
	}
	st.PromptTime = time.Since(t0)
	s := sample.New(req.Sampling, r.Model().NVocab)
	dec := tok.NewDecoder()
	history := append([]int32(nil), ids...)
	t1 := time.Now()
	defer func() { st.DecodeTime = time.Since(t1) }()
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		next := s.Sample(logits, history)
		st.Generated++
		history = append(history, next)
		if tok.IsEOG(next) {
			st.StopReason = "eog"
			break
		}
		if text := dec.Add(next); text != "" {
			if err := emit(text); err != nil {
				return st, err
			}
		}
		if req.MaxTokens > 0 && st.Generated >= req.MaxTokens {
			st.StopReason = "length"
			break
		}
		if cache.Len(seq) >= capacity {
			st.StopReason = "context"
			break
		}
		logits, err = r.Decode(seq, next)
		if err != nil {
			return st, err
		}
	}
	if text := dec.Flush(); text != "" {
		if err := emit(text); err != nil {
			return st, err
		}
	}
	return st, nil
}
