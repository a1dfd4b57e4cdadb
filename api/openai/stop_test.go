package openai

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// scripted is a Stream that replays fixed token ids and ends with reason.
type scripted struct {
	events []Event
	// cancelled is set when Cancel is called before the final event was
	// read.
	cancelled bool
}

func newScripted(toks []int32, reason string) *scripted {
	s := &scripted{}
	for _, t := range toks {
		s.events = append(s.events, Event{Token: t, Logprob: -float32(t) / 1000})
	}
	s.events = append(s.events, Event{Done: true, Reason: reason, Generated: len(toks) + 1})
	return s
}

func (s *scripted) Next() (Event, error) {
	if len(s.events) == 0 {
		return Event{}, errors.New("read past the final event")
	}
	ev := s.events[0]
	s.events = s.events[1:]
	return ev, nil
}

func (s *scripted) Cancel() { s.cancelled = s.cancelled || len(s.events) > 0 }

func byteTokens(s string) []int32 {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int32(s[i])
	}
	return out
}

// byteTokenizer's ids 0-255 are the bytes themselves; it decodes only.
type byteTokenizer struct{ Tokenizer }

func (byteTokenizer) NewDecoder() Decoder { return &byteDecoder{} }

// byteDecoder holds back an incomplete UTF-8 sequence.
type byteDecoder struct{ pending []byte }

func (d *byteDecoder) Add(id int32) string {
	d.pending = append(d.pending, byte(id))
	n := len(d.pending)
	for i := max(0, n-3); i < n; i++ {
		if utf8.RuneStart(d.pending[i]) && !utf8.FullRune(d.pending[i:]) {
			n = i
			break
		}
	}
	out := string(d.pending[:n])
	d.pending = append([]byte(nil), d.pending[n:]...)
	return out
}

func (d *byteDecoder) Flush() string {
	out := string(d.pending)
	d.pending = nil
	return out
}

// TestStopStrings drives the stop-string logic with scripted byte tokens:
// a stop string split over several tokens is found, text that might start
// one is held back (no chunk ever carries part of a stop string), and the
// earliest stop wins.
func TestStopStrings(t *testing.T) {
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
			st := newScripted(byteTokens(c.text), c.reason)
			g := &generation{x: x, rec: &x.rec, stream: st, tok: byteTokenizer{}, stops: c.stops, prompt: 1}
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
			if c.finish == "stop" && c.reason != "stop" && !st.cancelled {
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
