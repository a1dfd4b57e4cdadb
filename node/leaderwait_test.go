package node_test

import (
	"context"
	"testing"
	"time"

	"shoal/api"
	tc "shoal/node/nodetest"
)

// TestWritesWaitForLeader (issue 21, must-show 5): during a forced
// election (the leader crashes), a token create and a model load sent to
// a surviving agent right away succeed once the new leader is in, instead
// of failing at once with 503 "not the leader".
func TestWritesWaitForLeader(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	path := writeModel(t)
	li := c.Leader(5 * time.Second)
	survivor := (li + 1) % len(c.Members)
	cl := c.Client(survivor, "")
	oldID := c.Members[li].Agent.ID()

	c.Stop(li, false) // a crash: no leave, an election follows
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		what string
		err  error
		took time.Duration
	}
	results := make(chan result, 2)
	go func() {
		_, err := cl.CreateToken(ctx, api.TokenRequest{Kind: api.TokenInference, Description: "made during an election"})
		results <- result{"token create", err, time.Since(start)}
	}()
	go func() {
		_, err := cl.LoadModel(ctx, api.LoadModelRequest{Path: path, Name: "during-election"})
		results <- result{"model load", err, time.Since(start)}
	}()
	for range 2 {
		r := <-results
		t.Logf("%s during the election: %v after %v", r.what, r.err, r.took.Round(time.Millisecond))
		if r.err != nil {
			t.Errorf("%s: %v", r.what, r.err)
		}
	}
	s, err := cl.Status(ctx)
	if err != nil || s.Leader == "" || s.Leader == oldID {
		t.Fatalf("status after the writes: %+v %v", s, err)
	}
	toks, err := cl.Tokens(ctx)
	found := false
	for _, tok := range toks {
		found = found || tok.Description == "made during an election"
	}
	if err != nil || !found {
		t.Fatalf("the token made during the election is not listed: %v", err)
	}
	models, err := cl.Models(ctx)
	found = false
	for _, m := range models {
		found = found || m.Name == "during-election"
	}
	if err != nil || !found {
		t.Fatalf("the model loaded during the election is not listed: %v", err)
	}
}
