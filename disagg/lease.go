package disagg

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// LeaseEnd says how a lease ended.
type LeaseEnd int

// How leases end.
const (
	LeaseAcked    LeaseEnd = 1 // the receiver acknowledged the transfer
	LeaseCanceled LeaseEnd = 2 // the sender gave up (abort, request cancelled)
	LeaseExpired  LeaseEnd = 3 // the deadline passed first
	LeaseClosed   LeaseEnd = 4 // the table was closed (the node is stopping)
)

// String names how the lease ended ("acked", "canceled", ...).
func (e LeaseEnd) String() string {
	switch e {
	case LeaseAcked:
		return "acked"
	case LeaseCanceled:
		return "canceled"
	case LeaseExpired:
		return "expired"
	case LeaseClosed:
		return "closed"
	}
	return fmt.Sprintf("LeaseEnd(%d)", int(e))
}

// Errors of Hold. After either the caller still owns what it meant to hold.
var (
	ErrLeaseHeld    = errors.New("lease already held")
	ErrLeasesClosed = errors.New("lease table closed")
)

// LeaseOptions configure a lease table.
type LeaseOptions struct {
	// Now is the clock Run sweeps with (time.Now if nil); tests inject one.
	Now func() time.Time
	// OnEnd, if set, is called after each release, outside the table's
	// lock, with the way the lease ended and a reason (the Cancel reason,
	// or what expired or closed it): for logs and metrics.
	OnEnd func(id uint64, end LeaseEnd, reason string)
}

// LeaseStats counts leases by how they ended, and those still held.
type LeaseStats struct {
	Held                             uint64
	Acked, Canceled, Expired, Closed uint64
}

// Leases is a sender's lease table: what a transfer holds (its KV blocks,
// its sequence) stays held until the receiver acknowledges the transfer,
// the sender cancels it, or its deadline passes, whichever comes first;
// then its release function runs exactly once. Expiry happens in Sweep,
// called by Run on a ticker (so a lease may outlive its deadline by up to
// Run's period) or directly by tests with the time they choose. Release
// functions run outside the table's lock, in the goroutine that ended the
// lease, and may call the table. Safe for concurrent use.
type Leases struct {
	now   func() time.Time
	onEnd func(uint64, LeaseEnd, string)

	mu     sync.Mutex
	held   map[uint64]*lease
	closed bool
	done   chan struct{}
	stats  LeaseStats // Held is filled in by Stats
}

type lease struct {
	deadline time.Time
	release  func()
}

// NewLeases returns an empty lease table.
func NewLeases(opt LeaseOptions) *Leases {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Leases{now: opt.Now, onEnd: opt.OnEnd, held: map[uint64]*lease{}, done: make(chan struct{})}
}

// Hold puts id under a lease until deadline; release runs once when it
// ends. On error (the id is held already, the table is closed, release is
// nil) nothing is held and the caller keeps what it meant to hold.
func (l *Leases) Hold(id uint64, deadline time.Time, release func()) error {
	if release == nil {
		return fmt.Errorf("disagg: lease %d without a release function", id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("disagg: hold lease %d: %w", id, ErrLeasesClosed)
	}
	if _, ok := l.held[id]; ok {
		return fmt.Errorf("disagg: hold lease %d: %w", id, ErrLeaseHeld)
	}
	l.held[id] = &lease{deadline: deadline, release: release}
	return nil
}

// Extend moves a held lease's deadline (a transfer making progress keeps
// its blocks longer). It reports whether id was held.
func (l *Leases) Extend(id uint64, deadline time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls, ok := l.held[id]
	if ok {
		ls.deadline = deadline
	}
	return ok
}

// Ack ends id's lease because the receiver took the transfer, releasing
// what it held. It reports whether id was held (false: unknown, or ended
// already by a cancel or its deadline).
func (l *Leases) Ack(id uint64) bool {
	return l.end(id, LeaseAcked, "acknowledged")
}

// Cancel ends id's lease because the sender gives the transfer up,
// releasing what it held. It reports whether id was held.
func (l *Leases) Cancel(id uint64, reason string) bool {
	return l.end(id, LeaseCanceled, reason)
}

func (l *Leases) end(id uint64, how LeaseEnd, reason string) bool {
	l.mu.Lock()
	ls, ok := l.held[id]
	if ok {
		l.take(id, how)
	}
	l.mu.Unlock()
	if ok {
		l.finish(id, ls, how, reason)
	}
	return ok
}

// take removes id from the table and counts how it ended; l.mu is held.
func (l *Leases) take(id uint64, how LeaseEnd) {
	delete(l.held, id)
	switch how {
	case LeaseAcked:
		l.stats.Acked++
	case LeaseCanceled:
		l.stats.Canceled++
	case LeaseExpired:
		l.stats.Expired++
	case LeaseClosed:
		l.stats.Closed++
	}
}

// finish releases a lease already taken out of the table.
func (l *Leases) finish(id uint64, ls *lease, how LeaseEnd, reason string) {
	ls.release()
	if l.onEnd != nil {
		l.onEnd(id, how, reason)
	}
}

// Sweep ends, earliest deadline first, every lease whose deadline is not
// after now, and returns how many it ended.
func (l *Leases) Sweep(now time.Time) int {
	type due struct {
		id uint64
		ls *lease
	}
	var expired []due
	l.mu.Lock()
	for id, ls := range l.held {
		if !ls.deadline.After(now) {
			expired = append(expired, due{id, ls})
		}
	}
	for _, d := range expired {
		l.take(d.id, LeaseExpired)
	}
	l.mu.Unlock()
	sort.Slice(expired, func(i, j int) bool {
		if !expired[i].ls.deadline.Equal(expired[j].ls.deadline) {
			return expired[i].ls.deadline.Before(expired[j].ls.deadline)
		}
		return expired[i].id < expired[j].id
	})
	for _, d := range expired {
		l.finish(d.id, d.ls, LeaseExpired, fmt.Sprintf("not acknowledged by its deadline (%v late)", now.Sub(d.ls.deadline).Round(time.Millisecond)))
	}
	return len(expired)
}

// Run sweeps every period with the table's clock until ctx is done or the
// table is closed.
func (l *Leases) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.done:
			return
		case <-t.C:
			l.Sweep(l.now())
		}
	}
}

// Close releases every lease still held (LeaseClosed), stops Run, and
// makes later Holds fail with ErrLeasesClosed. Closing twice does nothing.
func (l *Leases) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	held := l.held
	l.held = map[uint64]*lease{}
	l.stats.Closed += uint64(len(held))
	l.mu.Unlock()
	ids := make([]uint64, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		l.finish(id, held[id], LeaseClosed, "lease table closed")
	}
}

// Held is the number of leases held now (a gauge).
func (l *Leases) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// Stats returns the gauge of held leases and the counts of ended ones.
func (l *Leases) Stats() LeaseStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.Held = uint64(len(l.held))
	return s
}
