package openai

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"shoal/engine/tokenizer"
	"shoal/serve"
)

// scripted is a Submitter that replays fixed token ids (in the test
// vocabulary ids 0-255 are the bytes themselves) and ends with reason.
type scripted struct {
	toks   []int32
	reason string
}

func (s *scripted) Capacity() int { return 1 << 20 }

func (s *scripted) Submit(ctx context.Context, req serve.Request) (<-chan serve.Event, error) {
	ch := make(chan serve.Event, len(s.toks)+1)
	for _, t := range s.toks {
		ch <- serve.Event{Token: t, Logprob: -float32(t) / 1000}
	}
	ch <- serve.Event{Done: true, Reason: s.reason, Prompt: len(req.Prompt), Generated: len(s.toks) + 1}
	close(ch)
	return ch, nil
}

func byteTokens(s string) []int32 {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int32(s[i])
	}
	return out
}

func testTokenizer(t *testing.T) *tokenizer.Tokenizer {
	tok, err := tokenizer.New(testVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestStopStrings drives the stop-string logic with scripted byte tokens:
// a stop string split over several tokens is found, text that might start
// one is held back (no chunk ever carries part of a stop string), and the
// earliest stop wins.
func TestStopStrings(t *testing.T) {
	tok := testTokenizer(t)
	cases := []struct {
		name, text string
		stops      []string
		reason     string
		want       string
		finish     string
		tokens     int // tokens reported for the emitted text
	}{
		{"across three tokens", "xyzENDabc", []string{"END"}, "length", "xyz", "stop", 3},
		{"prefix that does not complete", "xyzENx", []string{"END"}, "length", "xyzENx", "length", 6},
		{"prefix at the end is released", "abEN", []string{"END"}, "length", "abEN", "length", 4},
		{"earliest of several", "zabc", []string{"c", "ab"}, "length", "z", "stop", 1},
		{"at the very start", "ENDx", []string{"END"}, "length", "", "stop", 0},
		{"utf-8 split over tokens", "caf\xc3\xa9!", []string{"é!"}, "length", "caf", "stop", 3},
		{"end of generation, no stop", "hello", []string{"zz"}, "stop", "hello", "stop", 5},
		{"no stops", "hello", nil, "length", "hello", "length", 5},
		{"overlapping prefixes", "aaab", []string{"aab"}, "length", "a", "stop", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := &exchange{r: httptest.NewRequest("POST", "/", nil), start: time.Now()}
			ctx, cancel := context.WithCancel(context.Background())
			sub := &scripted{toks: byteTokens(c.text), reason: c.reason}
			ch, _ := sub.Submit(ctx, serve.Request{Prompt: []int32{1}})
			g := &generation{x: x, ctx: ctx, cancel: cancel, ch: ch, tok: tok, stops: c.stops, prompt: 1}
			var chunks []string
			var ntok int
			res := g.run(func(s string, toks []genToken) error {
				chunks = append(chunks, s)
				for _, tk := range toks {
					if tk.id >= 0 {
						ntok++
					}
				}
				return nil
			})
			got := strings.Join(chunks, "")
			if res.err != nil || got != c.want || res.finish != c.finish || ntok != c.tokens {
				t.Fatalf("got %q finish %q tokens %d err %v; want %q %q %d", got, res.finish, ntok, res.err, c.want, c.finish, c.tokens)
			}
			for _, s := range c.stops {
				for _, ch := range chunks {
					if strings.Contains(ch, s) {
						t.Fatalf("chunk %q contains the stop %q", ch, s)
					}
				}
			}
			if c.finish == "stop" && c.reason != "stop" && ctx.Err() == nil {
				t.Fatal("a stop string did not cancel the generation")
			}
		})
	}
}

func TestHeldBack(t *testing.T) {
	for _, c := range []struct {
		text  string
		stops []string
		want  int
	}{
		{"abc", []string{"cd"}, 1},
		{"abc", []string{"bcd", "cd"}, 2},
		{"abc", []string{"abc"}, 0}, // a whole stop is found, not held
		{"abc", []string{"x"}, 0},
		{"", []string{"x"}, 0},
	} {
		if got := heldBack(c.text, c.stops); got != c.want {
			t.Errorf("heldBack(%q, %q) = %d, want %d", c.text, c.stops, got, c.want)
		}
	}
}
