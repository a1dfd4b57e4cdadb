package node

import (
	"time"

	"shoal/coordinator"
)

// Memberlist gossips only with the members it holds alive (and with the
// dead for a short while), so the two sides of a partition that outlasted
// that, each holding the other failed, never speak again on their own: a
// healed 20 s Wi-Fi blip left a node split off until it restarted (#35).
// The agent therefore joins its failed members again in the background,
// at their last gossip addresses, as Consul's agents reconnect failed
// members: a join is a push/pull of both views, after which each side
// refutes its own death and the views merge.

const (
	// rejoinFirst is how long after a member is seen failed the first
	// join is tried, rejoinMax the most the wait between tries grows to.
	rejoinFirst = 2 * time.Second
	rejoinMax   = 15 * time.Second
)

// rejoiner schedules the joins of failed members, each with its own
// backoff (doubling from rejoinFirst to rejoinMax, so a healed partition
// merges within rejoinMax), forgotten once the member is alive or left.
type rejoiner struct {
	next map[string]time.Time     // by node ID: when to try again
	wait map[string]time.Duration // by node ID: the wait after that try
}

// due returns the gossip addresses of the failed members whose try is due
// at now (never a node that left, this node, or a removed one), and moves
// their next try on.
func (r *rejoiner) due(now time.Time, self string, members []coordinator.Member, revoked func(string) bool) []string {
	if r.next == nil {
		r.next, r.wait = map[string]time.Time{}, map[string]time.Duration{}
	}
	var out []string
	failed := map[string]bool{}
	for _, m := range members {
		if m.ID == self || m.Status != coordinator.StatusFailed || m.Addr == "" || (revoked != nil && revoked(m.ID)) {
			continue
		}
		failed[m.ID] = true
		at, ok := r.next[m.ID]
		if !ok {
			r.next[m.ID], r.wait[m.ID] = now.Add(rejoinFirst), rejoinFirst
			continue
		}
		if now.Before(at) {
			continue
		}
		out = append(out, m.Addr)
		w := min(2*r.wait[m.ID], rejoinMax)
		r.next[m.ID], r.wait[m.ID] = now.Add(w), w
	}
	for id := range r.next {
		if !failed[id] {
			delete(r.next, id)
			delete(r.wait, id)
		}
	}
	return out
}
