package openai

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestStrftime(t *testing.T) {
	tm := time.Date(2024, time.July, 6, 15, 4, 5, 0, time.UTC)
	if got := strftime(tm, "%d %b %Y|%B %e|%Y-%m-%d %H:%M:%S|%I%p|%a %A|%j|%%|%q"); got != "06 Jul 2024|July  6|2024-07-06 15:04:05|03PM|Sat Saturday|188|%|%q" {
		t.Fatalf("got %q", got)
	}
}

func TestReadSSE(t *testing.T) {
	var got []string
	err := readSSE(strings.NewReader(": keep-alive\n\ndata: {\"a\":1}\n\ndata:{\"b\":\ndata: 2}\n\ndata: [DONE]\n\n"), func(d []byte) error {
		got = append(got, string(d))
		return nil
	})
	if err != nil || len(got) != 2 || got[0] != `{"a":1}` || got[1] != "{\"b\":\n2}" {
		t.Fatalf("%q %v", got, err)
	}
	if err := readSSE(strings.NewReader("data: {}\n\n"), func([]byte) error { return nil }); !errors.Is(err, errNoDone) {
		t.Fatalf("truncated stream: %v", err)
	}
}
