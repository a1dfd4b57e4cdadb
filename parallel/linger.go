package parallel

import (
	"time"

	"shoal/placement"
)

// Make-before-break: when a model's plan is replaced (a node rejoined, a
// better arrangement was found), its nodes keep the old plan's shards and
// members running while the new plan's shards load, so the driver's
// session over the old plan serves until the driver moves to the new one
// at a step boundary. Lingers says, per model, which old plan still runs.
type Lingers struct {
	seen   map[string]*placement.Plan // the last plan seen of each model
	linger map[string]*lingering
}

type lingering struct {
	plan     *placement.Plan
	since    time.Time
	loadedAt time.Time // when the new plan was first seen loaded
}

const (
	// LingerAfterLoad is how long an old plan runs on once the new one is
	// loaded everywhere: a driver that stays on its node moves within a
	// reconcile or two; one whose model moves to another node finishes
	// the requests in flight on the old plan first (RetireMax).
	LingerAfterLoad = 30 * time.Second
	// LingerMax bounds how long an old plan runs beside a new one that
	// does not load.
	LingerMax = 3 * time.Minute
)

// Update takes the committed plans (by model) and whether each is loaded
// on all its nodes, and returns the old plans that still run (by model).
func (l *Lingers) Update(now time.Time, plans map[string]*placement.Plan, loaded func(model string) bool) map[string]*placement.Plan {
	if l.seen == nil {
		l.seen, l.linger = map[string]*placement.Plan{}, map[string]*lingering{}
	}
	for name, p := range plans {
		if old := l.seen[name]; old != nil && old.Version < p.Version {
			switch cur := l.linger[name]; {
			case cur != nil && cur.loadedAt.IsZero():
				// Replaced again before the plan after it loaded: the
				// driver still runs on cur's plan, which lingers on.
			case len(old.Pools) > 0:
				l.linger[name] = &lingering{plan: old, since: now}
			default:
				delete(l.linger, name)
			}
		}
		l.seen[name] = p
	}
	out := map[string]*placement.Plan{}
	for name, lg := range l.linger {
		p := plans[name]
		if p != nil && lg.loadedAt.IsZero() && loaded(name) {
			lg.loadedAt = now
		}
		if p == nil || now.Sub(lg.since) > LingerMax || !lg.loadedAt.IsZero() && now.Sub(lg.loadedAt) > LingerAfterLoad {
			delete(l.linger, name)
			continue
		}
		out[name] = lg.plan
	}
	for name := range l.seen {
		if plans[name] == nil {
			delete(l.seen, name)
		}
	}
	return out
}
