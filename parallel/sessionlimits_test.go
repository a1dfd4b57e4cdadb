package parallel

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"shoal/engine/model"
	"shoal/placement"
	"shoal/transport"
)

// setLimits sets the session limits of every host of cl.
func (cl *cluster) setLimits(l SessionLimits) {
	for _, h := range cl.hosts {
		h.SetSessionLimits(l)
	}
}

// sessions is the number of sessions each member holds.
func (cl *cluster) sessions() []int {
	out := make([]int, len(cl.members))
	for i, m := range cl.members {
		out[i] = m.Sessions()
	}
	return out
}

// otherDriver is a driver of cl's plan on a node of its own.
func otherDriver(t *testing.T, cl *cluster, plan placement.Plan, node string, opt Options) *Cluster {
	t.Helper()
	ep := listen(t, node)
	h := NewHost(ep, nil, nil)
	t.Cleanup(func() { h.Close(); ep.Close() })
	c, err := h.NewCluster(plan, cl.addrs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func want429(t *testing.T, what string, err error, says string) {
	t.Helper()
	if err == nil || transport.StatusOf(err) != http.StatusTooManyRequests || !strings.Contains(err.Error(), says) {
		t.Fatalf("%s: %v (status %d), want 429 saying %q", what, err, transport.StatusOf(err), says)
	}
	t.Logf("%s: %v", what, err)
}

// TestSessionsPerPeerBounded: a node may hold PerPeer sessions on a
// member; its next dist.open is refused with 429 before a runner (and its
// KV cache) is built, and succeeds once one closes. All nodes together
// hold at most Total.
func TestSessionsPerPeerBounded(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	opt := Options{Timeout: 5 * time.Second}
	cl := startCluster(t, path, plan, opt)
	cl.setLimits(SessionLimits{PerPeer: 3, Total: 4, Idle: time.Hour})
	ctx := context.Background()
	var open []*Session
	for range 3 {
		s, err := cl.drv.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
	}
	_, err := cl.drv.Open(ctx)
	want429(t, "a 4th session of one node", err, "the most one node may")
	for i, n := range cl.sessions() {
		if n != 3 {
			t.Fatalf("member %d holds %d sessions, want 3", i, n)
		}
	}
	_ = open[0].Close(ctx)
	s, err := cl.drv.Open(ctx)
	if err != nil {
		t.Fatalf("a session after one closed: %v", err)
	}
	b := model.Batch{Tokens: []int32{1, 2, 3}, Chunks: []model.Chunk{{Seq: 1, N: 3}}}
	if _, err := s.Step(ctx, &b, []int{2}); err != nil {
		t.Fatal(err)
	}
	other := otherDriver(t, cl, plan, "driver-b", opt)
	if _, err := other.Open(ctx); err != nil {
		t.Fatalf("another node's first session: %v", err)
	}
	_, err = other.Open(ctx)
	want429(t, "a 5th session on the member", err, "the most it keeps")
}

// TestIdleSessionsReclaimed: sessions whose driver went away without
// closing them are closed once unused for Idle, while an unused session
// of a driver still connected stays; at the limit, a node's session
// unused for Idle makes room for its new one.
func TestIdleSessionsReclaimed(t *testing.T) {
	ref, path := openRef(t)
	plan := shapeOf(&ref.Config).Plans(denseQ8.Name).Get("pp2")
	opt := Options{Timeout: 5 * time.Second}
	cl := startCluster(t, path, plan, opt)
	const idle = 300 * time.Millisecond
	cl.setLimits(SessionLimits{PerPeer: 2, Total: 8, Idle: idle})
	ctx := context.Background()
	kept, err := cl.drv.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A driver that opens two sessions and goes away.
	ep := listen(t, "driver-gone")
	h := NewHost(ep, nil, nil)
	gone, err := h.NewCluster(plan, cl.addrs(), opt)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := gone.Open(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := cl.sessions(); got[0] != 3 || got[1] != 3 {
		t.Fatalf("sessions %v, want 3 on each member", got)
	}
	h.Close()
	ep.Close()
	t0 := time.Now()
	var got []int
	for end := t0.Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if got = cl.sessions(); got[0] == 1 && got[1] == 1 {
			break
		}
	}
	t.Logf("sessions of the driver that went away closed %v after it went (idle %v): %v left", time.Since(t0).Round(time.Millisecond), idle, got)
	if got[0] != 1 || got[1] != 1 {
		t.Fatalf("sessions %v, want only the connected driver's one left on each member", got)
	}
	// The connected driver's session, unused for longer than idle, stays
	// and serves.
	time.Sleep(3 * idle)
	step := func(s *Session) error {
		b := model.Batch{Tokens: []int32{1, 2}, Chunks: []model.Chunk{{Seq: 1, N: 2}}}
		_, err := s.Step(ctx, &b, []int{1})
		return err
	}
	if err := step(kept); err != nil {
		t.Fatalf("the connected driver's idle session: %v", err)
	}
	// At the limit: a second session, then a third once both are idle,
	// which takes the place of the least recently used (kept).
	if _, err := cl.drv.Open(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * idle)
	third, err := cl.drv.Open(ctx)
	if err != nil {
		t.Fatalf("a session at the limit with idle ones: %v", err)
	}
	if got := cl.sessions(); got[0] != 2 || got[1] != 2 {
		t.Fatalf("sessions %v, want 2 on each member", got)
	}
	if err := step(kept); err == nil {
		t.Fatal("the least recently used session still serves after it made room")
	} else {
		t.Logf("the session that made room: %v", err)
	}
	if err := step(third); err != nil {
		t.Fatal(err)
	}
}
