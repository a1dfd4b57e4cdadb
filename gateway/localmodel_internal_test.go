package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"shoal/api/openai"
	"shoal/engine/tokenizer"
	"shoal/serve"
)

// TestServeErrorClasses: the scheduler's errors reach the endpoint in its
// classes with their own messages; other errors pass unchanged.
func TestServeErrorClasses(t *testing.T) {
	for _, c := range serveErrorClasses {
		err := classifyServeError(fmt.Errorf("%w: details", c.serve))
		if !errors.Is(err, c.class) || !errors.Is(err, c.serve) || err.Error() != c.serve.Error()+": details" {
			t.Errorf("%v became %v", c.serve, err)
		}
	}
	other := errors.New("other")
	if err := classifyServeError(other); err != other {
		t.Errorf("other error became %v", err)
	}
}

// TestSchedStream converts the scheduler's events, ends on a closed channel
// and on the context.
func TestSchedStream(t *testing.T) {
	ch := make(chan serve.Event, 3)
	ch <- serve.Event{Token: 7, Logprob: -0.5, Top: []serve.TokenLogprob{{Token: 7, Logprob: -0.5}, {Token: 9, Logprob: -2}}}
	ch <- serve.Event{Done: true, Reason: "error", Err: serve.ErrClosed, Generated: 1, Cached: 16}
	close(ch)
	ctx, cancel := context.WithCancel(context.Background())
	s := &schedStream{ctx: ctx, cancel: cancel, ch: ch}
	ev, err := s.Next()
	if err != nil || ev.Token != 7 || ev.Logprob != -0.5 || !slices.Equal(ev.Top, []openai.Candidate{{Token: 7, Logprob: -0.5}, {Token: 9, Logprob: -2}}) {
		t.Fatalf("token event %+v %v", ev, err)
	}
	ev, err = s.Next()
	if err != nil || !ev.Done || ev.Reason != "error" || !errors.Is(ev.Err, openai.ErrClosed) || ev.Generated != 1 || ev.Cached != 16 {
		t.Fatalf("final event %+v %v", ev, err)
	}
	if _, err := s.Next(); !errors.Is(err, errNoFinalEvent) {
		t.Fatalf("closed stream: %v", err)
	}
	s = &schedStream{ctx: ctx, cancel: cancel, ch: make(chan serve.Event)}
	s.Cancel()
	if _, err := s.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled stream: %v", err)
	}
}

// TestOpenAITokenizer checks the special tokens and prompt encoding the
// endpoint sees.
func TestOpenAITokenizer(t *testing.T) {
	v, err := tokenizer.ByteLevelVocab(300)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(v)
	if err != nil {
		t.Fatal(err)
	}
	m := NewOpenAIModel("m", "me", nil, tok, "{{ bos_token }}")
	o := m.Tokenizer
	if sp := o.Specials(); sp.BOS != "<|bos|>" || sp.EOS != "<|eos|>" || sp.BOSID != tok.BOS() || !sp.AddBOS {
		t.Fatalf("specials %+v", sp)
	}
	if ids := o.Encode("<|bos|>hi", false); !slices.Equal(ids, tok.Encode("<|bos|>hi", false, true)) || ids[0] != tok.BOS() {
		t.Fatalf("special-token text not parsed: %v", ids)
	}
	if ids := o.Encode("hi", true); ids[0] != tok.BOS() || o.Decode(ids[1:]) != "hi" || string(o.Piece(ids[1])) != "h" {
		t.Fatalf("encode with BOS: %v", ids)
	}
	if o.ChatTemplate() != "{{ bos_token }}" || o.NVocab() != tok.NVocab() || m.Name != "m" || m.OwnedBy != "me" {
		t.Fatalf("model %+v", m)
	}
	if SchedulerOf(m) != nil || SchedulerOf(&openai.Model{}) != nil {
		t.Fatal("SchedulerOf found a scheduler")
	}
}

// TestToolMarkersRendered: control tokens that mark tool calls (DeepSeek's
// <｜tool▁sep｜> here) come out as their text, in pieces, in generated
// text (after any text held back before them) and in the grammar's
// vocabulary, so that a call's grammar allows the token; other control
// tokens stay silent and out of grammars.
func TestToolMarkersRendered(t *testing.T) {
	v, err := tokenizer.ByteLevelVocab(300)
	if err != nil {
		t.Fatal(err)
	}
	const sep, other = "<｜tool▁sep｜>", "<|other|>"
	v.Pad(304)
	v.Tokens[302], v.Types[302] = sep, tokenizer.TypeControl
	v.Tokens[303], v.Types[303] = other, tokenizer.TypeControl
	tok, err := tokenizer.New(v)
	if err != nil {
		t.Fatal(err)
	}
	m := NewOpenAIModel("m", "me", nil, tok, "")
	o := m.Tokenizer
	if got := string(o.Piece(302)); got != sep {
		t.Fatalf("the marker's piece is %q", got)
	}
	if got := string(o.Piece(303)); got != "" {
		t.Fatalf("another control token's piece is %q", got)
	}
	d := o.NewDecoder()
	var out string
	for _, id := range append(tok.Encode("f", false, false), 302, 303) {
		out += d.Add(id)
	}
	out += d.Add(tok.Encode("{}", false, false)[0]) + d.Flush()
	if !strings.HasPrefix(out, "f"+sep+"{") {
		t.Fatalf("generated text %q", out)
	}
	c, err := m.Constrainer.Grammar(`root ::= "f<｜tool▁sep｜>{}"`, []byte("f"))
	if err != nil {
		t.Fatal(err)
	}
	mask := c.Mask()
	if mask[302/64]&(1<<(302%64)) == 0 || mask[303/64]&(1<<(303%64)) != 0 {
		t.Fatal("the grammar does not allow the marker token, or allows the other control token")
	}
	if err := c.Accept(302); err != nil {
		t.Fatal(err)
	}
}
