package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"shoal/api"
)

// unservedWait is how long logits and bench --cluster wait for a model
// that is loaded but not served right now (its plan being made, its
// shards fetched, a re-plan moving it) before giving up.
const unservedWait = 90 * time.Second

// whileUnserved calls f until it does not fail with 503 (the model is
// not served yet), for at most unservedWait, saying once on w that it
// waits and why.
func whileUnserved(ctx context.Context, w io.Writer, f func() error) error {
	deadline := time.Now().Add(unservedWait)
	said := false
	for {
		err := f()
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.Code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return err
		}
		if !said {
			fmt.Fprintf(w, "%s; waiting up to %v\n", ae.Msg, unservedWait)
			said = true
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}
