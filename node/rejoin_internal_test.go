package node

import (
	"slices"
	"testing"
	"time"

	"shoal/coordinator"
)

// TestRejoinSchedule: failed members are joined again at their gossip
// addresses, first rejoinFirst after they are seen failed, then with a
// doubling wait capped at rejoinMax; never this node, a member that left
// or was removed; a member alive again is forgotten (its next failure
// starts over).
func TestRejoinSchedule(t *testing.T) {
	var r rejoiner
	t0 := time.Unix(1000, 0)
	m := func(id string, st coordinator.NodeStatus) coordinator.Member {
		return coordinator.Member{ID: id, Addr: id + ":7946", Status: st}
	}
	members := []coordinator.Member{m("self", coordinator.StatusFailed), m("a", coordinator.StatusFailed), m("b", coordinator.StatusLeft),
		m("c", coordinator.StatusAlive), m("gone", coordinator.StatusFailed), m("d", coordinator.StatusSuspect)}
	revoked := func(id string) bool { return id == "gone" }
	var tries []time.Duration
	for s := time.Duration(0); s <= 10*time.Minute; s += time.Second {
		got := r.due(t0.Add(s), "self", members, revoked)
		switch {
		case len(got) == 0:
		case slices.Equal(got, []string{"a:7946"}):
			tries = append(tries, s)
		default:
			t.Fatalf("at %v: joins %v, want only a's address", s, got)
		}
	}
	want := []time.Duration{2 * time.Second, 6 * time.Second, 14 * time.Second, 29 * time.Second, 44 * time.Second}
	if len(tries) < len(want) || !slices.Equal(tries[:len(want)], want) {
		t.Fatalf("tries at %v, want %v then every %v", tries, want, rejoinMax)
	}
	for i := len(want); i < len(tries); i++ {
		if d := tries[i] - tries[i-1]; d != rejoinMax {
			t.Fatalf("tries at %v: %v apart, want %v", tries, d, rejoinMax)
		}
	}
	// Alive again, then failed again: the schedule starts over.
	members[1].Status = coordinator.StatusAlive
	now := t0.Add(11 * time.Minute)
	if got := r.due(now, "self", members, revoked); len(got) != 0 {
		t.Fatalf("an alive member joined again: %v", got)
	}
	members[1].Status = coordinator.StatusFailed
	if got := r.due(now.Add(time.Second), "self", members, revoked); len(got) != 0 {
		t.Fatalf("joined at once: %v", got)
	}
	if got := r.due(now.Add(time.Second+rejoinFirst), "self", members, revoked); !slices.Equal(got, []string{"a:7946"}) {
		t.Fatalf("after a new failure: %v, want a's address after %v", got, rejoinFirst)
	}
}
