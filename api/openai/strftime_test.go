package openai

import (
	"testing"
	"time"
)

func TestStrftime(t *testing.T) {
	tm := time.Date(2024, time.July, 6, 15, 4, 5, 0, time.UTC)
	if got := strftime(tm, "%d %b %Y|%B %e|%Y-%m-%d %H:%M:%S|%I%p|%a %A|%j|%%|%q"); got != "06 Jul 2024|July  6|2024-07-06 15:04:05|03PM|Sat Saturday|188|%|%q" {
		t.Fatalf("got %q", got)
	}
}
