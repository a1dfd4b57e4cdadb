package node_test

import (
	"context"
	"strings"
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

// TestStaleServerConfirmsUnknownKeys: a server restarted while the cluster
// has no leader holds an old copy of the state. A key created after that
// copy is neither accepted nor refused there (503: nobody can confirm it);
// once a leader is in, it is accepted. (The fault suite saw a restarted
// server answer 401 to a valid key while it had not heard from the leader.)
func TestStaleServerConfirmsUnknownKeys(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	li := c.Leader(5 * time.Second)
	stale := (li + 1) % 3
	c.Stop(stale, false)
	tok, err := c.Client(li, "").CreateToken(ctx(t), api.TokenRequest{Kind: api.TokenInference, Description: "after the stale server stopped"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Members {
		c.Stop(i, false)
	}
	c.Restart(stale)
	url := "http://" + c.Members[stale].Agent.HTTPAddr() + "/v1/chat/completions"
	body := `{"model":"none","messages":[{"role":"user","content":"hi"}]}`
	start := time.Now()
	code, resp := request(t, tok.Secret, "POST", url, body)
	t.Logf("without a leader: HTTP %d after %v: %s", code, time.Since(start).Round(time.Millisecond), resp)
	if code != 503 || !strings.Contains(resp, "no leader") {
		t.Fatalf("a server that cannot confirm a key answered %d: %s", code, resp)
	}
	if code, resp := request(t, "sk-not-a-key", "POST", url, body); code != 503 {
		t.Fatalf("an unknown key without a leader: %d %s", code, resp)
	}
	c.Restart(li)
	tc.Eventually(t, 30*time.Second, "the key accepted once a leader is in", func() bool {
		code, resp = request(t, tok.Secret, "POST", url, body)
		return code == 404 // past the key check: the model does not exist
	})
	if code, resp := request(t, "sk-not-a-key", "POST", url, body); code != 401 {
		t.Fatalf("an unknown key with a leader: %d %s", code, resp)
	}
}
