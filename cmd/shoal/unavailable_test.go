package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"shoal/api"
)

// TestWhileUnserved: logits and bench --cluster wait through 503s (a model
// being re-planned), saying so once, and return any other answer at once.
func TestWhileUnserved(t *testing.T) {
	var w strings.Builder
	calls := 0
	err := whileUnserved(context.Background(), &w, func() error {
		calls++
		if calls < 3 {
			return &api.APIError{Code: 503, Msg: `model "m" is not served yet (loading)`}
		}
		return nil
	})
	if err != nil || calls != 3 || strings.Count(w.String(), "not served yet") != 1 {
		t.Fatalf("err %v after %d calls, said %q", err, calls, w.String())
	}
	calls = 0
	bad := &api.APIError{Code: 404, Msg: "no such model"}
	err = whileUnserved(context.Background(), &w, func() error { calls++; return bad })
	if !errors.Is(err, bad) || calls != 1 {
		t.Fatalf("a 404 was retried: %v, %d calls", err, calls)
	}
}
