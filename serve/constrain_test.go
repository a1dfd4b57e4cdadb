package serve

import (
	"context"
	"reflect"
	"regexp"
	"testing"

	"shoal/engine/model"
	"shoal/engine/sample"
	"shoal/engine/sample/grammar"
	"shoal/engine/tokenizer"
)

// TestConstrainedSequences: sequences held to a grammar draw only tokens
// it allows and stop when it is complete (the model here never ends by
// itself), both where the scheduler samples and where a RowSampler engine
// samples with the allowed set the scheduler sends (the last stage of a
// plan on another node): the same tokens either way.
func TestConstrainedSequences(t *testing.T) {
	m := testModel(t)
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		t.Fatal(err)
	}
	pieces := make([][]byte, tok.NVocab())
	for id := range int32(tok.NVocab()) {
		if !tok.IsControl(id) {
			pieces[id] = tok.Piece(id)
		}
	}
	g, err := grammar.Parse(`root ::= [a-z]{3,12} ("." | "!")`)
	if err != nil {
		t.Fatal(err)
	}
	cons := grammar.NewConstraint(g, grammar.NewVocab(pieces, nil))
	valid := regexp.MustCompile(`^[a-z]{3,12}[.!]$`)
	p := sample.Params{Temperature: 1, Seed: 4}
	run := func(e Engine) [][]int32 {
		s, err := NewEngine(e, func(int32) bool { return false }, Options{MaxSeqs: 4, MaxTokens: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		chs := make([]<-chan Event, 4)
		for i := range chs {
			q := p
			q.Seed += uint64(i)
			if chs[i], err = s.Submit(context.Background(), Request{Prompt: prompt(i, 5+i), MaxTokens: 40, Sampling: q, Constraint: cons.Start()}); err != nil {
				t.Fatal(err)
			}
		}
		out := make([][]int32, len(chs))
		for i, ch := range chs {
			toks, end := collect(t, ch)
			text := tok.Decode(toks)
			if end.Reason != "stop" || !valid.MatchString(text) {
				t.Fatalf("sequence %d: %q, ended %q (%v)", i, text, end.Reason, end.Err)
			}
			out[i] = toks
		}
		return out
	}
	runner := func() *model.Runner {
		r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	want := run(RunnerEngine{runner()})
	rs := &rowSampler{RunnerEngine: RunnerEngine{runner()}, samplers: map[sample.Params]*sample.Sampler{}}
	if got := run(rs); !reflect.DeepEqual(got, want) {
		t.Fatalf("sampled by the engine %v, by the scheduler %v", got, want)
	}
	if rs.steps == 0 {
		t.Fatal("the scheduler never asked its RowSampler for tokens")
	}
}
