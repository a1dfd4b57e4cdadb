package coordinator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Gossip carries liveness and hints, never authority (Consul's model):
// any holder of the gossip key, a client node included, can gossip a
// member with any ID, name, role, address and capacity. The leader
// therefore asks each member it would register, over a connection that
// verifies the member's certificate, who it is (Config.Certify), and
// writes to the state only what that answer says: the certificate's ID,
// name and role, the address that reached it, the version and capacities
// it reported on that connection. A member that cannot prove the ID it is
// gossiped under is never registered, planned on or added to Raft.

const (
	// certifyTimeout bounds one certification (a dial and one call).
	certifyTimeout = 3 * time.Second
	// certifyRetry is how soon a failed certification of the same hint is
	// tried again.
	certifyRetry = 5 * time.Second
	// maxCertifying bounds the certifications in flight: gossip may list
	// any number of phantom members.
	maxCertifying = 16
)

// certEntry is the leader's latest certification of one gossip member.
type certEntry struct {
	hint    string  // the gossip record it was asked for (hintOf)
	got     *Member // the certified member; nil until one succeeded
	err     error   // the last attempt's error, if it failed
	at      time.Time
	running bool
	warned  string // the hint last warned about, so each mismatch logs once
}

// certifier holds the certifications this server made as leader. They
// outlive its term: a certificate proven for a hint stays proven, and a
// server that leads again (leadership moves often on a loaded host) need
// not wait for every node to answer anew before it writes their liveness.
type certifier struct {
	mu       sync.Mutex
	entries  map[string]*certEntry // by gossiped node ID
	inflight int
	done     chan struct{} // signalled when a certification ends
}

func (c *certifier) init() {
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[string]*certEntry{}
	}
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	c.mu.Unlock()
}

// hintOf is what gossip says of m beyond its liveness: a change makes the
// leader ask the node again.
func hintOf(m Member) string {
	return fmt.Sprintf("%s|%s|%s|%s|%s|%s|%d|%d|%+v", m.Name, m.Role, m.Addr, m.RPCAddr, m.HTTPAddr, m.Version, m.Protocol, m.Expect, m.Caps)
}

// certified returns the certified record of gossip member m (its Status
// gossip's), or nil when none is known yet; it starts a certification in
// the background when the hint is new or an earlier attempt failed a
// while ago. A record certified for an earlier hint serves until the new
// one is answered (a forged hint about a real node changes nothing).
// refused reports that, with no record, this leader's last attempt
// failed: the member has not proven its ID.
func (s *Server) certified(m Member) (got *Member, refused bool) {
	c := &s.certs
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]*certEntry{}
	}
	e := c.entries[m.ID]
	if e == nil {
		e = &certEntry{}
		c.entries[m.ID] = e
	}
	h := hintOf(m)
	stale := e.hint != h || (e.got == nil && time.Since(e.at) >= certifyRetry)
	if stale && !e.running && c.inflight < maxCertifying {
		e.running, e.hint, e.at = true, h, time.Now()
		c.inflight++
		go s.certify(m, h)
	}
	if e.got == nil {
		return nil, e.err != nil
	}
	out := *e.got
	out.Status = m.Status
	return &out, false
}

// certify asks the node behind gossip member m who it is and records the
// answer for hint h.
func (s *Server) certify(m Member, h string) {
	ctx, cancel := context.WithTimeout(context.Background(), certifyTimeout)
	got, err := s.cfg.Certify(ctx, m)
	cancel()
	if err == nil {
		err = checkCertified(m, got, s.fsm)
	}
	c := &s.certs
	c.mu.Lock()
	c.inflight--
	e := c.entries[m.ID]
	if e != nil {
		e.running, e.at, e.err = false, time.Now(), err
		if err == nil {
			g := got
			e.got = &g
		}
		if e.warned != h {
			e.warned = h
			switch {
			case err != nil:
				s.log.Warn("gossip lists a member that did not prove its identity: ignored",
					zap.String("id", m.ID), zap.String("name", m.Name), zap.String("role", m.Role), zap.String("rpc_addr", m.RPCAddr), zap.Error(err))
			case got.Name != m.Name || got.Role != m.Role:
				s.log.Warn("gossip's name or role for a node differs from its certificate's: the certificate's is kept",
					zap.String("id", m.ID), zap.String("gossip_name", m.Name), zap.String("gossip_role", m.Role),
					zap.String("name", got.Name), zap.String("role", got.Role))
			}
		}
	}
	done := c.done
	c.mu.Unlock()
	if done != nil {
		select {
		case done <- struct{}{}:
		default:
		}
	}
}

// checkCertified refuses an answer that is not the member gossip named,
// or whose name belongs to another live node (as a join does).
func checkCertified(m Member, got Member, fsm *FSM) error {
	if got.ID != m.ID {
		return fmt.Errorf("the certificate at %s is node %q, not %q", m.RPCAddr, got.ID, m.ID)
	}
	if got.Role != RoleServer && got.Role != RoleClient {
		return fmt.Errorf("certificate role %q", got.Role)
	}
	if err := CheckNodeName(got.Name); err != nil {
		return err
	}
	var taken string
	fsm.View(func(st *State) {
		for id, n := range st.Nodes {
			if id != got.ID && n.Name == got.Name && (n.Status == StatusAlive || n.Status == StatusSuspect) {
				taken = id
			}
		}
	})
	if taken != "" {
		return fmt.Errorf("name %q belongs to node %s", got.Name, taken)
	}
	return nil
}

// certifyDone is signalled when a certification ends, so the leader
// reconciles at once with its answer.
func (s *Server) certifyDone() <-chan struct{} {
	s.certs.mu.Lock()
	defer s.certs.mu.Unlock()
	if s.certs.done == nil {
		s.certs.done = make(chan struct{}, 1)
	}
	return s.certs.done
}
