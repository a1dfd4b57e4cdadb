package membership

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/internal/version"
	"shoal/internal/zapio"
)

// Gossip is the memberlist delegate: it tracks memberlist's view,
// including dead and left nodes that Members() no longer lists, and
// implements coordinator.Membership.
type Gossip struct {
	ml   *memberlist.Memberlist
	meta []byte

	mu     sync.Mutex
	nodes  map[string]*memberlist.Node
	status map[string]coordinator.NodeStatus
	events chan struct{}

	revoked func(id string) bool       // node IDs removed from the cluster
	joined  func(id string, ip net.IP) // a member was seen alive (nil: nothing to do)

	protocols version.Window // the protocols of the nodes it admits
}

// Options configure the memberlist a Gossip runs.
type Options struct {
	ID        string // the node's ID, its memberlist name
	Bind      string // IP to listen on
	Port      int    // gossip port (0: a free one)
	Advertise string // IP others reach this node at ("": memberlist's choice)
	Key       []byte // the cluster's gossip key
	// Probe shortens memberlist's probe interval and the timers that
	// follow it (tests); 0 keeps the LAN defaults.
	Probe time.Duration
	// Revoked tells whether a node was removed from the cluster: its
	// alive messages and merges are refused.
	Revoked func(id string) bool
	// Joined is told of each member seen alive (nil: nothing to do).
	Joined func(id string, ip net.IP)
	// Protocols is the window of protocols this node works with (zero:
	// this build's): a node gossiping a protocol outside it is refused.
	Protocols version.Window
}

// Start creates the delegate gossiping md and the memberlist it runs;
// joining peers is the caller's (Memberlist().Join).
func Start(md Meta, o Options) (*Gossip, error) {
	b, err := md.Encode()
	if err != nil {
		return nil, err
	}
	g := &Gossip{
		meta:      b,
		nodes:     map[string]*memberlist.Node{},
		status:    map[string]coordinator.NodeStatus{},
		events:    make(chan struct{}, 1),
		revoked:   o.Revoked,
		protocols: o.Protocols.Or(),
		joined:    o.Joined,
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = o.ID
	mc.BindAddr = o.Bind
	mc.BindPort = o.Port
	mc.AdvertisePort = o.Port
	mc.AdvertiseAddr = o.Advertise
	mc.SecretKey = o.Key
	mc.Delegate = g
	mc.Events = g
	mc.Alive = g
	mc.Merge = g
	mc.Logger = zapio.StdLogger(zap.L().Named("gossip"))
	// A node that crashed and came back on a new address (a pod
	// rescheduled) takes its name back after 10 s instead of memberlist's
	// default of never: its identity is its certificate, checked on QUIC.
	mc.DeadNodeReclaimTime = 10 * time.Second
	if p := o.Probe; p > 0 {
		mc.ProbeInterval = p
		mc.ProbeTimeout = p / 2
		mc.GossipInterval = p / 4
		mc.SuspicionMult = 2
		mc.TCPTimeout = 4 * p
	}
	if g.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	return g, nil
}

// Memberlist is the memberlist g runs.
func (g *Gossip) Memberlist() *memberlist.Memberlist { return g.ml }

// NotifyAlive implements memberlist.AliveDelegate: a removed node's alive
// messages are ignored, so it cannot come back through gossip.
func (g *Gossip) NotifyAlive(n *memberlist.Node) error {
	if g.revoked != nil && g.revoked(n.Name) {
		return fmt.Errorf("node %s was removed from the cluster", n.Name)
	}
	// A node of a protocol this one does not work with is refused here
	// as on QUIC, where the refusal names both versions.
	var md Meta
	if json.Unmarshal(n.Meta, &md) == nil && !g.protocols.Has(version.Of(md.Proto)) {
		return fmt.Errorf("node %s (shoal %s) speaks protocol %d, outside this node's %s", n.Name, md.Version, version.Of(md.Proto), g.protocols)
	}
	return nil
}

// NotifyMerge implements memberlist.MergeDelegate: a join or push/pull
// from a removed node, or that says one is alive, is refused (one that
// lists it dead or left, as every peer's does for a while, is not).
func (g *Gossip) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if n.State != memberlist.StateAlive {
			continue
		}
		if err := g.NotifyAlive(n); err != nil {
			return err
		}
	}
	return nil
}

// NodeMeta implements memberlist.Delegate.
func (g *Gossip) NodeMeta(limit int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.meta
}

// SetMeta replaces what g gossips about this node (capacities measured
// again) and spreads it: the leader certifies the node anew on the change.
func (g *Gossip) SetMeta(md Meta) error {
	b, err := md.Encode()
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.meta = b
	g.mu.Unlock()
	return g.ml.UpdateNode(5 * time.Second)
}

// NotifyMsg implements memberlist.Delegate.
func (g *Gossip) NotifyMsg([]byte) {}

// GetBroadcasts implements memberlist.Delegate.
func (g *Gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (g *Gossip) LocalState(join bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (g *Gossip) MergeRemoteState(buf []byte, join bool) {}

func (g *Gossip) set(n *memberlist.Node, st coordinator.NodeStatus) {
	g.mu.Lock()
	c := *n
	g.nodes[n.Name] = &c
	g.status[n.Name] = st
	g.mu.Unlock()
	select {
	case g.events <- struct{}{}:
	default:
	}
}

// NotifyJoin implements memberlist.EventDelegate.
func (g *Gossip) NotifyJoin(n *memberlist.Node) {
	g.set(n, coordinator.StatusAlive)
	if g.joined != nil {
		g.joined(n.Name, n.Addr)
	}
}

// NotifyLeave implements memberlist.EventDelegate.
func (g *Gossip) NotifyLeave(n *memberlist.Node) {
	st := coordinator.StatusFailed
	if n.State == memberlist.StateLeft {
		st = coordinator.StatusLeft
	}
	g.set(n, st)
}

// NotifyUpdate implements memberlist.EventDelegate.
func (g *Gossip) NotifyUpdate(n *memberlist.Node) {
	g.mu.Lock()
	st := g.status[n.Name]
	g.mu.Unlock()
	if st == "" {
		st = coordinator.StatusAlive
	}
	g.set(n, st)
}

// Events implements coordinator.Membership.
func (g *Gossip) Events() <-chan struct{} { return g.events }

// Members implements coordinator.Membership.
func (g *Gossip) Members() []coordinator.Member {
	suspect := map[string]bool{}
	if g.ml != nil {
		for _, n := range g.ml.Members() {
			if n.State == memberlist.StateSuspect {
				suspect[n.Name] = true
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]coordinator.Member, 0, len(g.nodes))
	for id, n := range g.nodes {
		st := g.status[id]
		if st == coordinator.StatusAlive && suspect[id] {
			st = coordinator.StatusSuspect
		}
		out = append(out, memberOf(n, st))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
