package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestClientRetriesWithoutLeader: a write answered 503 because the cluster
// has no leader is sent again (the body too) until it succeeds, telling
// the caller before each retry; other errors, and the same 503 once the
// wait is over, are returned.
func TestClientRetriesWithoutLeader(t *testing.T) {
	var calls, failFirst atomic.Int32
	var msg atomic.Pointer[string]
	set := func(m string, n int32) { msg.Store(&m); failFirst.Store(n) }
	set("not the leader", 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		var req TokenRequest
		if err := decodeJSON(r, &req); err != nil || req.Description != "d" {
			http.Error(w, `{"error":"bad body"}`, http.StatusBadRequest)
			return
		}
		if n <= failFirst.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"` + *msg.Load() + `"}`))
			return
		}
		w.Write([]byte(`{"id":"t1","secret":"s"}`))
	}))
	defer srv.Close()
	c := NewClient(srv.URL, "k")
	told := 0
	c.OnLeaderWait = func() { told++ }
	tok, err := c.CreateToken(context.Background(), TokenRequest{Description: "d"})
	if err != nil || tok.ID != "t1" || calls.Load() != 3 || told != 2 {
		t.Fatalf("through an election: %+v %v after %d calls, told %d times", tok, err, calls.Load(), told)
	}

	calls.Store(0)
	set("the model file is on a failed node", 2)
	if _, err := c.CreateToken(context.Background(), TokenRequest{Description: "d"}); err == nil || calls.Load() != 1 {
		t.Fatalf("another 503: %v after %d calls", err, calls.Load())
	}

	calls.Store(0)
	set("no cluster leader", 1000)
	c.LeaderWait = 600 * time.Millisecond
	start := time.Now()
	if _, err := c.CreateToken(context.Background(), TokenRequest{Description: "d"}); err == nil || time.Since(start) > 2*time.Second || calls.Load() < 2 {
		t.Fatalf("no leader for good: %v after %v and %d calls", err, time.Since(start), calls.Load())
	}
}

func decodeJSON(r *http.Request, v any) error { return json.NewDecoder(r.Body).Decode(v) }
